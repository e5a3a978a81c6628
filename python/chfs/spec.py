"""fsspec filesystem for chfs-rs pools, protocol ``chfs``.

Registered through the ``fsspec.specs`` entry point, so once the package is
installed::

    fsspec.open("chfs:///data/x.csv")
    pandas.read_csv("chfs:///data/x.csv")
    fsspec.filesystem("chfs").find("/data")

Paths are the pool's absolute paths (``chfs:///a/b`` and ``/a/b`` name the
same file). ``find`` and ``glob`` ask every server once (a page at a
time) for everything it holds below the path and merge the sorted
answers, instead of listing one directory at a time.
"""

from __future__ import annotations

import datetime
import errno
import os
import stat as _stat

from fsspec.spec import AbstractFileSystem

from ._client import Client


def _info(path: str, st: os.stat_result, target: os.stat_result | None = None) -> dict:
    """fsspec's info dict (the keys LocalFileSystem gives)."""
    link = _stat.S_ISLNK(st.st_mode)
    t = target if (link and target is not None) else st
    if _stat.S_ISDIR(t.st_mode):
        kind = "directory"
    elif _stat.S_ISREG(t.st_mode):
        kind = "file"
    else:
        kind = "other"
    return {
        "name": path,
        "size": t.st_size,
        "type": kind,
        "created": st.st_ctime,
        "islink": link,
        "mode": t.st_mode,
        "uid": st.st_uid,
        "gid": st.st_gid,
        "mtime": t.st_mtime,
        "ino": st.st_ino,
        "nlink": st.st_nlink,
    }


