#!/usr/bin/env python3
"""Per-operation counts from the files scripts/opcost.sh leaves:
OP MODE M TAG. Prints one line per side (client, server)."""
import collections
import glob
import re
import sys

ALLOC = {"malloc", "calloc", "realloc", "posix_memalign", "aligned_alloc", "memalign"}


def trace_counts(path, markers):
    """System calls in an strace -f -o file (between the loop's markers
    when `markers`): a Counter by name, FUTEX_WAKE apart, and the
    threads that made a call."""
    c = collections.Counter()
    tids = set()
    on = not markers
    # With markers: only the threads of the process that made them (not
    # the children the loop's hook starts).
    mine = None
    with open(path) as f:
        for line in f:
            m = re.match(r"(\d+)\s+(<\.\.\. )?(\w+)", line)
            if not m:
                continue
            if markers and mine is not None and m.group(3).startswith("clone"):
                r = re.search(r"= (\d+)$", line.strip())
                if r and "CLONE_THREAD" in line and m.group(1) in mine:
                    mine.add(r.group(1))
            if markers and '"/OPLOOP-START"' in line:
                on = True
                continue
            if markers and mine is None and 'execve(' in line and "oploop" in line:
                mine = {m.group(1)}
            if markers and mine is not None and m.group(1) not in mine:
                continue
            if markers and '"/OPLOOP-END"' in line:
                break
            if not on or m.group(2) or m.group(3) in ("exited", "killed"):
                continue
            if "+++" in line or "---" in line:
                continue
            name = m.group(3)
            if name == "futex":
                name = "futex(WAKE)" if "FUTEX_WAKE" in line else "futex(WAIT)"
            c[name] += 1
            tids.add(m.group(1))
    return c, tids


def callgrind(path):
    """Instructions and allocation calls in a callgrind output file."""
    names = {}
    total = 0
    allocs = 0
    cfn = None
    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith(("summary:", "totals:")):
                total = max(total, int(line.split()[1]))
                continue
            m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
            if m:
                if m.group(3):
                    names[m.group(2)] = m.group(3).strip()
                if m.group(1) == "cfn":
                    cfn = names.get(m.group(2))
                continue
            if line.startswith("calls=") and cfn is not None:
                if cfn in ALLOC:
                    allocs += int(line[6:].split()[0])
                cfn = None
    return total, allocs


def fmt(c, m):
    return ", ".join(f"{k} {v / m:.2f}" for k, v in sorted(c.items(), key=lambda kv: -kv[1]))


def main():
    op, mode, m, tag = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    cc, ct = trace_counts(f"{tag}.client.trace", True)
    sc, st = trace_counts(f"{tag}.server.trace", False)
    ci, ca = callgrind(f"{tag}.client.cg")
    dumps = sorted(glob.glob(f"{tag}.server.cg.*"))
    # The dump taken after the loop (callgrind_control -d): the counts
    # since the zeroing before it. Largest instruction count of the
    # dumps taken (the final one at exit holds only the shutdown).
    si, sa = max((callgrind(d) for d in dumps), default=(0, 0))
    print(f"{op} {mode} M={m}")
    print(f"  client: syscalls/op {sum(cc.values()) / m:.2f} ({fmt(cc, m)}); threads {len(ct)};"
          f" instructions/op {ci / m:,.0f}; malloc calls/op (callgrind; over-counts, see opcost-dhat.sh) {ca / m:.2f}")
    print(f"  server: syscalls/op {sum(sc.values()) / m:.2f} ({fmt(sc, m)}); threads {len(st)};"
          f" instructions/op {si / m:,.0f}; malloc calls/op (callgrind) {sa / m:.2f}")


main()
