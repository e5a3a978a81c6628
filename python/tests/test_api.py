"""chfs.Client against a real pool: files, io layers, names, errors."""

import array
import errno
import hashlib
import io
import os
import stat

import pytest

import chfs


@pytest.mark.fabric
def test_open_returns_the_io_layers_of_the_builtin_open(client, tmp):
    p = f"{tmp}/f"
    with client.open(p, "wb") as f:
        assert isinstance(f, io.BufferedWriter)
        assert f.write(b"abc") == 3
    with client.open(p, "rb") as f:
        assert isinstance(f, io.BufferedReader)
        assert f.read() == b"abc"
    with client.open(p, "r+b") as f:
        assert isinstance(f, io.BufferedRandom)
        f.seek(1)
        f.write(b"X")
        f.seek(0)
        assert f.read() == b"aXc"
    with client.open(p, "rb", buffering=0) as f:
        assert isinstance(f, chfs.RawFile) and isinstance(f, io.RawIOBase)
        assert f.read(2) == b"aX"
        assert f.readall() == b"c"
    with client.open(p, "r") as f:
        assert isinstance(f, io.TextIOWrapper)
        assert f.mode == "r" and f.name == p
        assert f.read() == "aXc"
    with pytest.raises(ValueError):
        client.open(p, "r", buffering=0)
    with pytest.raises(ValueError):
        client.open(p, "rw")
    with pytest.raises(ValueError):
        client.open(p, "rb", encoding="utf-8")


def test_text_mode_lines_encoding_and_newlines(client, tmp):
    p = f"{tmp}/t.txt"
    lines = ["first line\n", "ünïcödé ✓\n", "last\n"]
    with client.open(p, "w", encoding="utf-8") as f:
        f.writelines(lines)
    with client.open(p, "r", encoding="utf-8") as f:
        assert list(f) == lines
    with client.open(p, "rb") as f:
        assert f.read() == "".join(lines).encode()
    with client.open(p, "w", newline="\r\n", encoding="ascii") as f:
        f.write("a\nb\n")
    with client.open(p, "rb") as f:
        assert f.read() == b"a\r\nb\r\n"


def test_modes_create_exclusive_append_truncate(client, tmp):
    p = f"{tmp}/m"
    with pytest.raises(FileNotFoundError):
        client.open(p, "r")
    with client.open(p, "x") as f:
        f.write("one\n")
    with pytest.raises(FileExistsError) as e:
        client.open(p, "x")
    assert e.value.errno == errno.EEXIST and e.value.filename == p
    with client.open(p, "a") as f:
        f.write("two\n")
    with client.open(p, "a+b") as f:
        f.seek(0)
        f.write(b"three\n")  # appends whatever the position
        f.seek(0)
        assert f.read() == b"one\ntwo\nthree\n"
    with client.open(p, "w") as f:
        pass
    assert client.stat(p).st_size == 0
    with client.open(p, "rb") as f, pytest.raises(io.UnsupportedOperation):
        f.write(b"x")
    with client.open(p, "wb") as f, pytest.raises(io.UnsupportedOperation):
        f.read()


def test_new_files_and_directories_get_mode_less_umask(client, tmp):
    old = os.umask(0o027)
    try:
        with client.open(f"{tmp}/u", "w"):
            pass
        client.mkdir(f"{tmp}/d")
    finally:
        os.umask(old)
    assert stat.S_IMODE(client.stat(f"{tmp}/u").st_mode) == 0o640
    assert stat.S_IMODE(client.stat(f"{tmp}/d").st_mode) == 0o750


def test_seek_tell_truncate(client, tmp):
    p = f"{tmp}/s"
    with client.open(p, "w+b", buffering=0) as f:
        f.write(b"0123456789")
        assert f.tell() == 10
        assert f.seek(-3, io.SEEK_END) == 7
        assert f.read() == b"789"
        assert f.seek(2) == 2 and f.seek(3, io.SEEK_CUR) == 5
        assert f.read(2) == b"56"
        assert f.truncate(4) == 4
        assert f.tell() == 7  # truncate keeps the position
        f.seek(0)
        assert f.read() == b"0123"
        with pytest.raises(OSError) as e:
            f.seek(-1)
        assert e.value.errno == errno.EINVAL
        f.seek(8)
        f.write(b"Z")  # past the end: a hole reads as zeros
        f.seek(0)
        assert f.read() == b"0123\0\0\0\0Z"
        assert f.fstat().st_size == 9
    assert f.closed
    with pytest.raises(ValueError):
        f.read()


