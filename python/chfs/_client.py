"""The Python face of a chfs-rs pool: :class:`Client` with ``open`` and
``os``-like calls.

Everything here translates: the native module (``chfs._chfs``, a thin
adapter over the Rust client crate) does the I/O without the GIL and raises
``OSError`` subclasses carrying the client's errno.
"""

from __future__ import annotations

import errno as _errno
import io
import os
import stat as _stat
from typing import Iterator, NamedTuple

from . import _chfs

#: Buffer size of the buffered io objects :meth:`Client.open` returns when
#: ``buffering`` is -1: four 64 KiB chunks, sent in one pipelined call.
#: Reads and writes larger than this go straight between the caller's
#: memory and the servers (io.Buffered* copy a request of exactly the
#: buffer's size through the buffer).
DEFAULT_BUFFER_SIZE = 256 << 10


def _umask() -> int:
    """The process's umask, read without changing it (os.umask would,
    for a moment, for every thread)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _stat_result(t) -> os.stat_result:
    """An ``os.stat_result`` from the native status tuple."""
    mode, ino, nlink, uid, gid, size, a_ns, m_ns, c_ns, blksize, blocks, rdev = t
    return os.stat_result(
        (
            mode, ino, 0, nlink, uid, gid, size,
            a_ns // 1_000_000_000, m_ns // 1_000_000_000, c_ns // 1_000_000_000,
            a_ns / 1e9, m_ns / 1e9, c_ns / 1e9,
            a_ns, m_ns, c_ns,
            blksize, blocks, rdev,
        )
    )


def _raise_walk_errors(errs) -> None:
    """The first error of a walk that is not a directory removed while it
    was walked (ENOENT)."""
    for d, errno, msg in errs:
        if errno != _errno.ENOENT:
            raise OSError(errno, msg, d)


class StatFs(NamedTuple):
    """Capacity of the pool, summed over its servers."""

    total: int
    used: int
    free: int
    entries: int
    servers: int


class FlushStatus(NamedTuple):
    """Write-back state (cache mode) of everything under a path."""

    dirty_chunks: int
    dirty_bytes: int
    failing_chunks: int
    last_errno: int
    last_error: str

    @property
    def clean(self) -> bool:
        """Is everything written back to the backend?"""
        return self.dirty_chunks == 0


def _flags(mode: str) -> tuple[int, bool, bool, bool]:
    """open(2) flags of a Python open() mode, and (binary, readable, writable)."""
    allowed = set("rwxab+t")
    if not mode or set(mode) - allowed or len(set(mode)) != len(mode):
        raise ValueError(f"invalid mode: {mode!r}")
    kinds = [c for c in mode if c in "rwxa"]
    if len(kinds) != 1:
        raise ValueError(
            "must have exactly one of create/read/write/append mode"
        )
    if "b" in mode and "t" in mode:
        raise ValueError("can't have text and binary mode at once")
    plus = "+" in mode
    k = kinds[0]
    if k == "r":
        flags = os.O_RDWR if plus else os.O_RDONLY
    else:
        flags = (os.O_RDWR if plus else os.O_WRONLY) | os.O_CREAT
        flags |= {"w": os.O_TRUNC, "x": os.O_EXCL, "a": os.O_APPEND}[k]
    return flags, "b" in mode, k == "r" or plus, k != "r" or plus


class RawFile(io.RawIOBase):
    """Unbuffered binary file of a pool (what ``open(..., buffering=0)``
    returns, and the raw layer under the buffered and text objects).

    ``readinto`` reads straight into the caller's buffer (bytearray,
    memoryview, numpy array: any writable contiguous buffer) and ``write``
    sends straight from the caller's buffer, without the GIL."""

    def __init__(self, native: _chfs.File, name: str, mode: str):
        super().__init__()
        self._f = native
        self.name = name
        self.mode = mode
        flags = native.flags
        acc = flags & os.O_ACCMODE
        self._readable = acc != os.O_WRONLY
        self._writable = acc != os.O_RDONLY

    def readable(self) -> bool:
        self._checkClosed()
        return self._readable

    def writable(self) -> bool:
        self._checkClosed()
        return self._writable

    def seekable(self) -> bool:
        self._checkClosed()
        return True

    def isatty(self) -> bool:
        self._checkClosed()
        return False

    def fileno(self) -> int:
        raise io.UnsupportedOperation("a chfs-rs file has no OS file descriptor")

    def readinto(self, b) -> int:
        if not self._readable:
            raise io.UnsupportedOperation("File not open for reading")
        return self._f.readinto(b)

    def readall(self) -> bytes:
        if not self._readable:
            raise io.UnsupportedOperation("File not open for reading")
        parts = [self._f.read(-1)]
        while True:  # the file may have grown meanwhile
            more = self._f.read(DEFAULT_BUFFER_SIZE)
            if not more:
                break
            parts.append(more)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def write(self, b) -> int:
        if not self._writable:
            raise io.UnsupportedOperation("File not open for writing")
        return self._f.write(b)

    def seek(self, pos: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(pos, whence)

    def tell(self) -> int:
        self._checkClosed()
        return self._f.tell()

    def truncate(self, size: int | None = None) -> int:
        if not self._writable:
            raise io.UnsupportedOperation("File not open for writing")
        if size is None:
            size = self._f.tell()
        return self._f.truncate(size)

    def flush(self) -> None:
        super().flush()
        if not self._f.closed:  # IOBase.close flushes after close() below
            self._f.flush()

    def fsync(self) -> None:
        """Publishes the file's size and buffered writes to other clients."""
        self._f.fsync()

    def fstat(self) -> os.stat_result:
        """The open file's status."""
        return _stat_result(self._f.fstat())

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._f.close()
        finally:
            super().close()

    def __repr__(self) -> str:
        return f"<chfs.RawFile name={self.name!r} mode={self.mode!r}>"


class DirEntry:
    """An entry of :meth:`Client.scandir`, like ``os.DirEntry``: its status
    came with the listing (no further request), except ``stat()`` of a
    symbolic link, which follows it."""

    __slots__ = ("name", "path", "_st", "_client", "_target")

    def __init__(self, client: "Client", directory: str, name: str, st) -> None:
        self.name = name
        self.path = directory.rstrip("/") + "/" + name
        self._st = st
        self._client = client
        self._target = None

    def _follow(self) -> os.stat_result | None:
        if self._target is None:
            try:
                self._target = self._client.stat(self.path)
            except FileNotFoundError:
                return None
        return self._target

    def is_symlink(self) -> bool:
        return _stat.S_ISLNK(self._st[0])

    def is_dir(self, *, follow_symlinks: bool = True) -> bool:
        if follow_symlinks and self.is_symlink():
            t = self._follow()
            return t is not None and _stat.S_ISDIR(t.st_mode)
        return _stat.S_ISDIR(self._st[0])

    def is_file(self, *, follow_symlinks: bool = True) -> bool:
        if follow_symlinks and self.is_symlink():
            t = self._follow()
            return t is not None and _stat.S_ISREG(t.st_mode)
        return _stat.S_ISREG(self._st[0])

    def stat(self, *, follow_symlinks: bool = True) -> os.stat_result:
        if follow_symlinks and self.is_symlink():
            return self._client.stat(self.path)
        return _stat_result(self._st)

    def inode(self) -> int:
        return self._st[1]

    def __fspath__(self) -> str:
        return self.path

    def __repr__(self) -> str:
        return f"<chfs.DirEntry {self.name!r}>"


class _ScandirIterator:
    """What :meth:`Client.scandir` returns: an iterator that is also a
    context manager, as ``os.scandir``'s."""

    def __init__(self, entries: list[DirEntry]):
        self._it = iter(entries)

    def __iter__(self):
        return self

    def __next__(self) -> DirEntry:
        return next(self._it)

    def close(self) -> None:
        self._it = iter(())

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Client:
    """A handle to a chfs-rs pool: ``open`` and ``os``-like calls on its
    paths (absolute, ``/`` is the pool's root).

    ``servers`` (``"host:port,..."`` or a list) replaces ``CHFS_SERVER``;
    every other setting, the pool's key (``CHFS_SECRET_FILE`` /
    ``CHFS_SECRET``) included, is read from the environment like every
    chfs-rs client does. Safe to share between threads; in a forked child
    (multiprocessing) it connects anew on first use and files opened
    before the fork are reopened at their position."""

    def __init__(self, servers: str | list[str] | None = None):
        self._c = _chfs.Client(servers)

    # ----- files -----------------------------------------------------

    def open(
        self,
        path: str,
        mode: str = "r",
        buffering: int = -1,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
        *,
        chunk_size: int = 0,
        perm: int = 0o666,
    ):
        """Opens a file as the built-in ``open`` does: ``RawFile``
        (``buffering=0``, binary only), ``io.BufferedReader`` /
        ``BufferedWriter`` / ``BufferedRandom`` (binary), or
        ``io.TextIOWrapper``. ``chunk_size`` sets the chunk size of a file
        this call creates (0: the client's, ``CHFS_CHUNK_SIZE``); ``perm``
        its permission bits (less the process's umask, as ``os.open``)."""
        flags, binary, readable, writable = _flags(mode)
        if not binary:
            if buffering == 0:
                raise ValueError("can't have unbuffered text I/O")
        elif encoding is not None:
            raise ValueError("binary mode doesn't take an encoding argument")
        elif errors is not None:
            raise ValueError("binary mode doesn't take an errors argument")
        elif newline is not None:
            raise ValueError("binary mode doesn't take a newline argument")
        native = self._c.open(path, flags, perm & ~_umask(), chunk_size)
        raw = RawFile(native, path, mode)
        try:
            line_buffering = buffering == 1 and not binary
            if buffering in (-1, 1):
                buffering = DEFAULT_BUFFER_SIZE
            if buffering == 0:
                return raw
            if readable and writable:
                buf = io.BufferedRandom(raw, buffering)
            elif writable:
                buf = io.BufferedWriter(raw, buffering)
            else:
                buf = io.BufferedReader(raw, buffering)
            if binary:
                return buf
            text = io.TextIOWrapper(
                buf, io.text_encoding(encoding), errors, newline, line_buffering
            )
            text.mode = mode
            return text
        except BaseException:
            raw.close()
            raise

    # ----- names -----------------------------------------------------

    def stat(self, path: str, *, follow_symlinks: bool = True) -> os.stat_result:
        """Status of ``path`` (``os.stat_result``; ``st_dev`` is 0)."""
        if follow_symlinks:
            return _stat_result(self._c.stat(path))
        return _stat_result(self._c.lstat(path))

    def lstat(self, path: str) -> os.stat_result:
        """Status of ``path`` without following a final symbolic link."""
        return _stat_result(self._c.lstat(path))

    def exists(self, path: str) -> bool:
        try:
            self._c.stat(path)
            return True
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isdir(self, path: str) -> bool:
        try:
            return _stat.S_ISDIR(self._c.stat(path)[0])
        except (FileNotFoundError, NotADirectoryError):
            return False

    def isfile(self, path: str) -> bool:
        try:
            return _stat.S_ISREG(self._c.stat(path)[0])
        except (FileNotFoundError, NotADirectoryError):
            return False

    def getsize(self, path: str) -> int:
        return self._c.stat(path)[5]

    def listdir(self, path: str = "/") -> list[str]:
        """Names in a directory, sorted."""
        return [name for name, _ in self._c.readdir(path)]

    def scandir(self, path: str = "/") -> _ScandirIterator:
        """Entries of a directory with their status (one listing of every
        server; no request per entry)."""
        return _ScandirIterator(
            [DirEntry(self, path, n, st) for n, st in self._c.readdir(path)]
        )

    def walk(
        self,
        top: str = "/",
        topdown: bool = True,
        onerror=None,
        followlinks: bool = False,
    ) -> Iterator[tuple[str, list[str], list[str]]]:
        """``os.walk`` over the pool: ``(dirpath, dirnames, filenames)``.
        For a whole tree at once, :meth:`find` is much faster (it lists
        every server in parallel)."""
        stack: list = [top]
        while stack:
            item = stack.pop()
            if isinstance(item, tuple):  # bottom-up: emit after children
                yield item
                continue
            try:
                entries = list(self.scandir(item))
            except OSError as e:
                if onerror is not None:
                    onerror(e)
                continue
            dirs, files, descend = [], [], []
            for e in entries:
                if e.is_dir():
                    dirs.append(e.name)
                    if followlinks or not e.is_symlink():
                        descend.append(e.name)
                else:
                    files.append(e.name)
            base = item.rstrip("/")
            if topdown:
                yield item, dirs, files
                # The caller may prune dirnames in place.
                descend = [d for d in dirs if d in set(descend)]
                stack.extend(base + "/" + d for d in reversed(descend))
            else:
                stack.append((item, dirs, files))
                stack.extend(base + "/" + d for d in reversed(descend))

    def find(
        self,
        path: str = "/",
        maxdepth: int | None = None,
        *,
        dirs: bool = False,
        threads: int = 0,
    ) -> dict[str, os.stat_result]:
        """Every entry below the directory ``path`` (files; directories
        too with ``dirs``), down to ``maxdepth`` levels, as a dict of full
        path to status in sorted order. Asks every server once (a page at a
        time) for its part of the whole tree and merges the sorted answers;
        with ``maxdepth`` (or servers that do not serve that: older ones,
        cache mode) lists every server's part of each directory in parallel
        (the walk of chfind). Without the GIL.
        Directories that cannot be read raise their error (one removed
        during the walk is skipped)."""
        out = {}
        for p, st in sorted(self._find(path, maxdepth, threads)):
            if dirs or not _stat.S_ISDIR(st[0]):
                out[p] = _stat_result(st)
        return out

    def find_paths(
        self,
        path: str = "/",
        maxdepth: int | None = None,
        *,
        dirs: bool = False,
        threads: int = 0,
    ) -> list[str]:
        """The paths :meth:`find` would return, sorted, without their
        status (the fastest listing of a tree: only names cross into
        Python)."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        paths, errs = self._c.find_paths(path, maxdepth, dirs, threads)
        _raise_walk_errors(errs)
        return paths

    def _find_info(self, path: str, maxdepth: int | None, withdirs: bool) -> dict:
        """fsspec's ``find(detail=True)`` without the directory itself:
        full path to info dict, sorted (see ``chfs.spec``)."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        found, errs = self._c.find_info(path, maxdepth, withdirs)
        _raise_walk_errors(errs)
        return found

    def _find(self, path: str, maxdepth: int | None, threads: int = 0) -> list:
        """``(path, status tuple)`` below ``path``, unsorted (see
        :meth:`find`)."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        entries, errs = self._c.find(path, maxdepth, threads)
        _raise_walk_errors(errs)
        return entries

    def mkdir(self, path: str, mode: int = 0o777) -> None:
        """Creates a directory (``mode`` less the process's umask)."""
        self._c.mkdir(path, mode & ~_umask())

    def makedirs(self, path: str, mode: int = 0o777, exist_ok: bool = False) -> None:
        """Creates a directory and its missing parents; an existing
        directory raises ``FileExistsError`` unless ``exist_ok``."""
        if not exist_ok and self.exists(path):
            raise FileExistsError(_errno.EEXIST, os.strerror(_errno.EEXIST), path)
        self._c.makedirs(path, mode & ~_umask())

    def remove(self, path: str) -> None:
        """Removes a file (``IsADirectoryError`` for a directory)."""
        if _stat.S_ISDIR(self._c.lstat(path)[0]):
            raise IsADirectoryError(_errno.EISDIR, os.strerror(_errno.EISDIR), path)
        self._c.unlink(path)

    unlink = remove

    def rmdir(self, path: str) -> None:
        self._c.rmdir(path)

    def rename(self, src: str, dst: str) -> None:
        """Renames (replacing a file or an empty directory, as POSIX)."""
        self._c.rename(src, dst)

    replace = rename

    def truncate(self, path: str, length: int) -> None:
        self._c.truncate(path, length)

    def chmod(self, path: str, mode: int) -> None:
        self._c.chmod(path, mode)

    def utime(self, path: str, times: tuple[float, float] | None = None, *, ns=None) -> None:
        """Sets access and modification times (now when neither is given)."""
        if ns is None:
            if times is None:
                import time

                now = time.time_ns()
                ns = (now, now)
            else:
                ns = (int(times[0] * 1e9), int(times[1] * 1e9))
        self._c.utime_ns(path, ns[0], ns[1])

    def symlink(self, target: str, path: str) -> None:
        self._c.symlink(target, path)

    def readlink(self, path: str) -> str:
        return self._c.readlink(path)

    # ----- the pool --------------------------------------------------

    def servers(self) -> list[str]:
        """Addresses of the pool's servers."""
        return self._c.servers()

    def statfs(self) -> StatFs:
        return StatFs(*self._c.statfs())

    def stagein(self, path: str) -> int:
        """Cache mode: copies a file or tree into the pool (from the local
        file system, or a pool path from the backend); returns the bytes
        staged."""
        return self._c.stagein(path)

    def sync(self) -> None:
        """Cache mode: writes every dirty chunk back to the backend and
        waits until written."""
        self._c.sync()

    def flush_status(self, path: str = "/") -> FlushStatus:
        """Cache mode: what under ``path`` is not yet written back."""
        return FlushStatus(*self._c.flush_status(path))

    def wait_flushed(self, path: str = "/", timeout: float | None = None) -> None:
        """Cache mode: asks for ``path`` to be written back now and waits
        (``TimeoutError`` after ``timeout`` seconds)."""
        self._c.wait_flushed(path, timeout)
