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
    def __init__(self, servers: int = 2, extra=(), protocol: str = "tcp"):
        if protocol != "tcp":
            extra = ["--chfsd-arg=-p", f"--chfsd-arg={protocol}", *extra]
        super().__init__(tool("chfs-localpool"), servers, extra)


# The transport of the libfabric tests (chfsd -p, doc/fabric.md).
FABRIC = "ofi+tcp"


def required(cap: str) -> bool:
    """Is capability `cap` required of this machine (CHFS_TEST_REQUIRE, as
    chfs_localpool::required): then a test needing it fails rather than
    skips."""
    caps = [c.strip() for c in os.environ.get("CHFS_TEST_REQUIRE", "").split(",")]
    return cap in caps or "all" in caps


def pytest_configure(config):
    config.addinivalue_line(
        "markers", f"fabric: run against a pool over {FABRIC} too (chfsd -p {FABRIC})"
    )


def pytest_generate_tests(metafunc):
    """Every test of the pool runs over TCP; those marked `fabric` over
    ofi+tcp too (the pool's `protocol`, one pool per protocol)."""
    if "pool" in metafunc.fixturenames:
        protocols = ["tcp"]
        if metafunc.definition.get_closest_marker("fabric"):
            protocols.append(FABRIC)
        metafunc.parametrize("protocol", protocols, scope="session")


@pytest.fixture(scope="session")
def pool(protocol):
    try:
        p = Pool(2, protocol=protocol)
    except RuntimeError:
        if protocol == "tcp" or required("fabric"):
            raise
        pytest.skip(f"no pool over {protocol} (chfsd built without libfabric?)")
    if protocol != "tcp":
        assert p.env["CHFS_SERVER"].startswith(f"{protocol}://"), p.env
    saved = {k: os.environ.get(k) for k in p.env}
    os.environ.update(p.env)
    # fsspec keeps its filesystems (and their clients) by arguments: the
    # next pool's must be new ones.
    from chfs.spec import ChfsFileSystem

    ChfsFileSystem.clear_instance_cache()
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
