#!/usr/bin/env bash
# The whole test suite: formatting, lints, then every test of the workspace
# (real chfsd processes on loopback, real FUSE mounts, C programs against
# libchfs). Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TERM_COLOR=never
echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings
echo "== cargo test"
cargo test --workspace -- --test-threads=2
echo "== chfind under mpirun (chfs-ctl --features mpi)"
cargo clippy -p chfs-ctl --features mpi --all-targets -- -D warnings
cargo test -p chfs-ctl --features mpi --test find_mpi -- --test-threads=2
