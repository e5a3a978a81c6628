#!/bin/bash
# What mdtest-easy's operations cost through chfuse, in kernel requests and
# time (issue 25; the table in crates/chfs-bench/README.md):
#
#   [PHASES="c s u"] scripts/mount-oploop.sh RELEASE_DIR N TAG [chfuse args...]
#
# Starts 2 chfsd on 127.0.0.1 and a chfuse mount (from RELEASE_DIR) in
# /tmp/i25m/TAG, then runs crates/chfs-fuse/examples/mount_oploop.c once per
# word of PHASES (default: N creates, N stats, N unlinks), 1.5 s apart so
# that the kernel's caches have expired, as between IO500's phases; a word
# of several letters runs them back to back ("nc": existence checks, then
# creates). Prints the loop's µs per operation, then the kernel requests
# per operation chfuse counted in each phase (read with SIGUSR1 at its start
# and end; a RELEASE or FORGET still on its way at the end is missed).
# Stops everything it started by PID.
set -eu
R=$1 N=$2 TAG=$3; shift 3
W=/tmp/i25m/$TAG; rm -rf $W; mkdir -p $W/mnt
here=$(cd "$(dirname "$0")" && pwd)
LOOP=$W/mount_oploop
cc -O2 -o $LOOP "$here/../crates/chfs-fuse/examples/mount_oploop.c"
pids=()
cleanup() { fusermount3 -u -q $W/mnt 2>/dev/null || true; sleep 0.3; for p in "${pids[@]}"; do kill $p 2>/dev/null || true; done; }
trap cleanup EXIT
waitf() { for _ in $(seq 200); do [ -s $1 ] && return 0; sleep 0.05; done; echo "no $1" >&2; exit 1; }
$R/chfsd --host 127.0.0.1:0 -S $W/s0.addr --log-level warn 2>$W/s0.log & pids+=($!)
waitf $W/s0.addr
$R/chfsd --host 127.0.0.1:0 -S $W/s1.addr --log-level warn --join $(cat $W/s0.addr) 2>$W/s1.log & pids+=($!)
waitf $W/s1.addr
CHFS_SERVER=$(cat $W/s0.addr) $R/chfuse $W/mnt -f "$@" 2>$W/chfuse.log & fpid=$!; pids+=($fpid)
for _ in $(seq 200); do mountpoint -q $W/mnt && break; sleep 0.05; done
mkdir $W/mnt/d
export OPLOOP_HOOK="kill -USR1 $fpid; sleep 0.3"
for ph in ${PHASES:-c s u}; do
  sleep 1.5
  $LOOP $W/mnt/d $N $ph | tee -a $W/loop.out
done
sleep 0.5
python3 - $W/chfuse.log $N $W/loop.out <<'PY'
import sys
lines=[l for l in open(sys.argv[1]) if 'kernel requests served' in l]
n=int(sys.argv[2])
def parse(l):
    s=l.split('requests=',1)[1]
    return {k:int(v) for k,v in (kv.split('=') for kv in s.split())}
c=[parse(l) for l in lines]
names=[l.split()[0] for l in open(sys.argv[3])]
for i,ph in enumerate(names):
    a,b=c[2*i],c[2*i+1]
    d={k:b[k]-a.get(k,0) for k in b if b[k]-a.get(k,0)>0}
    print(ph, 'requests per op:', ' '.join(f'{k}={v/n:.3f}' for k,v in d.items()))
PY