class ChfsFileSystem(AbstractFileSystem):
    """A chfs-rs pool as an fsspec filesystem.

    ``servers`` (``"host:port,..."`` or a list) replaces ``CHFS_SERVER``;
    the other settings, the pool's key included, come from the environment
    (``CHFS_SECRET_FILE``). ``client`` uses an existing :class:`chfs.Client`.
    ``auto_mkdir`` (default True, as object stores behave): opening a file
    for writing, touching or copying one creates its missing parent
    directories.
    """

    protocol = "chfs"
    root_marker = "/"

    def __init__(
        self, servers=None, client: Client | None = None, auto_mkdir: bool = True, **kwargs
    ):
        super().__init__(servers=servers, auto_mkdir=auto_mkdir, **kwargs)
        self.client = client if client is not None else Client(servers)
        self.auto_mkdir = auto_mkdir

    def _parents(self, path: str) -> None:
        parent = path.rsplit("/", 1)[0]
        if self.auto_mkdir and parent:
            self.client.makedirs(parent, exist_ok=True)

    # ----- paths -----------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = os.fspath(path)
        if path.startswith("chfs://"):
            path = path[len("chfs://") :]
        elif path.startswith("chfs:"):
            path = path[len("chfs:") :]
        path = "/" + path.lstrip("/")
        while "//" in path:
            path = path.replace("//", "/")
        if len(path) > 1:
            path = path.rstrip("/")
        return path

    def unstrip_protocol(self, name: str) -> str:
        return "chfs://" + self._strip_protocol(name)

    # ----- listing ---------------------------------------------------

    def info(self, path, **kwargs):
        path = self._strip_protocol(path)
        st = self.client.lstat(path)
        target = None
        if _stat.S_ISLNK(st.st_mode):
            try:
                target = self.client.stat(path)
            except OSError:
                target = None
        return _info(path, st, target)

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        st = self.client.stat(path)
        if not _stat.S_ISDIR(st.st_mode):
            entries = [self.info(path)]
        else:
            entries = []
            for e in self.client.scandir(path):
                target = e.stat() if e.is_symlink() and e.is_dir() else None
                entries.append(_info(e.path, e.stat(follow_symlinks=False), target))
        if detail:
            return entries
        return [e["name"] for e in entries]

    def find(self, path, maxdepth=None, withdirs=False, detail=False, **kwargs):
        """Everything below ``path``: each server is asked for its part of
        the whole tree (with ``maxdepth``, of each directory, in parallel),
        not one ``ls`` per directory."""
        path = self._strip_protocol(path)
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        try:
            st = self.client.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return {} if detail else []
        if not _stat.S_ISDIR(st.st_mode):
            return {path: self.info(path)} if detail else [path]
        if not detail:  # only names cross into Python, sorted natively
            paths = self.client.find_paths(path, maxdepth, dirs=withdirs)
            if withdirs:  # fsspec lists the directory itself
                paths.insert(0, path)  # every other path sorts after it
            return paths
        # The info dicts are made natively, in sorted order (no status
        # tuple or os.stat_result per entry).
        found = self.client._find_info(path, maxdepth, withdirs)
        if not withdirs:
            return found
        out = {path: _info(path, st)}  # fsspec lists the directory itself
        out.update(found)  # every other path sorts after it
        return out

    def exists(self, path, **kwargs):
        return self.client.exists(self._strip_protocol(path))

    def isdir(self, path):
        return self.client.isdir(self._strip_protocol(path))

    def isfile(self, path):
        return self.client.isfile(self._strip_protocol(path))

    def created(self, path):
        st = self.client.stat(self._strip_protocol(path))
        return datetime.datetime.fromtimestamp(st.st_ctime, tz=datetime.timezone.utc)

    def modified(self, path):
        st = self.client.stat(self._strip_protocol(path))
        return datetime.datetime.fromtimestamp(st.st_mtime, tz=datetime.timezone.utc)

    # ----- changing the namespace ------------------------------------

    def mkdir(self, path, create_parents=True, **kwargs):
        path = self._strip_protocol(path)
        if self.client.exists(path):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path)
        if create_parents:
            self.client.makedirs(path, exist_ok=True)
        else:
            self.client.mkdir(path)

    def makedirs(self, path, exist_ok=False):
        self.client.makedirs(self._strip_protocol(path), exist_ok=exist_ok)

    def rmdir(self, path):
        self.client.rmdir(self._strip_protocol(path))

    def _rm(self, path):
        path = self._strip_protocol(path)
        if _stat.S_ISDIR(self.client.lstat(path).st_mode):
            self.client.rmdir(path)
        else:
            self.client.remove(path)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """A rename when moving one existing path (a whole tree at once);
        fsspec's copy-and-delete otherwise (lists, globs)."""
        if (
            isinstance(path1, str)
            and isinstance(path2, str)
            and not any(c in path1 for c in "*?[")
        ):
            p1, p2 = self._strip_protocol(path1), self._strip_protocol(path2)
            try:
                st = self.client.lstat(p1)
            except FileNotFoundError:
                st = None
            if st is not None and (recursive or not _stat.S_ISDIR(st.st_mode)):
                if self.client.isdir(p2):
                    p2 = p2.rstrip("/") + "/" + p1.rsplit("/", 1)[-1]
                self.client.rename(p1, p2)
                return
        super().mv(path1, path2, recursive=recursive, maxdepth=maxdepth, **kwargs)

    def cp_file(self, path1, path2, **kwargs):
        path1 = self._strip_protocol(path1)
        path2 = self._strip_protocol(path2)
        if self.client.isdir(path1):
            self.client.makedirs(path2, exist_ok=True)
            return
        self._parents(path2)
        with self.client.open(path1, "rb", buffering=0) as src, self.client.open(
            path2, "wb", buffering=0
        ) as dst:
            buf = bytearray(4 << 20)
            view = memoryview(buf)
            while True:
                n = src.readinto(view)
                if not n:
                    break
                done = 0
                while done < n:
                    done += dst.write(view[done:n])

    def touch(self, path, truncate=True, **kwargs):
        path = self._strip_protocol(path)
        if truncate or not self.client.exists(path):
            self._parents(path)
            with self.client.open(path, "wb"):
                pass
        else:
            self.client.utime(path)

    # ----- files -----------------------------------------------------

    def _open(
        self,
        path,
        mode="rb",
        block_size=None,
        autocommit=True,
        cache_options=None,
        **kwargs,
    ):
        path = self._strip_protocol(path)
        if not autocommit:
            raise NotImplementedError("chfs: transactions (autocommit=False)")
        buffering = -1 if block_size in (None, "default") else int(block_size)
        if any(c in mode for c in "wxa"):
            self._parents(path)
        return self.client.open(path, mode, buffering=buffering)
