"""chfs: Python client of chfs-rs, the ad hoc parallel caching file system.

>>> import chfs
>>> c = chfs.Client()                      # CHFS_SERVER, CHFS_SECRET_FILE
>>> with c.open("/data/x.csv", "w") as f:  # io objects, as the built-in open
...     f.write("a,b\\n1,2\\n")
>>> c.listdir("/data"), c.stat("/data/x.csv").st_size
>>> c.find("/data")                        # parallel listing of every server

and ``fsspec.open("chfs:///data/x.csv")``, ``pandas.read_csv("chfs:///...")``
through the fsspec filesystem :class:`chfs.spec.ChfsFileSystem`.

Errors are ``OSError`` subclasses with the errno the pool reported
(``FileNotFoundError``, ``FileExistsError``, ``IsADirectoryError``, ...).
"""

from ._chfs import __version__
from ._client import (
    DEFAULT_BUFFER_SIZE,
    Client,
    DirEntry,
    FlushStatus,
    RawFile,
    StatFs,
)

__all__ = [
    "Client",
    "DirEntry",
    "FlushStatus",
    "RawFile",
    "StatFs",
    "DEFAULT_BUFFER_SIZE",
    "__version__",
]