def test_readinto_fills_any_writable_buffer_in_place(client, tmp):
    p = f"{tmp}/r"
    data = bytes(range(256)) * 64
    with client.open(p, "wb") as f:
        f.write(memoryview(data)[:100])
        f.write(data[100:])
    with client.open(p, "rb", buffering=0) as f:
        buf = bytearray(1000)
        mv = memoryview(buf)
        assert f.readinto(mv[10:110]) == 100
        assert buf[10:110] == data[:100] and buf[:10] == bytes(10)
        arr = array.array("d", [0.0] * 16)  # not a byte format: still filled
        assert f.readinto(arr) == 128
        assert arr.tobytes() == data[100:228]
        with pytest.raises(TypeError):
            f.readinto(b"read-only bytes")
        f.seek(len(data) - 5)
        assert f.readinto(buf) == 5 and f.readinto(buf) == 0


@pytest.mark.fabric
def test_large_file_across_chunks_with_unaligned_writes(client, tmp):
    p = f"{tmp}/big"
    size = 48 << 20
    block = os.urandom(1 << 20)
    h = hashlib.sha256()
    with client.open(p, "wb", chunk_size=1 << 16) as f:
        done = 0
        step = (1 << 20) + 4097  # never chunk-aligned
        while done < size:
            n = min(step, size - done)
            piece = (block * 2)[done % (1 << 20) : done % (1 << 20) + n]
            f.write(piece)
            h.update(piece)
            done += n
    st = client.stat(p)
    assert st.st_size == size and st.st_blksize == 1 << 16
    g = hashlib.sha256()
    with client.open(p, "rb", buffering=0) as f:
        buf = bytearray(3 << 20)
        while True:
            n = f.readinto(buf)
            if not n:
                break
            g.update(memoryview(buf)[:n])
    assert g.hexdigest() == h.hexdigest()
    with client.open(p, "rb") as f:
        assert hashlib.sha256(f.read()).hexdigest() == h.hexdigest()


@pytest.mark.parametrize(
    "case,errno_,exc",
    [
        ("missing", errno.ENOENT, FileNotFoundError),
        ("exists", errno.EEXIST, FileExistsError),
        ("notdir", errno.ENOTDIR, NotADirectoryError),
        ("isdir", errno.EISDIR, IsADirectoryError),
        ("notempty", errno.ENOTEMPTY, OSError),
        ("rmdir_file", errno.ENOTDIR, NotADirectoryError),
    ],
)
@pytest.mark.fabric
def test_errors_are_oserror_subclasses_with_the_errno(client, tmp, case, errno_, exc):
    f = f"{tmp}/file"
    with client.open(f, "w"):
        pass
    client.mkdir(f"{tmp}/dir")
    client.mkdir(f"{tmp}/full")
    with client.open(f"{tmp}/full/x", "w"):
        pass
    op = {
        "missing": lambda: client.stat(f"{tmp}/nothing"),
        "exists": lambda: client.mkdir(f"{tmp}/dir"),
        "notdir": lambda: client.open(f"{f}/below", "w"),
        "isdir": lambda: client.open(f"{tmp}/dir", "w"),
        "notempty": lambda: client.rmdir(f"{tmp}/full"),
        "rmdir_file": lambda: client.rmdir(f),
    }[case]
    with pytest.raises(exc) as e:
        op()
    assert type(e.value) is exc
    assert e.value.errno == errno_
    assert e.value.filename is not None


@pytest.mark.fabric
def test_stat_listdir_scandir(client, tmp):
    client.mkdir(f"{tmp}/sub")
    with client.open(f"{tmp}/a", "wb") as f:
        f.write(b"12345")
    client.symlink(f"{tmp}/sub", f"{tmp}/link")
    assert client.listdir(tmp) == ["a", "link", "sub"]
    st = client.stat(f"{tmp}/a")
    assert isinstance(st, os.stat_result) and stat.S_ISREG(st.st_mode)
    assert st.st_size == 5 and st.st_nlink == 1 and st.st_mtime_ns > 0
    assert abs(st.st_mtime - st.st_mtime_ns / 1e9) < 1e-3
    assert stat.S_ISLNK(client.lstat(f"{tmp}/link").st_mode)
    assert stat.S_ISDIR(client.stat(f"{tmp}/link").st_mode)
    assert client.readlink(f"{tmp}/link") == f"{tmp}/sub"
    with client.scandir(tmp) as it:
        entries = {e.name: e for e in it}
    assert entries["a"].is_file() and not entries["a"].is_dir()
    assert entries["a"].stat().st_size == 5 and entries["a"].path == f"{tmp}/a"
    assert entries["sub"].is_dir() and not entries["sub"].is_symlink()
    assert entries["link"].is_symlink() and entries["link"].is_dir()
    assert not entries["link"].is_dir(follow_symlinks=False)
    assert os.fspath(entries["a"]) == f"{tmp}/a"
    assert client.exists(f"{tmp}/a") and not client.exists(f"{tmp}/b")
    assert client.isdir(f"{tmp}/sub") and client.isfile(f"{tmp}/a")
    assert client.getsize(f"{tmp}/a") == 5


