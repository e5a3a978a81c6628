#!/usr/bin/env python3
"""Benchmark of the chfs Python package against the Rust client and a
chfuse mount, on a local pool it starts (release builds of chfsd,
chfs-localpool, chfuse and the client's `seqbw` example).

1. Sequential 1 MiB writes then reads of one file from Python (raw
   ``readinto``/``write`` and the default buffered ``read``), and the same
   from the Rust client (``seqbw``), alternating, best of N each.
2. ``fsspec.filesystem("chfs").find`` over a tree of N entries against
   ``os.walk`` over the same tree through a chfuse mount of the pool, and
   chfind (the same listing from Rust, a process of its own), in
   alternating rounds (--rounds, a different one first in each); min and
   median wall time of each, the ratio os.walk / fs.find, the load
   average, and the CPU time the servers spent per listed entry.

    cargo build --release -p chfs-server -p chfs-localpool -p chfs-fuse \\
        -p chfs-ctl -p chfs-client --example seqbw
    python3 -m pip install ./python
    python3 python/bench.py [--size-mib 1024] [--entries 100000] [--json out.json]
    python3 python/bench.py --no-seq --entries 100000 --rounds 10   # listings only

Prints a table and, with --json, the figures. Needs FUSE 3 (fusermount3) for
the mount; --no-mount skips that comparison.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
# The installed package, not python/chfs beside this script (which has no
# native module unless built in place).
sys.path = [p for p in sys.path if pathlib.Path(p or ".").resolve() != REPO / "python"]
# The pool starter the tests use.
sys.path.insert(0, str(REPO / "python" / "tests"))
from localpool import LocalPool  # noqa: E402


def tool(bin_dir: pathlib.Path, name: str) -> str:
    for p in (bin_dir / name, bin_dir / "examples" / name):
        if p.is_file():
            return str(p)
    sys.exit(f"bench: {name} not found in {bin_dir}: build it (see --help)")


class Pool(LocalPool):
    """chfs-localpool in the background, stopped by its PID."""

    def __init__(self, bin_dir: pathlib.Path, servers: int):
        try:
            super().__init__(tool(bin_dir, "chfs-localpool"), servers)
        except RuntimeError as e:
            sys.exit(f"bench: {e}")

    def server_cpu(self) -> float:
        """CPU seconds the pool's servers (chfs-localpool's children) have
        used so far: the sum over their threads of the scheduler's run
        time (ns; /proc/PID/stat counts in 10 ms ticks)."""
        total = 0
        for t in os.listdir(f"/proc/{self.proc.pid}/task"):
            with open(f"/proc/{self.proc.pid}/task/{t}/children") as f:
                pids = f.read().split()
            for pid in pids:
                try:
                    tasks = os.listdir(f"/proc/{pid}/task")
                except OSError:
                    continue
                for task in tasks:
                    try:
                        with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                            total += int(f.read().split()[0])
                    except OSError:
                        pass
        return total / 1e9


def py_seq(client, path: str, size_mib: int, buffered: bool) -> tuple[float, float]:
    """MiB/s of sequential 1 MiB writes, then reads, from Python."""
    block = bytes((i * 7 + 1) & 0xFF for i in range(1 << 20))
    t = time.perf_counter()
    with client.open(path, "wb", buffering=-1 if buffered else 0) as f:
        for _ in range(size_mib):
            f.write(block)
    w = time.perf_counter() - t
    t = time.perf_counter()
    got = 0
    if buffered:
        with client.open(path, "rb") as f:
            while True:
                b = f.read(1 << 20)
                if not b:
                    break
                got += len(b)
    else:
        buf = bytearray(1 << 20)
        with client.open(path, "rb", buffering=0) as f:
            while True:
                n = f.readinto(buf)
                if not n:
                    break
                got += n
    r = time.perf_counter() - t
    assert got == size_mib << 20, (got, size_mib)
    return size_mib / w, size_mib / r


def rust_seq(seqbw: str, path: str, size_mib: int) -> tuple[float, float]:
    out = subprocess.run(
        [seqbw, path, str(size_mib), "1024"], check=True, capture_output=True, text=True
    ).stdout
    d = json.loads(out)
    return d["write_mib_s"], d["read_mib_s"]


def make_tree(client, root: str, entries: int, per_dir: int = 1000) -> int:
    """`entries` entries below `root`: directories of `per_dir` files each
    (the directories count as entries)."""
    client.makedirs(root, exist_ok=True)
    dirs = max(1, entries // (per_dir + 1))
    files = entries - dirs

    def fill(d: int) -> None:
        dp = f"{root}/d{d:04}"
        client.mkdir(dp)
        n = files // dirs + (1 if d < files % dirs else 0)
        for i in range(n):
            with client.open(f"{dp}/f{i:05}", "wb", buffering=0):
                pass

    with concurrent.futures.ThreadPoolExecutor(8) as ex:
        list(ex.map(fill, range(dirs)))
    return dirs + files


def timed(f, repeat: int, pool=None, per: int = 1):
    """Best time of `repeat` runs of `f` and its last result; with `pool`,
    also the servers' CPU time per run divided by `per` (entries)."""
    best, out = None, None
    cpu0 = pool.server_cpu() if pool else 0.0
    for _ in range(repeat):
        t = time.perf_counter()
        out = f()
        dt = time.perf_counter() - t
        best = dt if best is None else min(best, dt)
    if pool:
        return best, out, (pool.server_cpu() - cpu0) / repeat / per
    return best, out


