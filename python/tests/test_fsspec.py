"""The fsspec filesystem: fsspec's own abstract test suite, find and glob
against fsspec's generic walk, and a pandas round trip."""

import os
import posixpath

import fsspec
import fsspec.tests.abstract as abstract
import pytest
from fsspec.spec import AbstractFileSystem

from chfs.spec import ChfsFileSystem


class ChfsFixtures(abstract.AbstractFixtures):
    @pytest.fixture
    def fs(self, pool):
        return fsspec.filesystem("chfs")

    @pytest.fixture
    def fs_join(self):
        return posixpath.join

    @pytest.fixture
    def fs_path(self, tmp):
        return tmp


class TestChfsCopy(abstract.AbstractCopyTests, ChfsFixtures):
    pass


class TestChfsGet(abstract.AbstractGetTests, ChfsFixtures):
    pass


class TestChfsPut(abstract.AbstractPutTests, ChfsFixtures):
    pass


class TestChfsOpen(abstract.AbstractOpenTests, ChfsFixtures):
    pass


class TestChfsPipe(abstract.AbstractPipeTests, ChfsFixtures):
    pass


def test_the_protocol_is_registered_by_the_entry_point(pool):
    assert fsspec.get_filesystem_class("chfs") is ChfsFileSystem
    assert ChfsFileSystem._strip_protocol("chfs:///a/b/") == "/a/b"
    assert ChfsFileSystem._strip_protocol("chfs://a//b") == "/a/b"
    assert ChfsFileSystem._strip_protocol("chfs:///") == "/"


@pytest.mark.fabric
def test_open_url_text_and_binary(pool, tmp):
    with fsspec.open(f"chfs://{tmp}/x.txt", "w") as f:
        f.write("hello\n")
    with fsspec.open(f"chfs://{tmp}/x.txt", "rb") as f:
        assert f.read() == b"hello\n"
    of = fsspec.open_files(f"chfs://{tmp}/*.txt")
    assert [o.path for o in of] == [f"{tmp}/x.txt"]


@pytest.mark.fabric
def test_find_and_glob_match_fsspecs_generic_walk(pool, tmp):
    fs = fsspec.filesystem("chfs")
    for d in ("a/b/c", "a/d", "e/f"):
        fs.makedirs(f"{tmp}/{d}")
    for i, f in enumerate(("a/1.csv", "a/b/2.csv", "a/b/c/3.txt", "e/4.csv", "5.csv")):
        fs.pipe_file(f"{tmp}/{f}", b"x" * i)
    for kw in (
        {},
        {"withdirs": True},
        {"maxdepth": 1},
        {"maxdepth": 2, "withdirs": True},
        {"detail": True},
        {"detail": True, "withdirs": True},
        {"detail": True, "maxdepth": 2, "withdirs": True},
    ):
        assert fs.find(tmp, **kw) == AbstractFileSystem.find(fs, tmp, **kw), kw
        if kw.get("detail"):  # the info dicts are made natively: same order
            names = dict(kw, detail=False)
            assert list(fs.find(tmp, **kw)) == fs.find(tmp, **names), kw
    assert fs.find(f"{tmp}/a/1.csv") == [f"{tmp}/a/1.csv"]
    assert fs.find(f"{tmp}/none") == []
    assert fs.glob(f"{tmp}/**/*.csv") == sorted(
        f"{tmp}/{f}" for f in ("a/1.csv", "a/b/2.csv", "e/4.csv", "5.csv")
    )
    assert fs.glob(f"chfs://{tmp}/a/*") == [f"{tmp}/a/1.csv", f"{tmp}/a/b", f"{tmp}/a/d"]
    assert fs.du(tmp) == 0 + 1 + 2 + 3 + 4


@pytest.mark.fabric
def test_mv_renames_a_tree_and_info_ls(pool, tmp):
    fs = fsspec.filesystem("chfs")
    fs.pipe_file(f"{tmp}/src/a/f", b"data")
    fs.mv(f"{tmp}/src", f"{tmp}/dst", recursive=True)
    assert not fs.exists(f"{tmp}/src")
    assert fs.cat_file(f"{tmp}/dst/a/f") == b"data"
    info = fs.info(f"{tmp}/dst/a/f")
    assert info["type"] == "file" and info["size"] == 4 and info["name"] == f"{tmp}/dst/a/f"
    assert fs.ls(f"{tmp}/dst", detail=False) == [f"{tmp}/dst/a"]
    assert fs.modified(f"{tmp}/dst/a/f").year >= 2024
    fs.touch(f"{tmp}/dst/a/f", truncate=False)
    assert fs.cat_file(f"{tmp}/dst/a/f") == b"data"
    assert fs.cat_file(f"{tmp}/dst/a/f", start=1, end=3) == b"at"
    with pytest.raises(FileNotFoundError):
        fs.info(f"{tmp}/nothing")


@pytest.mark.fabric
def test_pandas_round_trip(pool, tmp):
    # scripts/test.sh (which sets CHFS_TEST_REQUIRE) installs pandas:
    # there a missing pandas fails the test instead of skipping it.
    if os.environ.get("CHFS_TEST_REQUIRE"):
        import pandas as pd
    else:
        pd = pytest.importorskip("pandas")
    import numpy as np

    n = 50_000
    df = pd.DataFrame(
        {
            "i": np.arange(n, dtype="int64"),
            "x": np.linspace(0, 1, n),
            "s": [f"row {k} ✓" for k in range(n)],
            "t": pd.date_range("2024-01-01", periods=n, freq="min"),
        }
    )
    url = f"chfs://{tmp}/frame.csv"
    df.to_csv(url, index=False)
    back = pd.read_csv(url, parse_dates=["t"])
    pd.testing.assert_frame_equal(back, df, check_exact=False)
    df.to_json(
        f"chfs://{tmp}/frame.json.gz", orient="records", lines=True, compression="gzip", date_format="iso"
    )
    back = pd.read_json(f"chfs://{tmp}/frame.json.gz", orient="records", lines=True)
    assert back["i"].tolist() == df["i"].tolist() and back["s"].tolist() == df["s"].tolist()
    df.to_pickle(f"chfs://{tmp}/frame.pkl")
    pd.testing.assert_frame_equal(pd.read_pickle(f"chfs://{tmp}/frame.pkl"), df)
