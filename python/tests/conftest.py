"""A pool of real chfsd servers on loopback for the whole session, started
with chfs-localpool (built by cargo; scripts/test.sh builds it) and
stopped by its recorded PID at the end."""

import os
import pathlib
import stat
import uuid

import pytest
from localpool import LocalPool

REPO = pathlib.Path(__file__).resolve().parents[2]


def tool(name: str) -> str:
    """A chfs-rs program: CHFS_BIN_DIR, else cargo's target directory."""
    dirs = []
    if os.environ.get("CHFS_BIN_DIR"):
        dirs.append(pathlib.Path(os.environ["CHFS_BIN_DIR"]))
    target = pathlib.Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    dirs += [target / "debug", target / "release"]
    for d in dirs:
        if (d / name).is_file():
            return str(d / name)
    raise RuntimeError(f"{name} not found in {dirs}: build it (cargo build) or set CHFS_BIN_DIR")


class Pool(LocalPool):
    def __init__(self, servers: int = 2, extra=()):
        super().__init__(tool("chfs-localpool"), servers, extra)


@pytest.fixture(scope="session")
def pool():
    p = Pool(2)
    saved = {k: os.environ.get(k) for k in p.env}
    os.environ.update(p.env)
    yield p
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    p.stop()


@pytest.fixture(scope="session")
def client(pool):
    import chfs

    return chfs.Client()


@pytest.fixture
def tmp(client):
    """A fresh directory of the pool, removed afterwards."""
    d = f"/pytest-{uuid.uuid4().hex[:12]}"
    client.mkdir(d)
    yield d
    for p in sorted(client.find(d, dirs=True), key=len, reverse=True):
        if stat.S_ISDIR(client.lstat(p).st_mode):
            client.rmdir(p)
        else:
            client.remove(p)
    client.rmdir(d)