def seq_bench(a, client) -> dict:
    """Sequential bandwidth, Python against the Rust client."""
    seqbw = tool(a.bin_dir, "seqbw")
    runs = {"rust": [], "python raw": [], "python buffered": []}
    order = [
        ("rust", lambda: rust_seq(seqbw, "/seq", a.size_mib)),
        ("python raw", lambda: py_seq(client, "/seq", a.size_mib, False)),
        ("python buffered", lambda: py_seq(client, "/seq", a.size_mib, True)),
    ]
    py_seq(client, "/seq", a.size_mib, False)  # warm-up: the servers' memory
    client.remove("/seq")
    for rep in range(a.repeat):
        # A different one first in every round: no order favours one.
        for name, run in order[rep % 3 :] + order[: rep % 3]:
            runs[name].append(run())
            client.remove("/seq")
    seq = {k: (max(w for w, _ in v), max(r for _, r in v)) for k, v in runs.items()}
    return seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    ap.add_argument("--bin-dir", type=pathlib.Path, default=target / "release")
    ap.add_argument("--servers", type=int, default=2)
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--entries", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=8, help="alternating rounds of the listings")
    ap.add_argument("--no-mount", action="store_true")
    ap.add_argument("--no-seq", action="store_true", help="only the listings")
    ap.add_argument("--json", type=pathlib.Path)
    a = ap.parse_args()

    pool = Pool(a.bin_dir, a.servers)
    os.environ.update(pool.env)
    mnt = None
    fuse = None
    results: dict = {"servers": a.servers, "size_mib": a.size_mib, "entries": a.entries}
    seq = {}
    try:
        import chfs
        import fsspec

        client = chfs.Client()
        if not a.no_seq:
            seq = seq_bench(a, client)
            results["seq_mib_s"] = {k: {"write": w, "read": r} for k, (w, r) in seq.items()}

        t = time.perf_counter()
        n = make_tree(client, "/tree", a.entries)
        results["tree_create_s"] = time.perf_counter() - t
        fs = fsspec.filesystem("chfs")
        chfind = tool(a.bin_dir, "chfind")

        def run_find():
            found = fs.find("/tree", withdirs=True)
            assert len(found) == n + 1, (len(found), n)

        def run_chfind():
            out = subprocess.run(
                [chfind, "-q", "-v", "/tree"], check=True, capture_output=True, text=True
            )
            assert out.stdout.split()[-1] == f"{n + 1}/{n + 1}", out.stdout

        listings = [("fs.find", run_find), ("chfind", run_chfind)]
        if not a.no_mount:
            mnt = tempfile.mkdtemp(prefix="chfs-bench-mnt-")
            subprocess.run([tool(a.bin_dir, "chfuse"), mnt], check=True, env=os.environ)
            fuse = mnt

            def walk_mount():
                walked = sum(len(d) + len(f) for _, d, f in os.walk(f"{mnt}/tree"))
                assert walked == n, (walked, n)

            listings.append(("os.walk", walk_mount))
        # Alternating rounds, a different one first in each (the pool, the
        # mount and the load are shared): wall time (chfind's includes
        # its process start) and the servers' CPU time of each run.
        times = {k: [] for k, _ in listings}
        cpus = {k: [] for k, _ in listings}
        for _, f in listings:
            f()  # warm-up
        load0 = os.getloadavg()[0]
        for rep in range(a.rounds):
            k = rep % len(listings)
            for name, f in listings[k:] + listings[:k]:
                c0 = pool.server_cpu()
                t = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t)
                cpus[name].append((pool.server_cpu() - c0) / n)
        results["load_average"] = [load0, os.getloadavg()[0]]
        results["listing_s"] = times
        results["listing_server_cpu_ns_per_entry"] = {
            k: statistics.median(v) * 1e9 for k, v in cpus.items()
        }
        t_cfind, _ = timed(lambda: client.find("/tree", dirs=True), a.repeat)
        results["client_find_s"] = t_cfind
        t_pywalk, walked = timed(
            lambda: sum(len(d) + len(f) for _, d, f in client.walk("/tree")), a.repeat
        )
        assert walked == n, (walked, n)
        results["client_walk_s"] = t_pywalk
    finally:
        if fuse:
            subprocess.run(["fusermount3", "-u", fuse], check=False)
        if mnt:
            for _ in range(50):
                try:
                    os.rmdir(mnt)
                    break
                except OSError:
                    time.sleep(0.1)
        pool.stop()

    if seq:
        rust_w, rust_r = seq["rust"]
        print(f"\nchfs Python package vs Rust client, {a.servers} local servers, "
              f"{a.size_mib} MiB file, 1 MiB requests, best of {a.repeat}")
        print(f"{'':<22}{'write MiB/s':>14}{'read MiB/s':>14}{'write % Rust':>14}{'read % Rust':>13}")
        for k, (w, r) in seq.items():
            print(f"{k:<22}{w:>14.0f}{r:>14.0f}{100 * w / rust_w:>13.0f}%{100 * r / rust_r:>12.0f}%")
    load = results["load_average"]
    print(f"\nlisting {n} entries (tree made in {results['tree_create_s']:.1f} s), "
          f"{a.rounds} alternating rounds, load average {load[0]:.1f} -> {load[1]:.1f}")
    print(f"{'':<34}{'min':>8}{'median':>9}  server CPU per entry (median)")
    labels = {
        "fs.find": "fsspec fs.find",
        "chfind": "chfind (process incl. start)",
        "os.walk": "os.walk over the chfuse mount",
    }
    for k, v in times.items():
        print(f"{labels[k]:<34}{min(v):>7.3f}s{statistics.median(v):>8.3f}s  "
              f"{results['listing_server_cpu_ns_per_entry'][k]:>6.0f} ns")
    print(f"{'chfs.Client.find, best':<34}{t_cfind:>7.3f}s")
    print(f"{'chfs.Client.walk (one dir a time)':<34}{t_pywalk:>7.3f}s")
    if "os.walk" in times:
        w, f = times["os.walk"], times["fs.find"]
        ratios = sorted(x / y for x, y in zip(w, f))
        print(f"os.walk over the mount / fs.find: {min(w) / min(f):.1f}x (min / min), "
              f"{statistics.median(w) / statistics.median(f):.1f}x (median / median), "
              f"{ratios[0]:.1f}-{ratios[-1]:.1f}x per round")
    if a.json:
        a.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
