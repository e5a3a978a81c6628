#!/usr/bin/env bash
# Installs what building and testing chfs-rs needs on a Debian machine:
# apt packages (FUSE 3, a C compiler, pkg-config, iproute2, OpenSSH server for
# the multi-host test; Open MPI and libclang for chfind's mpirun test, built
# with --features mpi; man-db for the manual pages) and the Rust components
# named in rust-toolchain.toml.
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
# writes (crates/chfs-ctl/tests/install.rs). python3, coreutils and tar: the
# programs the LD_PRELOAD tests run (crates/chfs-preload/tests/preload.rs).
for pkg in fuse3 libfuse3-dev pkg-config gcc g++ binutils libc6-dev make iproute2 openssh-server openssh-client util-linux procps openmpi-bin libopenmpi-dev libclang-dev slurmd slurmctld slurm-client munge man-db groff-base python3 coreutils tar findutils; do
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
