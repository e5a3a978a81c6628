#!/usr/bin/env bash
# Installs what building and testing chfs-rs needs on a Debian machine:
# apt packages (FUSE 3, a C compiler, pkg-config, iproute2, OpenSSH server for
# the multi-host test; Open MPI and libclang for chfind's mpirun test, built
# with --features mpi; man-db for the manual pages; libfabric for the fabric
# transport), the Rust components named in rust-toolchain.toml, and the
# Python packages the chfs Python package (python/) is built and tested
# with: maturin, pytest, fsspec, pandas.
# Safe to run again: it only installs what is missing.
set -euo pipefail

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi

need=()
# slurmd slurmctld slurm-client munge: chfsctl's srun test, which runs its own
# one-node Slurm cluster (crates/chfs-ctl/tests/slurm.rs). man-db (and its
# groff-base): the install test renders the manual pages scripts/install.sh
# writes (crates/chfs-ctl/tests/install.rs). libfabric-dev: the fabric
# transport (crates/chfs-fabric, found through pkg-config; its tests use
# the tcp and shm providers), libfabric-bin: fi_info, to see the providers.
# python3, coreutils and tar: the programs the LD_PRELOAD tests run
# (crates/chfs-preload/tests/preload.rs).
for pkg in fuse3 libfuse3-dev pkg-config gcc g++ binutils libc6-dev make iproute2 openssh-server openssh-client util-linux procps openmpi-bin libopenmpi-dev libclang-dev slurmd slurmctld slurm-client munge man-db groff-base libfabric-dev libfabric-bin python3 coreutils tar findutils; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${need[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  if [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: no Rust toolchain; installing Debian's cargo" >&2
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq cargo rustc >/dev/null
  fi
fi
if command -v rustup >/dev/null 2>&1; then
  rustup component add rustfmt clippy >/dev/null 2>&1 || true
fi

# Distributions ship /dev/fuse as mode 0666 (fusermount3 is setuid and does
# the checks); some containers create it 0600, which keeps ordinary users
# from mounting. Give it the usual mode so the non-root mount test runs.
if [ -c /dev/fuse ] && [ "$(stat -c %a /dev/fuse)" = "600" ]; then
  $SUDO chmod 0666 /dev/fuse || true
fi

# FUSE over io_uring (Linux 6.14+) is off until the fuse module's
# enable_uring parameter is set (boot option fuse.enable_uring=1, or this
# at run time). chfuse uses it when offered and reads /dev/fuse otherwise;
# the mount tests check both transports where the kernel has it.
if [ -e /sys/module/fuse/parameters/enable_uring ]; then
  echo Y | $SUDO tee /sys/module/fuse/parameters/enable_uring >/dev/null || true
fi

# The Python package (python/): its build backend (maturin) and what its
# tests use (pytest, fsspec, pandas), for the python3 on the PATH. Only
# what is missing is installed, so a second run asks no registry.
PY="${PYTHON:-python3}"
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "setup: no $PY; installing Debian's python3" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3 python3-dev python3-pip python3-venv >/dev/null
fi
pymissing=()
for mod in maturin pytest fsspec pandas; do
  "$PY" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$mod') is None)" 2>/dev/null || pymissing+=("$mod")
done
if [ ${#pymissing[@]} -gt 0 ]; then
  echo "setup: pip installing ${pymissing[*]}" >&2
  "$PY" -m pip install -q --disable-pip-version-check "${pymissing[@]}" 2>&1 | grep -v "Running pip as the 'root' user" >&2 || true
  for mod in "${pymissing[@]}"; do
    "$PY" -c "import $mod" || { echo "setup: cannot import $mod after pip install" >&2; exit 1; }
  done
fi
