#!/bin/bash
# Allocations per operation on each side, by DHAT (issue 25's breakdown;
# the table in crates/chfs-bench/README.md):
#
#   scripts/opcost-dhat.sh RELEASE_DIR OP M OUTDIR
#
# Runs crates/chfs-capi/examples/capi_oploop.c (built into OUTDIR by
# scripts/oploop-build.sh) with 0 and with M operations, each against a fresh chfsd,
# both under valgrind --tool=dhat, and prints the difference of their
# total allocations (blocks) divided by M. (callgrind's call counts of
# malloc, which opcost.sh prints, over-count in the client: calls through
# tail jumps are counted more than once.)
set -u
rel=$1 op=$2 m=$3 out=$4
loop=$out/capi_oploop
"$(dirname "$0")/oploop-build.sh" "$rel" "$out"
tot() { python3 -c "import json,sys; print(sum(p['tbk'] for p in json.load(open(sys.argv[1]))['pps']))" "$1"; }
for k in 0 "$m"; do
	port=$((52000 + RANDOM % 5000))
	export CHFS_SERVER=127.0.0.1:$port CHFS_POLL_USEC=0 CHFS_CPU_LANES=0
	valgrind --tool=dhat --dhat-out-file="$out/dhat-server-$op-$k.json" "$rel/chfsd" \
		-h 127.0.0.1:$port -T 2 --poll-usec 0 --log-level error >/dev/null 2>&1 &
	spid=$!
	for _ in $(seq 200); do
		(exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break
		sleep 0.1
	done
	n=$m
	[ "$op" = create ] && n=0
	valgrind --tool=dhat --dhat-out-file="$out/dhat-client-$op-$k.json" \
		"$loop" "$op" /d "$n" "$k" >/dev/null 2>&1
	kill "$spid"
	wait "$spid" 2>/dev/null
done
c=$(($(tot "$out/dhat-client-$op-$m.json") - $(tot "$out/dhat-client-$op-0.json")))
s=$(($(tot "$out/dhat-server-$op-$m.json") - $(tot "$out/dhat-server-$op-0.json")))
python3 -c "print(f'$op: client {$c / $m:.2f} allocations/op, chfsd {$s / $m:.2f}')"
