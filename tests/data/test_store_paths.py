"""Store and shard paths that cannot be a store or a shard (a FIFO, a device, a dangling link, a blank
$ZMLX_PIPELINE_DB, a name that is not UTF-8 in this locale): one line naming the path and the fix, exit 1, nothing
written, and never a hang or DuckDB's raw text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.data.shards import BadShard, ingest_shards, query_shards
from zmlx_pipeline.data.store import Store, StoreError, default_db_path
from zmlx_pipeline.pipeline.cli import cli

NOT_UTF8 = os.fsdecode(b"x\xff")  # what Python makes of such a name under LC_ALL=C: a surrogate escape


def one_line(args: list, says: str, env: dict | None = None) -> str:
    result = CliRunner().invoke(cli, [str(a) for a in args], env=env)
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and result.output.count("\n") == 1, result.output
    assert result.output.startswith("Error: ") and says in result.output, result.output
    return result.output


@pytest.fixture
def shard(tmp_path, make_measurement) -> Path:
    with Store(tmp_path / "source.duckdb") as source:
        source.record([make_measurement(kernel="my_norm")])
        source.export_shard(tmp_path / "shard.parquet")
    return tmp_path / "shard.parquet"


def listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


# -- B1: a FIFO (or a device) as the store: refused before DuckDB opens it, never a hang --------------------------------


@pytest.mark.parametrize("command", [("summary",), ("export", "out.parquet"), ("ingest", "SHARD"), ("import", "FILE"),
                                     ("noise",)])
def test_a_fifo_as_the_store_is_refused_in_one_line_by_every_store_command(command, tmp_path, shard, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "ff")
    cache = tmp_path / "vec" / "a.json"
    cache.parent.mkdir()
    cache.write_text('{"device_name": "NVIDIA RTX A4000", "kernel_name": "k", "tune_params_keys": ["bx"], '
                     '"tune_params": {"bx": [1]}, "objective": "time", "cache": {"1": {"bx": 1, "time": 1.0}}}')
    args = [a.replace("SHARD", str(shard)).replace("FILE", str(cache)) for a in command]
    says = f"store path {tmp_path / 'ff'} is a FIFO (named pipe), not a store file"
    before = listing(tmp_path)
    one_line([args[0], "--db", tmp_path / "ff", *args[1:]], says)
    one_line(args, says.replace(str(tmp_path / "ff"), "ff"), env={"ZMLX_PIPELINE_DB": "ff"})
    assert listing(tmp_path) == before


def test_a_device_as_the_store_is_refused_for_reading_and_writing(tmp_path, shard):
    with pytest.raises(StoreError, match=r"^store path /dev/null is a character device, not a store file"):
        Store("/dev/null", read_only=True)
    one_line(["ingest", "--db", "/dev/null", shard], "store path /dev/null is a character device, not a store file")
    one_line(["summary", "--db", "/dev/null"], "store path /dev/null is a character device, not a store file")


# -- F4: a dangling link and a blank $ZMLX_PIPELINE_DB ----------------------------------------------------------------


def test_a_link_to_a_store_in_a_missing_folder_is_one_clear_line_for_every_command(tmp_path, shard):
    link = tmp_path / "link.duckdb"
    link.symlink_to(tmp_path / "gone" / "store.duckdb")
    says = f"cannot create the store at {link}: it is a symlink to {tmp_path / 'gone' / 'store.duckdb'}, whose folder " \
           "does not exist; create that folder, point the link at a store file, or pass another --db"
    one_line(["ingest", "--db", link, shard], says)
    one_line(["summary", "--db", link], f"no store at {link} (a symlink to {tmp_path / 'gone' / 'store.duckdb'}, which "
                                        "does not exist)")
    assert not (tmp_path / "gone").exists() and link.is_symlink()


@pytest.mark.parametrize("blank", [" ", "\t  "])
def test_a_blank_store_variable_is_refused_as_a_blank_db_option_is(blank, tmp_path, shard, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ZMLX_PIPELINE_DB", blank)
    before = listing(tmp_path)
    says = f"$ZMLX_PIPELINE_DB is {blank!r}, white space only: set it to a path, or unset it for the default store"
    for open_default in (default_db_path, Store):
        with pytest.raises(StoreError) as info:
            open_default()
        assert str(info.value) == says
    for args in (["summary"], ["ingest", shard]):
        one_line(args, says)
    assert listing(tmp_path) == before


# -- A2: a path DuckDB cannot be given (not UTF-8 in this locale) ------------------------------------------------------


def test_a_store_path_that_is_not_utf8_is_refused_naming_it_and_the_fix(tmp_path):
    path = tmp_path / f"{NOT_UTF8}.duckdb"
    for read_only in (False, True):
        with pytest.raises(StoreError) as info:
            Store(path, read_only=read_only)
        assert str(info.value) == (
            f"store path {tmp_path}/x\\xff.duckdb cannot be encoded as UTF-8 in this locale: run with PYTHONUTF8=1 (or "
            "a UTF-8 locale such as LC_ALL=C.UTF-8), or use a path of plain ASCII characters; nothing was written")
    assert not os.path.lexists(path)


def test_a_shard_path_that_is_not_utf8_is_refused_naming_it_and_the_fix(tmp_path, shard, store):
    named = tmp_path / f"{NOT_UTF8}.parquet"
    named.write_bytes(shard.read_bytes())
    for ingest in (ingest_shards, Store.ingest_shards):  # the entry point and the store's own check
        with pytest.raises(BadShard) as info:
            ingest(store, [named])
        assert str(info.value) == (
            f"shard {tmp_path}/x\\xff.parquet cannot be encoded as UTF-8 in this locale: run with PYTHONUTF8=1 (or a "
            "UTF-8 locale such as LC_ALL=C.UTF-8), or use a path of plain ASCII characters; nothing was ingested, the "
            "store is unchanged")
    assert store.measurements() == []
    with Store(tmp_path / "source.duckdb", read_only=True) as source:
        with pytest.raises(StoreError, match=r"^cannot export: shard path .*/x\\xff-out\.parquet cannot be encoded "
                                             r"as UTF-8 in this locale: .*; nothing was written$"):
            source.export_shard(tmp_path / f"{NOT_UTF8}-out.parquet")
    assert not [p for p in tmp_path.iterdir() if "out" in os.fsencode(p.name).decode("utf-8", "replace")]


# -- a URL as the store: refused before DuckDB (which would fetch it through an extension it downloads) -----------------

@pytest.mark.parametrize("url, scheme", [("s3://bucket/x.duckdb", "s3"), ("http://127.0.0.1:1/x.duckdb", "http"),
                                         ("file:///tmp/x.duckdb", "file")])
def test_a_store_path_that_is_a_url_is_refused_as_not_a_local_file(tmp_path, monkeypatch, shard, url, scheme):
    monkeypatch.chdir(tmp_path)
    before = listing(tmp_path)
    says = f"path {url!r} is a URL ({scheme}:), not a local path: download or mount it and give its local path"
    result = CliRunner().invoke(cli, ["ingest", "--db", url, str(shard)])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: Invalid value for '--db': {says} (")
    for args in (["summary"], ["ingest", shard]):
        assert one_line(args, says, env={"ZMLX_PIPELINE_DB": url}) == f"Error: $ZMLX_PIPELINE_DB: {says}\n"
    with pytest.raises(StoreError, match=r"is a URL \(s3:\)"):
        Store("s3://bucket/x.duckdb", read_only=True)
    assert listing(tmp_path) == before


@pytest.mark.parametrize("url", ["s3://bucket/x.duckdb", "HTTP+unix://sock/x.duckdb", "hf://org/x.duckdb"])
def test_a_store_path_that_went_through_path_is_told_a_url_as_core_files_tells_it(tmp_path, monkeypatch, url):
    """A library caller's Path(url) arrives folded (s3:/bucket): the store reads it as core.files.url_scheme does."""
    from zmlx_pipeline.core.files import url_scheme

    monkeypatch.chdir(tmp_path)
    before = listing(tmp_path)
    folded = Path(url)
    assert "://" not in str(folded) and url_scheme(str(folded)) is None
    scheme = url_scheme(str(folded), in_path=True)
    assert scheme == url_scheme(url) == url.split("://")[0]
    for read_only in (True, False):
        with pytest.raises(StoreError) as err:
            Store(folded, read_only=read_only)
        assert str(err.value).startswith(f"store path {folded} is a URL ({scheme}:), not a file")
    assert listing(tmp_path) == before