@pytest.mark.fabric
def test_mkdir_makedirs_rename_remove_rmdir(client, tmp):
    client.makedirs(f"{tmp}/x/y/z")
    with pytest.raises(FileExistsError):
        client.makedirs(f"{tmp}/x/y/z")
    client.makedirs(f"{tmp}/x/y/z", exist_ok=True)
    with client.open(f"{tmp}/x/y/z/f", "w") as f:
        f.write("data")
    client.rename(f"{tmp}/x", f"{tmp}/moved")
    assert not client.exists(f"{tmp}/x")
    with client.open(f"{tmp}/moved/y/z/f") as f:
        assert f.read() == "data"
    with pytest.raises(IsADirectoryError):
        client.remove(f"{tmp}/moved/y")
    client.remove(f"{tmp}/moved/y/z/f")
    for d in ("z", ""):
        client.rmdir(f"{tmp}/moved/y/{d}".rstrip("/"))
    client.rmdir(f"{tmp}/moved")
    assert client.listdir(tmp) == []


def test_walk_matches_the_tree_topdown_bottomup_and_pruned(client, tmp):
    for d in ("a/b/c", "a/d", "e"):
        client.makedirs(f"{tmp}/{d}")
    for f in ("a/1", "a/b/2", "a/b/c/3", "e/4", "5"):
        with client.open(f"{tmp}/{f}", "w"):
            pass
    top = list(client.walk(tmp))
    assert top == [
        (tmp, ["a", "e"], ["5"]),
        (f"{tmp}/a", ["b", "d"], ["1"]),
        (f"{tmp}/a/b", ["c"], ["2"]),
        (f"{tmp}/a/b/c", [], ["3"]),
        (f"{tmp}/a/d", [], []),
        (f"{tmp}/e", [], ["4"]),
    ]
    bottom = list(client.walk(tmp, topdown=False))
    assert sorted(bottom) == sorted(top) and bottom[-1][0] == tmp
    assert bottom.index((f"{tmp}/a/b/c", [], ["3"])) < bottom.index(
        (f"{tmp}/a/b", ["c"], ["2"])
    )
    pruned = []
    for d, dirs, _ in client.walk(tmp):
        pruned.append(d)
        if "b" in dirs:
            dirs.remove("b")
    assert f"{tmp}/a/b" not in pruned and f"{tmp}/a/d" in pruned
    errors = []
    assert list(client.walk(f"{tmp}/none", onerror=errors.append)) == []
    assert isinstance(errors[0], FileNotFoundError)


@pytest.mark.fabric
def test_find_lists_every_entry_once_with_maxdepth(client, tmp):
    names = set()
    for i in range(6):
        client.makedirs(f"{tmp}/d{i}/s")
        for j in range(20):
            p = f"{tmp}/d{i}/s/f{j}" if j % 2 else f"{tmp}/d{i}/f{j}"
            with client.open(p, "wb") as f:
                f.write(b"x" * j)
            names.add(p)
    found = client.find(tmp)
    assert list(found) == sorted(names)
    assert all(found[p].st_size == int(p.rsplit("f", 1)[1]) for p in found)
    assert client.find_paths(tmp) == list(found)
    with_dirs = client.find(tmp, dirs=True)
    assert client.find_paths(tmp, dirs=True) == list(with_dirs)
    assert client.find_paths(tmp, 1, dirs=True) == [f"{tmp}/d{i}" for i in range(6)]
    assert set(with_dirs) - set(found) == {f"{tmp}/d{i}" for i in range(6)} | {
        f"{tmp}/d{i}/s" for i in range(6)
    }
    assert set(client.find(tmp, maxdepth=2)) == {p for p in names if p.count("/") == 3}
    assert set(client.find(tmp, maxdepth=1, dirs=True)) == {f"{tmp}/d{i}" for i in range(6)}
    with pytest.raises(ValueError):
        client.find(tmp, maxdepth=0)


