#!/bin/bash
# Two C-API ranks against two chfsd at once, the way mdtest's phases run
# (issue 25's per-operation cost with 2 ranks; crates/chfs-bench/README.md,
# "Metadata over TCP with two ranks"):
#
#   scripts/opcost-ranks.sh RELEASE_DIR OP N OUTDIR [PROFILER COMMAND]
#
# Starts two chfsd (their defaults, polling on) on 127.0.0.1, then two
# crates/chfs-capi/examples/capi_oploop.c ranks pinned to CPU 0 and 1,
# each doing N operations OP (create, stat, unlink, read, write) in its
# own directory over TCP (CHFS_LOCAL_SOCKET=0 CHFS_CMA=0; set both to 1
# for the same-host path). The loops start together (a barrier in their
# OPLOOP_HOOK); the profiler command, if given, runs once both are in
# their loops, with A and B the servers' pids in its environment (e.g.
# 'perf stat -a -e context-switches,raw_syscalls:sys_enter -- sleep 1'
# or 'perf record -a -g -o OUTDIR/perf.data -- sleep 1'). Prints each
# rank's microseconds per operation. Extra chfsd arguments: CHFSD_ARGS.
set -eu
rel=$1 op=$2 n=$3 out=$4 prof=${5:-}
here=$(cd "$(dirname "$0")" && pwd)
"$here/oploop-build.sh" "$rel" "$out"
loop=$out/capi_oploop
d=$(mktemp -d "$out/run.XXXX")
pa=$((40000 + RANDOM % 5000))
pb=$((pa + 1))
# shellcheck disable=SC2086 # CHFSD_ARGS is a list of arguments
"$rel/chfsd" -h "127.0.0.1:$pa" -S "$d/a.addr" --log-level warn ${CHFSD_ARGS:-} 2>"$d/a.log" &
A=$!
pids=$A
trap 'kill $pids 2>/dev/null || true; rm -rf "$d"' EXIT
for _ in $(seq 200); do [ -s "$d/a.addr" ] && break; sleep 0.05; done
# shellcheck disable=SC2086
"$rel/chfsd" -h "127.0.0.1:$pb" -S "$d/b.addr" -j "127.0.0.1:$pa" --log-level warn ${CHFSD_ARGS:-} 2>"$d/b.log" &
B=$!
pids="$A $B"
for _ in $(seq 200); do [ -s "$d/b.addr" ] && break; sleep 0.05; done
[ -s "$d/a.addr" ] && [ -s "$d/b.addr" ] || { echo "chfsd did not start" >&2; exit 1; }
export CHFS_SERVER=127.0.0.1:$pa,127.0.0.1:$pb
export CHFS_LOCAL_SOCKET=${CHFS_LOCAL_SOCKET:-0} CHFS_CMA=${CHFS_CMA:-0}
mkdir "$d/bar"
# Each loop waits at its start until both are there.
hook="if [ \$OPLOOP_PHASE = start ]; then touch $d/bar/\$PPID; while [ \$(ls $d/bar | wc -l) -lt 2 ]; do sleep 0.001; done; fi"
files=$n
case $op in create | write) files=0 ;; esac
OPLOOP_HOOK=$hook taskset -c 0 "$loop" "$op" /r0 "$files" "$n" >"$d/r0.out" &
R0=$!
OPLOOP_HOOK=$hook taskset -c 1 "$loop" "$op" /r1 "$files" "$n" >"$d/r1.out" &
R1=$!
pids="$A $B $R0 $R1"
if [ -n "$prof" ]; then
	while [ "$(ls "$d/bar" | wc -l)" -lt 2 ]; do sleep 0.01; done
	sleep 0.2
	A=$A B=$B bash -c "$prof" >"$d/prof.out" 2>&1 || true
fi
wait $R0 $R1
echo "rank 0: $(cat "$d/r0.out")   rank 1: $(cat "$d/r1.out")"
if [ -n "$prof" ]; then cat "$d/prof.out"; fi