@pytest.mark.parametrize("args", [["export", "{db}", "s3://bucket/out.parquet"], ["report", "{db}", "--out", "s3://b/r"],
                                  ["publish", "{db}", "--to", "s3://b/pub"], ["import", "s3://b/k.json"],
                                  ["train", "{db}", "--models-dir", "hf://org/models"]])
def test_an_output_or_input_path_that_is_a_url_is_refused_as_typed_and_nothing_is_made(tmp_path, monkeypatch, shard,
                                                                                       args):
    """As a Path, s3://bucket/out.parquet is the local s3:/bucket/out.parquet: export and report wrote there."""
    with Store(tmp_path / "s.duckdb") as store:
        store.ingest_shards([shard])
    monkeypatch.chdir(tmp_path)
    before = listing(tmp_path)
    args = [a for arg in args for a in (["--db", str(tmp_path / "s.duckdb")] if arg == "{db}" else [arg])]
    url = next(a for a in args if "://" in a)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"path {url!r} is a URL ({url.split(':')[0]}:), not a local path" in result.output
    assert listing(tmp_path) == before and not (tmp_path / f"{url.split(':')[0]}:").exists()


@pytest.mark.parametrize("name", ["x\\y.duckdb", "C:\\Users\\x\\store.duckdb", "a\\.duckdb"])
def test_a_store_path_with_a_backslash_is_refused_as_duckdb_would_open_another_file(tmp_path, monkeypatch, shard,
                                                                                      name):
    """DuckDB turns x\\y.duckdb into x/y.duckdb: ingest would write one file and every later command look at another."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x").mkdir()
    before = listing(tmp_path)
    says = "holds a backslash, which DuckDB reads as a folder separator: write the path with / (or name the file"
    for args, env in ((["ingest", "--db", name, shard], None), (["summary"], {"ZMLX_PIPELINE_DB": name})):
        assert one_line(args, says, env=env).startswith(f"Error: store path {name} ")
    with pytest.raises(StoreError, match="holds a backslash"):
        Store(name)
    assert listing(tmp_path) == before


@pytest.mark.parametrize("name", ["md:x.duckdb", "abc:x.duckdb", ":memory:", "C:/x.duckdb", "C://y.duckdb",
                                  "dir:a/s.duckdb"])
def test_a_store_path_with_a_colon_that_is_no_url_is_a_local_file(tmp_path, monkeypatch, shard, name):
    """DuckDB reads `name:` as a database type (md: would download MotherDuck's extension) and :memory: as no file;
    the store is the local file so named."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["ingest", "--db", name, str(shard)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / name).is_file()
    with Store(name, read_only=True) as s:
        assert len(s.measurements()) == 1


# -- a shard whose name holds a glob character: that one file, never another its name matches as a pattern -------------

@pytest.mark.parametrize("name, decoy", [("h200[1].parquet", "h2001.parquet"), ("a*b.parquet", "axb.parquet"),
                                         ("q?.parquet", "qq.parquet"), ("c{1,2}.parquet", "c1.parquet")])
def test_a_shard_named_with_glob_characters_is_read_as_that_one_file(tmp_path, make_measurement, name, decoy):
    """DuckDB's read_parquet takes [ ] * ? { } as a pattern: `h200[1].parquet` would store `h2001.parquet`'s rows."""
    folder = tmp_path / "shards"
    folder.mkdir()
    for file, kernel, n in ((name, "wanted", 3), (decoy, "decoy", 2)):
        with Store(tmp_path / f"{kernel}.duckdb") as source:
            source.record([make_measurement(kernel=kernel, shape={"rows": 64 * (i + 1), "cols": 4096})
                           for i in range(n)])
            source.export_shard(folder / file)
    with Store(tmp_path / "store.duckdb") as store:
        ingest_shards(store, [folder / name])
        assert sorted(m["kernel"] for m in store.measurements()) == ["wanted"] * 3
    assert [r["kernel"] for r in query_shards(folder / name)] == ["wanted"]  # one file, read in place


def test_a_shard_folder_named_with_glob_characters_is_read_alone(tmp_path, make_measurement):
    for folder, kernel in (("run[1]", "wanted"), ("run1", "decoy")):
        (tmp_path / folder).mkdir()
        with Store(tmp_path / f"{kernel}.duckdb") as source:
            source.record([make_measurement(kernel=kernel)])
            source.export_shard(tmp_path / folder / "s.parquet")
    assert [r["kernel"] for r in query_shards(tmp_path / "run[1]")] == ["wanted"]