@pytest.mark.fabric
def test_pool_calls_statfs_sync_flush_status_stagein(client, tmp, tmp_path):
    fs = client.statfs()
    assert fs.servers == 2 and fs.total >= fs.used
    assert len(client.servers()) == 2
    client.sync()  # no backend: nothing to write back, no error
    st = client.flush_status(tmp)
    assert st.clean and st.dirty_bytes == 0
    client.wait_flushed(tmp, timeout=5)
    src = tmp_path / "local.bin"
    src.write_bytes(b"staged" * 1000)
    assert client.stagein(str(src)) == 6000
    with client.open(str(src), "rb") as f:
        assert f.read() == b"staged" * 1000
    client.remove(str(src))


def test_utime_chmod_truncate_by_path(client, tmp):
    p = f"{tmp}/t"
    with client.open(p, "wb") as f:
        f.write(b"abcdef")
    client.truncate(p, 2)
    assert client.stat(p).st_size == 2
    client.chmod(p, 0o600)
    assert stat.S_IMODE(client.stat(p).st_mode) == 0o600
    client.utime(p, ns=(1_000_000_000, 2_000_000_123))
    st = client.stat(p)
    assert st.st_mtime_ns == 2_000_000_123 and st.st_atime_ns == 1_000_000_000


def test_client_servers_argument_and_missing_server(pool, monkeypatch):
    c = chfs.Client(pool.env["CHFS_SERVER"].split(","))
    assert len(c.servers()) == 2
    monkeypatch.delenv("CHFS_SERVER")
    with pytest.raises(OSError) as e:
        chfs.Client()
    assert e.value.errno == errno.EINVAL


@pytest.mark.fabric
def test_a_client_without_the_pool_key_is_refused(pool, monkeypatch):
    monkeypatch.delenv("CHFS_SECRET_FILE")
    with pytest.raises(PermissionError) as e:
        chfs.Client().stat("/")
    assert e.value.errno == errno.EACCES


def _tree(client, root):
    """Many directories, a chain 30 deep, names that sort between a
    directory and its entries ("a.txt", "a-b" between "a" and "a/..."),
    non-ASCII and long names, a symbolic link, a larger directory."""
    for d in ("a", "a-b", "a.d", "é", "日本語", "Z"):
        client.makedirs(f"{root}/{d}")
        for f in ("x", "x.txt", "x-y", "ü", "n" * 255):
            with client.open(f"{root}/{d}/{f}", "wb") as fh:
                fh.write(b"abc")
    with client.open(f"{root}/a.txt", "wb") as fh:
        fh.write(b"0123456789")
    client.symlink("a", f"{root}/link")
    p = f"{root}/deep"
    for i in range(30):
        client.makedirs(p)
        with client.open(f"{p}/f{i}", "wb") as fh:
            fh.write(b"x" * i)
        p = f"{p}/d{i:02}"
    client.makedirs(f"{root}/big")
    for i in range(1500):
        client.open(f"{root}/big/{i:05}", "wb").close()


def _walked(client, root, dirs):
    """What the walk directory by directory finds (a maxdepth makes find
    walk): the same as the tree listing must."""
    return client.find(root, maxdepth=10_000, dirs=dirs)


@pytest.mark.fabric
def test_find_of_a_whole_tree_equals_the_walk(client, tmp):
    _tree(client, tmp)
    for dirs in (False, True):
        walked = _walked(client, tmp, dirs)
        found = client.find(tmp, dirs=dirs)
        assert list(found) == sorted(walked)
        assert {p: (s.st_mode, s.st_size, s.st_ino) for p, s in found.items()} == {
            p: (s.st_mode, s.st_size, s.st_ino) for p, s in walked.items()
        }
        assert client.find_paths(tmp, dirs=dirs) == list(found)
    # os.walk's view agrees too.
    via_walk = sorted(
        f"{top}/{n}" for top, ds, fs in client.walk(tmp) for n in ds + fs
    )
    assert client.find_paths(tmp, dirs=True) == via_walk


def test_find_falls_back_to_the_walk_on_servers_without_tree_listings(monkeypatch):
    """Servers older than the tree listing (one answers it as an unknown
    request: EPROTO, the connection closed): find walks instead."""
    from conftest import Pool

    pool = Pool(2, extra=["--chfsd-arg=--unknown-op=LIST_TREE"])
    try:
        monkeypatch.setenv("CHFS_SERVER", pool.env["CHFS_SERVER"])
        monkeypatch.setenv("CHFS_SECRET_FILE", pool.env["CHFS_SECRET_FILE"])
        c = chfs.Client()
        c.makedirs("/old")
        _tree(c, "/old")
        walked = _walked(c, "/old", True)
        assert c.find_paths("/old", dirs=True) == sorted(walked)
        assert list(c.find("/old")) == sorted(p for p in walked if not stat.S_ISDIR(walked[p].st_mode))
    finally:
        pool.stop()
