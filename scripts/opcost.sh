#!/bin/bash
# What one operation costs on each side, in load-independent counts
# (issue 25's breakdown; the table in crates/chfs-bench/README.md):
#
#   scripts/opcost.sh RELEASE_DIR OP M unix|tcp OUTDIR
#
# OP: create, stat, unlink, read (47,008 bytes), write (1 MiB); M
# operations through crates/chfs-capi/examples/capi_oploop.c against one
# fresh chfsd on 127.0.0.1 (no polling on either side: CHFS_POLL_USEC=0,
# --poll-usec 0, so that the counts are the work and not the spinning;
# no CPU lanes). `tcp` sets CHFS_LOCAL_SOCKET=0 CHFS_CMA=0. Two runs:
#  1. strace -f of the client (the calls between the loop's markers) and
#     strace -f -c attached to chfsd only while the loop runs;
#  2. callgrind of both: the client's loop alone (--toggle-collect), the
#     server's counters zeroed before the loop and dumped after it.
# Prints per operation: system calls on each side (futex wakes apart),
# instructions on each side and their malloc/calloc/realloc calls.
set -eu
rel=$1 op=$2 m=$3 mode=$4 out=$5
here=$(cd "$(dirname "$0")" && pwd)
"$here/oploop-build.sh" "$rel" "$out"
loop=$out/capi_oploop
port=$((52000 + RANDOM % 5000))
export CHFS_SERVER=127.0.0.1:$port CHFS_POLL_USEC=0 CHFS_CPU_LANES=0
if [ "$mode" = tcp ]; then export CHFS_LOCAL_SOCKET=0 CHFS_CMA=0; fi
n=$m
case $op in create | write) n=0 ;; esac
tag=$out/$op-$mode
chfsd_args=(-h 127.0.0.1:$port -T 2 --poll-usec 0 --log-level warn)

wait_up() { # until the server answers
	for _ in $(seq 200); do
		if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then return 0; fi
		sleep 0.1
	done
	echo "chfsd did not start" >&2
	exit 1
}

# 1. strace
"$rel/chfsd" "${chfsd_args[@]}" >"$tag.chfsd.log" 2>&1 &
spid=$!
trap 'kill $spid 2>/dev/null || true' EXIT
wait_up
export OPLOOP_HOOK="if [ \$OPLOOP_PHASE = start ]; then strace -f -o $tag.server.trace -p $spid & echo \$! > $tag.stpid; sleep 1; else kill -INT \$(cat $tag.stpid); sleep 1; fi"
strace -f -o "$tag.client.trace" "$loop" "$op" /d "$n" "$m" >"$tag.strace.out"
unset OPLOOP_HOOK
kill "$spid"
wait "$spid" || true

# 2. callgrind
valgrind --tool=callgrind --callgrind-out-file="$tag.server.cg.%p" \
	"$rel/chfsd" "${chfsd_args[@]}" >"$tag.cgserver.log" 2>&1 &
spid=$!
wait_up
rm -f "$tag".server.cg.*
export OPLOOP_HOOK="if [ \$OPLOOP_PHASE = start ]; then callgrind_control -z $spid >/dev/null; else callgrind_control -d $spid >/dev/null; fi"
valgrind --tool=callgrind --collect-atstart=no --toggle-collect=oploop \
	--callgrind-out-file="$tag.client.cg" "$loop" "$op" /d "$n" "$m" \
	>"$tag.cg.out" 2>"$tag.cgclient.log"
unset OPLOOP_HOOK
kill "$spid"
wait "$spid" || true

python3 "$here/opcost.py" "$op" "$mode" "$m" "$tag"
