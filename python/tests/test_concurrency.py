"""Threads, the GIL, fork and multiprocessing readers."""

import hashlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import chfs

from conftest import Pool


def _data(i: int, size: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest() * (size // 32)


@pytest.mark.fabric
def test_threads_share_one_client(client, tmp):
    errors = []

    def work(i):
        try:
            p = f"{tmp}/t{i}"
            data = _data(i, 3 << 20)
            for _ in range(3):
                with client.open(p, "wb") as f:
                    f.write(data)
                with client.open(p, "rb") as f:
                    assert f.read() == data
                assert client.stat(p).st_size == len(data)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert client.listdir(tmp) == sorted(f"t{i}" for i in range(8))


def test_threads_read_one_file_through_their_own_handles(client, tmp):
    p = f"{tmp}/shared"
    data = os.urandom(8 << 20)
    with client.open(p, "wb") as f:
        f.write(data)
    results = {}

    def read(i):
        with client.open(p, "rb", buffering=0) as f:
            f.seek(i << 20)
            buf = bytearray(1 << 20)
            f.readinto(buf)
            results[i] = bytes(buf)

    threads = [threading.Thread(target=read, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert b"".join(results[i] for i in range(8)) == data


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def _stopped(pid: int) -> bool:
    """Is every thread of `pid` stopped (SIGSTOP takes effect later)?"""
    for t in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{t}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] != "T":
                return False
    return True


def test_the_gil_is_released_while_a_call_waits_for_a_server(monkeypatch):
    """A call blocked on a stopped server (SIGSTOP) leaves the other
    threads running: had it kept the GIL, the main thread's loop below
    would not run until the call timed out."""
    monkeypatch.setenv("CHFS_RPC_TIMEOUT_MSEC", "4000")
    pool = Pool(1)
    try:
        monkeypatch.setenv("CHFS_SERVER", pool.env["CHFS_SERVER"])
        monkeypatch.setenv("CHFS_SECRET_FILE", pool.env["CHFS_SECRET_FILE"])
        c = chfs.Client()
        c.stat("/")
        (server,) = _children(pool.proc.pid)
        os.kill(server, signal.SIGSTOP)
        deadline = time.monotonic() + 10
        while not _stopped(server):
            assert time.monotonic() < deadline, "the server did not stop"
            time.sleep(0.01)
        outcome = []

        def blocked():
            t0 = time.monotonic()
            try:
                c.stat("/")
                outcome.append(("ok", time.monotonic() - t0))
            except OSError as e:
                outcome.append((e.errno, time.monotonic() - t0))

        t = threading.Thread(target=blocked)
        t.start()
        time.sleep(0.2)  # the thread is now waiting for its reply
        ticks, t0 = 0, time.monotonic()
        while time.monotonic() - t0 < 1.0:
            ticks += 1
        still_waiting = t.is_alive()
        os.kill(server, signal.SIGCONT)
        t.join()
        assert still_waiting, outcome
        assert ticks > 10_000, ticks
    finally:
        pool.stop()


def _read_in_child(args):
    path, size, want = args
    c = _CLIENT
    with c.open(path, "rb") as f:
        data = f.read()
    return len(data) == size and hashlib.sha256(data).hexdigest() == want


_CLIENT = None


@pytest.mark.fabric
def test_multiprocessing_fork_readers_share_the_parents_client(client, tmp):
    global _CLIENT
    _CLIENT = client
    jobs = []
    for i in range(8):
        data = _data(i, 1 << 20)
        with client.open(f"{tmp}/m{i}", "wb") as f:
            f.write(data)
        jobs.append((f"{tmp}/m{i}", len(data), hashlib.sha256(data).hexdigest()))
    with mp.get_context("fork").Pool(4) as p:
        assert p.map(_read_in_child, jobs) == [True] * 8
    # The parent's connections were not disturbed by the children.
    with client.open(f"{tmp}/m0", "rb") as f:
        assert f.read() == _data(0, 1 << 20)


@pytest.mark.fabric
def test_a_file_opened_before_fork_is_read_on_in_the_child(client, tmp):
    p = f"{tmp}/forked"
    data = os.urandom(5 << 20)
    with client.open(p, "wb") as f:
        f.write(data)
    f = client.open(p, "rb", buffering=0)
    assert f.read(1 << 20) == data[: 1 << 20]
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: reports through the pipe, never returns
        ok = 0
        try:
            rest = f.read()
            f.close()
            ok = int(rest == data[1 << 20 :])
            with client.open(f"{p}.child", "wb") as g:
                g.write(b"from the child")
        finally:
            os.write(w, bytes([ok]))
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"\x01"
    # The parent's file and connections still work.
    assert f.read(10) == data[1 << 20 : (1 << 20) + 10]
    f.close()
    with client.open(f"{p}.child", "rb") as g:
        assert g.read() == b"from the child"


def _fsspec_worker(args):
    fs, path = args
    with fs.open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.mark.fabric
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_multiprocessing_readers_through_fsspec(client, tmp, method):
    import fsspec

    fs = fsspec.filesystem("chfs")
    paths, want = [], []
    for i in range(4):
        data = _data(100 + i, 1 << 20)
        fs.pipe_file(f"chfs://{tmp}/p{i}", data)
        paths.append(f"{tmp}/p{i}")
        want.append(hashlib.sha256(data).hexdigest())
    with mp.get_context(method).Pool(2) as p:
        assert p.map(_fsspec_worker, [(fs, x) for x in paths]) == want


@pytest.mark.fabric
def test_threads_of_a_forked_child_reopen_an_inherited_file_together(client, tmp):
    """Several threads of a child use a file opened before the fork at
    once: each may find it needs reopening; none may deadlock on another
    (a lock held while the GIL is released)."""
    p = f"{tmp}/inherited"
    with client.open(p, "wb") as f:
        f.write(b"z" * 1000)
    f = client.open(p, "rb", buffering=0)
    pid = os.fork()
    if pid == 0:
        ok = 1
        try:
            sizes = []

            def use():
                for _ in range(20):
                    sizes.append(f.fstat().st_size)

            ts = [threading.Thread(target=use) for _ in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join()
            ok = 0 if sizes == [1000] * 80 else 1
        finally:
            os._exit(ok)
    deadline = time.monotonic() + 60
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child's threads deadlocked")
        time.sleep(0.05)
    assert os.waitstatus_to_exitcode(status) == 0
    f.close()


_SIGNALS = """
import os, signal, chfs
got = []
# An interpreter started with SIGINT ignored (a background job of a
# non-interactive shell, as CI may be) keeps it ignored; give it Python's
# usual handler so the check below is about the transport only.
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, lambda s, f: got.append(s))
c = chfs.Client()
c.stat("/")
assert c.servers()[0].startswith(os.environ["EXPECT"]), c.servers()
os.kill(os.getpid(), signal.SIGTERM)
assert got == [signal.SIGTERM], got
try:
    os.kill(os.getpid(), signal.SIGINT)
except KeyboardInterrupt:
    print("ok")
"""


@pytest.mark.fabric
def test_signal_handlers_stay_pythons_once_the_transport_is_loaded(pool, protocol):
    """A fresh interpreter whose first call opens the transport (over
    ofi+tcp it loads libfabric, whose Debian build brings handlers that
    exit(1) on SIGINT and SIGTERM): its SIGTERM handler still runs and
    Ctrl-C is still KeyboardInterrupt."""
    expect = f"{protocol}://" if protocol != "tcp" else ""
    out = subprocess.run(
        [sys.executable, "-c", _SIGNALS],
        env={**os.environ, "EXPECT": expect},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (out.returncode, out.stdout) == (0, "ok\n"), out.stderr
