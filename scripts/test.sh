#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test of the workspace
# (real chfsd processes on loopback, real FUSE mounts, C programs against
# libchfs), and the Python package's tests (pytest against real servers).
# Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never
# Tests that need a capability this machine has must run, not skip: the
# suite requires what is here (a test then fails rather than passing by
# skipping; see chfs_localpool::skip). Set CHFS_TEST_REQUIRE yourself to
# override.
if [ -z "${CHFS_TEST_REQUIRE+x}" ]; then
  caps=()
  root=0; [ "$(id -u)" -eq 0 ] && root=1 && caps+=(root)
  { [ -c /dev/fuse ] && command -v fusermount3 >/dev/null; } && caps+=(fuse)
  [ "$(cat /sys/module/fuse/parameters/enable_uring 2>/dev/null)" = Y ] && caps+=(uring)
  command -v mpirun >/dev/null && caps+=(mpi)
  { [ $root = 1 ] && command -v slurmd >/dev/null && command -v slurmctld >/dev/null \
    && command -v srun >/dev/null && command -v munged >/dev/null; } && caps+=(slurm)
  { [ $root = 1 ] && ip netns list >/dev/null 2>&1 && [ -x /usr/sbin/sshd ]; } && caps+=(netns)
  pkg-config --exists libfabric 2>/dev/null && caps+=(fabric)
  CHFS_TEST_REQUIRE="$(IFS=,; echo "${caps[*]}")"
  export CHFS_TEST_REQUIRE
fi
echo "== tests require: ${CHFS_TEST_REQUIRE:-(nothing)}"
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace -- --test-threads=2
echo "== chfind under mpirun (chfs-ctl --features mpi)"
cargo clippy -p chfs-ctl --features mpi --all-targets -- -D warnings
cargo test -p chfs-ctl --features mpi --test find_mpi -- --test-threads=2
echo "== Python package (python/): pip install ./python, pytest against real servers"
PY="${PYTHON:-python3}"
cargo build -p chfs-server -p chfs-localpool
"$PY" -m pip install -q --disable-pip-version-check --no-build-isolation ./python 2>&1 \
  | { grep -v "Running pip as the 'root' user" || true; } >&2
# From the repository root: python/chfs (without its native module) must
# not shadow the installed package.
"$PY" -m pytest -p no:cacheprovider -q python/tests
