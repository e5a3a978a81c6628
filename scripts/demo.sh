#!/usr/bin/env bash
# The main job: builds chfs-rs, starts a local pool of 4 chfsd servers, runs a
# verified workload through the native client next to the same workload on
# /dev/shm, prints throughput, op rates and ratios, and stops the pool
# (`chfs-bench demo`; options: `chfs-bench demo --help`).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -p chfs-server -p chfs-bench
CHFSD="$PWD/target/release/chfsd" exec ./target/release/chfs-bench demo "$@"
