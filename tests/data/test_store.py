"""The DuckDB store: migrations, refusals, locking, atomic batches, reads and the summary."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from zmlx_pipeline.data import store as store_mod
from zmlx_pipeline.data.records import STATUSES
from zmlx_pipeline.data.store import (
    SCHEMA_VERSION,
    CorruptStore,
    SchemaTooNew,
    Store,
    StoreError,
    StoreLocked,
    default_db_path,
)

DEVICE = "apple-m3-max-40"


def table_names(path: Path) -> set[str]:
    """Tables in a closed store file, read without going through Store."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        return {row[0] for row in con.execute("SHOW TABLES").fetchall()}
    finally:
        con.close()


def dir_snapshot(directory: Path) -> dict[str, bytes]:
    """Every file in a directory with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


# -- where the store lives ---------------------------------------------------------------------


def test_default_db_path_uses_env(tmp_path):
    assert default_db_path() == tmp_path / "store.duckdb"


def test_default_db_path_falls_back_to_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.delenv("ZMLX_PIPELINE_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_db_path() == tmp_path / "xdg" / "zmlx-pipeline" / "store.duckdb"
    monkeypatch.delenv("XDG_DATA_HOME")
    assert default_db_path() == Path.home() / ".local" / "share" / "zmlx-pipeline" / "store.duckdb"
    assert str(Path.home()).startswith(str(tmp_path))


def test_store_without_path_opens_default(tmp_path):
    with Store() as s:
        assert s.path == tmp_path / "store.duckdb"
    assert (tmp_path / "store.duckdb").is_file()


# -- migrations --------------------------------------------------------------------------------


def test_fresh_store_records_every_migration(tmp_path):
    path = tmp_path / "s.duckdb"
    with Store(path) as s:
        applied = s.migrations()
        assert [(m["version"], m["name"]) for m in applied] == [(1, "initial"), (2, "models_and_bundles"),
                                                                 (3, "heldout_cases")]
        assert all(m["applied_at"] is not None for m in applied)
        assert s.schema_version == SCHEMA_VERSION == 3
    assert table_names(path) == {
        "_migrations", "devices", "runs", "measurements", "repeats", "models", "bundles", "heldout_cases",
    }


def test_migration_versions_and_names_are_unique_and_ordered():
    versions = [m[0] for m in store_mod.MIGRATIONS]
    names = [m[1] for m in store_mod.MIGRATIONS]
    assert versions == sorted(versions) == list(range(1, len(versions) + 1))
    assert len(set(names)) == len(names)


def test_old_store_migrates_forward_once(tmp_path, monkeypatch):
    path = tmp_path / "s.duckdb"
    monkeypatch.setattr(store_mod, "MIGRATIONS", store_mod.MIGRATIONS[:1])
    with Store(path) as s:
        assert s.schema_version == 1
        first = s.migrations()
    assert "models" not in table_names(path)
    monkeypatch.undo()

    with pytest.raises(StoreError, match="open it writable once"):
        Store(path, read_only=True)

    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
        applied = s.migrations()
    assert applied[0] == first[0]
    assert [m["version"] for m in applied] == list(range(1, SCHEMA_VERSION + 1))
    assert {"models", "bundles", "heldout_cases"} <= table_names(path)
    with Store(path, read_only=True) as s:
        assert s.schema_version == SCHEMA_VERSION


def test_failed_migration_rolls_back_with_its_bookkeeping(tmp_path, monkeypatch):
    path = tmp_path / "s.duckdb"
    Store(path).close()
    broken = (SCHEMA_VERSION + 1, "broken", "CREATE TABLE half_done (x INTEGER); SELECT * FROM no_such_table;")
    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, broken])
    with pytest.raises(StoreError, match=rf"migration {SCHEMA_VERSION + 1} \(broken\) failed .* stays at schema "
                                         rf"version {SCHEMA_VERSION}"):
        Store(path)
    monkeypatch.undo()
    assert "half_done" not in table_names(path)
    with Store(path) as s:
        assert [m["version"] for m in s.migrations()] == list(range(1, SCHEMA_VERSION + 1))


def test_store_from_newer_schema_is_refused_and_untouched(tmp_path, monkeypatch):
    path = tmp_path / "s.duckdb"
    future = (SCHEMA_VERSION + 1, "from_the_future", "CREATE TABLE future_things (x INTEGER);")
    monkeypatch.setattr(store_mod, "MIGRATIONS", [*store_mod.MIGRATIONS, future])
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION + 1
    monkeypatch.undo()
    before = dir_snapshot(tmp_path)

    for read_only in (False, True):
        with pytest.raises(SchemaTooNew) as err:
            Store(path, read_only=read_only)
        assert str(err.value) == (
            f"store {path} was written by schema version {SCHEMA_VERSION + 1}, newer than this zmlx-pipeline "
            f"({SCHEMA_VERSION}): "
            "upgrade zmlx-pipeline or use another --db"
        )
        assert dir_snapshot(tmp_path) == before


def test_garbage_file_is_corrupt_store_and_untouched(tmp_path):
    path = tmp_path / "s.duckdb"
    path.write_bytes(os.urandom(64 * 1024))
    before = path.read_bytes()
    for read_only in (False, True):
        with pytest.raises(CorruptStore) as err:
            Store(path, read_only=read_only)
        assert str(err.value) == f"{path} is not a DuckDB database: move it aside or use another --db"
    assert path.read_bytes() == before


def test_foreign_duckdb_file_is_refused(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.values([1, "x"]).create("not_ours")
    con.close()
    with pytest.raises(StoreError, match="is a DuckDB database but not a zmlx-pipeline store"):
        Store(path)
    assert table_names(path) == {"not_ours"}


def _filled_store(path: Path, make_measurement) -> Path:
    """A closed store of many blocks (a table of filler beside a few measurements)."""
    with Store(path) as s:
        s.record([make_measurement(shape={"rows": r, "cols": 4096}) for r in range(1, 50)])
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE filler AS SELECT range AS i, md5(range::VARCHAR) AS s FROM range(400000)")
    con.close()
    return path


@pytest.mark.parametrize("keep", [0.5, 0.97, -100])
def test_a_store_cut_short_is_refused_on_open_and_left_as_it_was(tmp_path, make_measurement, keep):
    whole = _filled_store(tmp_path / "whole.duckdb", make_measurement).read_bytes()
    path = tmp_path / "cut.duckdb"
    path.write_bytes(whole[:int(len(whole) * keep)] if keep > 0 else whole[:keep])
    before = path.read_bytes()
    for flags in ({}, {"read_only": True}, {"create": False}):
        with pytest.raises(CorruptStore) as err:
            Store(path, **flags)
        message = str(err.value)
        assert message.startswith(f"store {path} is damaged (") and "\n" not in message
        assert message.endswith("restore it from a copy or pass another --db")
    assert path.read_bytes() == before


def test_a_store_whose_free_blocks_duckdb_cut_off_still_opens(tmp_path, make_measurement):
    """DuckDB shortens its file by the free blocks at its end while its header still counts them: not damage."""
    path = _filled_store(tmp_path / "s.duckdb", make_measurement)
    con = duckdb.connect(str(path))
    con.execute("DELETE FROM filler")
    con.close()
    con = duckdb.connect(str(path), read_only=True)
    block_size, blocks = con.execute("SELECT block_size, total_blocks FROM pragma_database_size()").fetchone()
    con.close()
    assert path.stat().st_size < 3 * 4096 + blocks * block_size  # what the open check must tell from a cut
    with Store(path, read_only=True) as s:
        assert len(s.measurements()) == 49


CHILD_CAPPED_INGEST = textwrap.dedent(
    """
    import resource, signal, sys
    from zmlx_pipeline.pipeline.cli import main
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the cap fails (EFBIG), as on a full disk
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
    sys.argv[1:] = ["ingest", "--db", sys.argv[2], sys.argv[3]]
    main()
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs a file-size limit (RLIMIT_FSIZE)")
def test_a_checkpoint_the_disk_refused_keeps_the_rows_and_is_said(tmp_path, make_measurement, subprocess_env):
    """The WAL is written but the checkpoint's first new block is not: the file ends inside a block while its header
    still names the old ones, and the log beside it holds the commit. Every command reads all of it, the command
    that wrote says so in one warning line, and the next writer moves the log in."""
    path = tmp_path / "s.duckdb"
    with Store(path) as s:
        s.record([make_measurement(shape={"rows": r, "cols": 4096}) for r in range(1, 50)])
    size = path.stat().st_size
    shard = Path(__file__).resolve().parents[2] / "data" / "nvidia-h100-sxm-32sm.parquet"
    out = subprocess.run([sys.executable, "-c", CHILD_CAPPED_INGEST, str(size + 100_000), str(path), str(shard)],
                         env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    warning = [line for line in out.stderr.splitlines() if line.startswith("Warning:")]
    assert len(warning) == 1 and warning[0].startswith(
        f"Warning: store {path}: its changes are kept in its write-ahead log {path}.wal but could not be written "
        "into the store file ("), out.stderr
    assert (path.stat().st_size - 3 * 4096) % (256 * 1024) and Path(f"{path}.wal").stat().st_size > 0
    for flags in ({"read_only": True}, {}):
        with Store(path, **flags) as s:
            assert len(s.measurements()) == 49 + 2081
    assert not Path(f"{path}.wal").exists() and (path.stat().st_size - 3 * 4096) % (256 * 1024) == 0
    with Store(path, read_only=True) as s:
        assert len(s.measurements()) == 49 + 2081


def test_a_store_cut_inside_its_blocks_is_damage_even_beside_a_write_ahead_log(tmp_path, make_measurement):
    source = _filled_store(tmp_path / "whole.duckdb", make_measurement)
    con = duckdb.connect(str(source))
    con.execute("PRAGMA disable_checkpoint_on_shutdown")
    con.execute("INSERT INTO filler SELECT range AS i, 'x' AS s FROM range(10)")
    con.close()
    whole = source.read_bytes()
    path = tmp_path / "cut.duckdb"
    path.write_bytes(whole[:len(whole) // 2])
    Path(f"{path}.wal").write_bytes(Path(f"{source}.wal").read_bytes())
    with pytest.raises(CorruptStore, match="is damaged .*restore it from a copy or pass another --db$"):
        Store(path, read_only=True)
    assert path.read_bytes() == whole[:len(whole) // 2]


def test_only_an_unreadable_store_file_is_damage(tmp_path):
    path = tmp_path / "s.duckdb"
    path.write_bytes(b"")
    cut = duckdb.IOException(f'IO Error: Could not read enough bytes from file "{path}": attempted to read 8 bytes')
    assert isinstance(store_mod.damaged(path, cut), CorruptStore)
    checksum = duckdb.Error("Corrupt database file: computed checksum 1 does not match stored checksum 2 in block")
    assert "is damaged (Corrupt database file" in str(store_mod.damaged(path, checksum))
    other_file = duckdb.IOException('IO Error: Could not read enough bytes from file "/elsewhere/shard.parquet"')
    full_disk = duckdb.IOException(f'IO Error: Could not write file "{path}": No space left on device')
    for err in (other_file, full_disk, duckdb.InterruptException("INTERRUPT Error: Interrupted!"), OSError("x")):
        assert store_mod.damaged(path, err) is None


def test_a_store_path_that_cannot_be_a_store_file_says_what_it_is(tmp_path):
    (tmp_path / "dir").mkdir()
    with pytest.raises(StoreError, match=r"store path .*dir is a directory, not a store file: pass a file in it "
                                         r"\(e\.g\. .*dir/store\.duckdb\)"):
        Store(tmp_path / "dir")
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    for flags in ({}, {"read_only": True}):
        with pytest.raises(StoreError, match="loop_a is a symlink loop: point the link at a store file"):
            Store(tmp_path / "loop_a", **flags)
    (tmp_path / "dangling").symlink_to(tmp_path / "not_yet.duckdb")
    with pytest.raises(StoreError, match=r"no store at .*dangling \(a symlink to .*not_yet\.duckdb, which does not "
                                         r"exist\)"):
        Store(tmp_path / "dangling", read_only=True)
    Store(tmp_path / "dangling").close()  # opened writable, the link's target becomes the store
    assert (tmp_path / "not_yet.duckdb").is_file()


@pytest.mark.parametrize("flags", [{"read_only": True}, {"create": False}])
def test_open_of_missing_store_without_create_creates_nothing(tmp_path, flags):
    path = tmp_path / "nowhere" / "s.duckdb"
    with pytest.raises(StoreError, match="no store at"):
        Store(path, **flags)
    assert not path.parent.exists()


def test_writable_open_creates_parent_directories(tmp_path):
    path = tmp_path / "a" / "b" / "s.duckdb"
    with Store(path) as s:
        assert s.schema_version == SCHEMA_VERSION
    assert path.is_file()


# -- connections and locking -------------------------------------------------------------------

CHILD_OPEN = textwrap.dedent(
    """
    import sys
    from zmlx_pipeline.data.store import Store, StoreError
    try:
        Store(sys.argv[1], read_only=sys.argv[2] == "ro").close()
    except StoreError as err:
        print(type(err).__name__, err)
    else:
        print("opened")
    """
)


def test_second_process_is_refused_with_store_locked(tmp_path, subprocess_env):
    path = tmp_path / "s.duckdb"
    with Store(path):
        for mode in ("rw", "ro"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD_OPEN, str(path), mode],
                env=subprocess_env, capture_output=True, text=True, timeout=60,
            )
            assert out.returncode == 0, out.stderr
            assert out.stdout.startswith(f"{StoreLocked.__name__} store {path} is locked by another process (PID {os.getpid()})")
            assert out.stdout.rstrip().endswith("wait for it to finish or use another --db")
    out = subprocess.run(
        [sys.executable, "-c", CHILD_OPEN, str(path), "rw"],
        env=subprocess_env, capture_output=True, text=True, timeout=60,
    )
    assert out.stdout.strip() == "opened"


def test_read_only_store_in_same_process_shares_and_refuses_writes(store, make_measurement):
    store.record([make_measurement()])
    with Store(store.path, read_only=True) as ro:
        assert len(ro.measurements()) == 1
        with pytest.raises(StoreError, match="open read-only"):
            ro.record([make_measurement(dtype="float32")])
        with pytest.raises(StoreError, match="open read-only"):
            ro.upsert_device({"device_id": "x"})
    store.record([make_measurement(dtype="float32")])
    assert len(store.measurements()) == 2


def test_closed_store_raises_and_close_is_idempotent(tmp_path):
    s = Store(tmp_path / "s.duckdb")
    s.close()
    s.close()
    with pytest.raises(StoreError, match="is closed"):
        s.summary()


# -- devices and runs --------------------------------------------------------------------------


def test_upsert_device_ignores_unknown_keys_and_keeps_unset_columns(store):
    store.upsert_device({"device_id": DEVICE, "name": "Apple M3 Max", "gpu_cores": 40,
                         "memory_bandwidth_gbps": 400.0, "in_catalog": True,
                         "reported": {"device_name": "Apple M3 Max"}, "not_a_column": 1})
    store.upsert_device({"device_id": DEVICE, "memory_bandwidth_gbps": 300.0})
    (device,) = store.devices()
    assert device["name"] == "Apple M3 Max"
    assert device["gpu_cores"] == 40
    assert device["memory_bandwidth_gbps"] == 300.0
    assert device["in_catalog"] is True
    assert device["reported"] == {"device_name": "Apple M3 Max"}
    assert "not_a_column" not in device
    with pytest.raises(StoreError, match="device_id"):
        store.upsert_device({"name": "nameless"})


def test_upsert_device_keeping_known_facts_erases_nothing_with_a_none(store):
    store.upsert_device({"device_id": DEVICE, "name": "Apple M3 Max", "reported_name": "Apple M3 Max (40 cores)"})
    store.upsert_device({"device_id": DEVICE, "name": "M3 Max", "reported_name": None}, keep_known=True)
    (device,) = store.devices()
    assert (device["name"], device["reported_name"]) == ("M3 Max", "Apple M3 Max (40 cores)")
    store.upsert_device({"device_id": DEVICE, "reported_name": None})
    assert store.devices()[0]["reported_name"] is None


@pytest.mark.parametrize("stop", [KeyboardInterrupt, StoreError])
def test_atomic_writes_all_or_nothing(store, make_measurement, stop):
    store.record([make_measurement()])
    before = (store.devices(), store.runs(), store.measurements())
    with pytest.raises(stop):
        with store.atomic():
            store.upsert_device({"device_id": DEVICE, "name": "Apple M3 Max"})
            run_id = store.start_run(DEVICE, host=None, backend="metal", mlx_version=None, pipeline_version=None,
                                     settings={})
            store.record([make_measurement(run_id=run_id, dtype="float32")])
            store.finish_run(run_id, "imported")
            raise stop("stopped")
    assert (store.devices(), store.runs(), store.measurements()) == before
    with store.atomic():
        with store.atomic():  # nested: one transaction, committed by the outer block
            store.record([make_measurement(dtype="float32")])
        store.upsert_device({"device_id": DEVICE})
    assert len(store.measurements()) == 2 and len(store.devices()) == 1


def test_runs_start_and_finish(store):
    run_id = store.start_run(DEVICE, host="mac", backend="metal", mlx_version="0.29.1",
                             pipeline_version="0.1.0", settings={"repeats": 20, "warmup": 3})
    assert len(run_id) == 32 and int(run_id, 16) >= 0
    (run,) = store.runs()
    assert run["status"] == "running" and run["finished_at"] is None
    assert run["settings"] == {"repeats": 20, "warmup": 3}
    store.finish_run(run_id, "interrupted")
    (run,) = store.runs(device=DEVICE)
    assert run["status"] == "interrupted"
    assert run["finished_at"] >= run["started_at"]
    assert store.runs(device="other") == []
    with pytest.raises(StoreError, match="no run 'nope'"):
        store.finish_run("nope", "finished")
    with pytest.raises(StoreError, match="unknown run status 'done'"):
        store.finish_run(run_id, "done")


# -- measurements ------------------------------------------------------------------------------


def test_record_is_idempotent_and_keys_ignore_parameter_order(store, make_measurement):
    first = make_measurement(config={"threadgroup": 256, "vector": 4})
    assert store.record([first]) == 1
    assert store.record([first]) == 0
    same_key = make_measurement(run_id="run-2", config={"vector": 4, "threadgroup": 256}, median_us=99.0)
    assert store.record([same_key]) == 0
    (row,) = store.measurements()
    assert row["run_id"] == "run-1" and row["median_us"] == 10.0
    assert row["config"] == {"threadgroup": 256, "vector": 4}
    assert row["shape_key"] == first.shape_key and row["config_key"] == first.config_key


def test_record_counts_only_new_rows_within_and_across_batches(store, make_measurement):
    batch = [make_measurement(config={"threadgroup": tg}) for tg in (32, 64, 128)]
    assert store.record(batch + batch[:1]) == 3
    more = [make_measurement(config={"threadgroup": tg}) for tg in (128, 256)]
    assert store.record(more) == 1
    assert store.record([]) == 0
    assert len(store.measurements()) == 4


def test_a_bad_row_leaves_no_row_of_its_batch(store, make_measurement):
    assert store.record([make_measurement(config={"threadgroup": 1})]) == 1
    bad = make_measurement(config={"threadgroup": 3})
    object.__setattr__(bad, "status", "exploded")  # past Measurement's own check, into the CHECK constraint
    batch = [make_measurement(config={"threadgroup": 2}), bad, make_measurement(config={"threadgroup": 4})]
    with pytest.raises(StoreError, match="none of 3 measurements were recorded"):
        store.record(batch)
    assert [r["config"] for r in store.measurements()] == [{"threadgroup": 1}]
    assert store.record(batch[:1]) == 1


def test_every_status_of_records_is_accepted_by_the_schema(store, make_measurement):
    batch = [make_measurement(status=s, config={"threadgroup": i}, error=None if s == "ok" else "boom")
             for i, s in enumerate(STATUSES)]
    assert store.record(batch) == len(STATUSES)
    assert sorted(r["status"] for r in store.measurements()) == sorted(STATUSES)


def test_measurement_fields_round_trip(store, make_measurement):
    m = make_measurement(status="wrong_result", error="max abs err 0.5", extra={"max_abs_err": 0.5})
    store.record([m])
    (row,) = store.measurements()
    assert row == {
        "run_id": "run-1", "device_id": DEVICE, "kernel": "softmax",
        "kernel_version": m.kernel_version, "dtype": "float16",
        "shape_key": m.shape_key, "shape": {"rows": 64, "cols": 4096},
        "config_key": m.config_key, "config": {"threadgroup": 256},
        "status": "wrong_result", "median_us": None, "p10_us": None, "p90_us": None,
        "samples": 0, "error": "max abs err 0.5", "extra": {"max_abs_err": 0.5},
        "measured_at": row["measured_at"],
    }
    assert row["measured_at"] is not None


def test_measured_keys_for_resume(store, make_measurement):
    a = make_measurement(config={"threadgroup": 64})
    b = make_measurement(config={"threadgroup": 128}, dtype="float32")
    store.record([a, b, make_measurement(kernel_version="sha256:0000000000000002")])
    assert store.measured_keys(DEVICE, "softmax", "sha256:0000000000000001") == {
        ("float16", a.shape_key, a.config_key),
        ("float32", b.shape_key, b.config_key),
    }
    assert store.measured_keys("other", "softmax", "sha256:0000000000000001") == set()


def test_measurement_filters_and_arrow(store, make_measurement):
    # not a built-in kernel's name: measurements_arrow refuses a built-in kernel's row of other parameters
    store.record([
        make_measurement(kernel="my_softmax", config={"threadgroup": 64}),
        make_measurement(kernel="my_softmax", config={"threadgroup": 128}, status="launch_error"),
        make_measurement(kernel="my_softmax", dtype="float32"),
        make_measurement(kernel="rmsnorm"),
        make_measurement(kernel="my_softmax", device_id="nvidia-h100"),
    ])
    assert len(store.measurements()) == 5
    assert len(store.measurements(device=DEVICE)) == 4
    assert len(store.measurements(device=DEVICE, kernel="my_softmax", dtype="float16")) == 2
    assert len(store.measurements(status=["ok", "launch_error"], kernel="my_softmax")) == 4
    assert store.measurements(status=[]) == []
    with pytest.raises(TypeError, match="unknown filter 'colour'"):
        store.measurements(colour="red")
    table = store.measurements_arrow(device=DEVICE, kernel="my_softmax")
    assert table.num_rows == 3
    assert table.column_names == list(store_mod.MEASUREMENT_COLUMNS)
    assert set(table.column("dtype").to_pylist()) == {"float16", "float32"}
    assert table.column("config").to_pylist()[0].startswith("{")


def test_repeats_are_kept_once_per_key_and_run(store, make_measurement):
    m1 = make_measurement(run_id="r1", median_us=10.0)
    m2 = make_measurement(run_id="r2", median_us=10.4)
    assert store.record_repeat([m1, m2]) == 2
    assert store.record_repeat([m1]) == 0
    rows = store.repeats(device=DEVICE, kernel="softmax")
    assert [(r["run_id"], r["median_us"]) for r in rows] == [("r1", 10.0), ("r2", 10.4)]
    assert rows[0]["config_key"] == m1.config_key


# -- summary -----------------------------------------------------------------------------------


def test_summary_exact_rows(store, make_measurement):
    from datetime import datetime

    good, bad = {"rows": 64, "cols": 4096}, {"rows": 1, "cols": 1 << 20}
    day = [datetime(2026, 3, d, 9, 4, 43) for d in (5, 6, 7)]
    store.record([
        make_measurement(shape=good, config={"threadgroup": 256}, measured_at=day[1]),
        make_measurement(shape=good, config={"threadgroup": 1024}, status="launch_error", measured_at=day[2]),
        make_measurement(shape=bad, config={"threadgroup": 256}, status="compile_error", measured_at=day[0]),
        make_measurement(shape=bad, config={"threadgroup": 1024}, status="timeout", measured_at=day[1]),
        make_measurement(shape=bad, config={"threadgroup": 512}, status="launch_error", measured_at=day[1]),
        make_measurement(dtype="bfloat16", shape=bad, measured_at=day[2]),
        make_measurement(device_id="amd-mi300x", kernel="rmsnorm", status="wrong_result", measured_at=day[0]),
    ])
    expected = [
        {"device": "amd-mi300x", "kernel": "rmsnorm", "dtype": "float16", "measurements": 1,
         "by_status": {"wrong_result": 1}, "shapes": 1, "shapes_ok": 0,
         "first_measured_at": day[0], "last_measured_at": day[0]},
        {"device": DEVICE, "kernel": "softmax", "dtype": "bfloat16", "measurements": 1,
         "by_status": {"ok": 1}, "shapes": 1, "shapes_ok": 1, "first_measured_at": day[2], "last_measured_at": day[2]},
        {"device": DEVICE, "kernel": "softmax", "dtype": "float16", "measurements": 5,
         "by_status": {"ok": 1, "launch_error": 2, "compile_error": 1, "timeout": 1},
         "shapes": 2, "shapes_ok": 1, "first_measured_at": day[0], "last_measured_at": day[2]},
    ]
    assert store.summary() == expected
    assert list(expected[2]["by_status"]) == list(store.summary()[2]["by_status"])  # STATUSES order
    assert store.summary(device=DEVICE) == expected[1:]
    assert store.summary(kernel="rmsnorm") == expected[:1]
    assert store.summary(device="nobody") == []


# -- a writer killed mid-batch -----------------------------------------------------------------

CHILD_WRITER = textwrap.dedent(
    """
    import sys
    from zmlx_pipeline.data.records import Measurement
    from zmlx_pipeline.data.store import Store

    path, n = sys.argv[1], int(sys.argv[2])
    with Store(path) as store:
        b = 0
        while True:
            run = store.start_run("dev", host="h", backend="cpu", mlx_version=None,
                                  pipeline_version=None, settings={})
            batch = [Measurement(run, "dev", "k", "v1", "float32", {"batch": b, "i": i},
                                 {"threadgroup": 32}, "ok", median_us=1.0) for i in range(n)]
            print("begin", b, flush=True)
            store.record(batch)
            print("committed", b, flush=True)
            b += 1
    """
)


def test_killed_writer_leaves_only_whole_batches(tmp_path, subprocess_env):
    path, n = tmp_path / "s.duckdb", 4000
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD_WRITER, str(path), str(n)],
        env=subprocess_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    committed, began = -1, {}
    try:
        for line in child.stdout:
            word, b = line.split()
            if word == "committed":
                committed = int(b)
                took = time.monotonic() - began[committed]
            elif word == "begin":
                began[int(b)] = time.monotonic()
                if int(b) == 3:
                    # record() spends about its first half building rows, the rest in its transaction
                    time.sleep(0.75 * took)
                    break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        child.stdout.close()
        child.stderr.close()
    assert child.returncode == -signal.SIGKILL
    assert committed == 2

    with Store(path, read_only=True) as s:
        rows = s.measurements()
        runs = s.runs()
    per_run: dict[str, int] = {}
    for row in rows:
        per_run[row["run_id"]] = per_run.get(row["run_id"], 0) + 1
    assert len(rows) % n == 0
    assert set(per_run.values()) == {n}
    assert len(per_run) >= committed + 1
    assert set(per_run) <= {r["run_id"] for r in runs}


def _key(m):
    return (m.device_id, m.kernel, m.kernel_version, m.dtype, m.shape_key, m.config_key)


def test_deleted_measurements_are_gone_and_measured_again_as_missing(store, make_measurement):
    rows = [make_measurement(config={"threadgroup": tg}) for tg in (32, 64, 128)]
    store.record(rows)
    assert store.delete_measurements([_key(rows[0]), _key(rows[2])]) == 2
    assert store.delete_measurements([_key(rows[0])]) == 0  # already gone
    assert store.delete_measurements([]) == 0
    assert [r["config"] for r in store.measurements()] == [{"threadgroup": 64}]
    m = rows[0]
    assert (m.dtype, m.shape_key, m.config_key) not in store.measured_keys(m.device_id, m.kernel, m.kernel_version)
    again = make_measurement(config={"threadgroup": 32}, run_id="run-2", median_us=12.5)
    assert store.record([again]) == 1  # the next collect stores the key anew
    assert {r["config"]["threadgroup"]: r["median_us"] for r in store.measurements()} == {32: 12.5, 64: 10.0}


def test_delete_refuses_a_short_key_and_a_read_only_store(store, make_measurement, tmp_path):
    m = make_measurement()
    store.record([m])
    with pytest.raises(StoreError, match="a measurement key has 6 parts"):
        store.delete_measurements([_key(m)[:5]])
    assert len(store.measurements()) == 1
    with Store(store.path, read_only=True) as ro:
        with pytest.raises(StoreError, match="read-only"):
            ro.delete_measurements([_key(m)])
    assert len(store.measurements()) == 1


# -- held-out cases ------------------------------------------------------------------------------


def _heldout_frame(methods=("model", "nearest_shape"), shapes=("a", "b")):
    import polars as pl

    rows = [{"method": m, "fold": "shapes-0", "device_id": DEVICE, "kernel": "softmax", "dtype": "float16",
             "shape_key": s, **{f"r{k}": 1.5 + i if k < 2 + i else 1.0 for k in store_mod.HELDOUT_KS},
             "hit_rank": 2 + i, "configs": 6, "pick_key": f"cfg-{m}-{s}"}
            for i, m in enumerate(methods) for s in shapes]
    return pl.DataFrame(rows, schema_overrides={"hit_rank": pl.Int64, "configs": pl.Int64})


def test_heldout_cases_round_trip_with_named_fields_and_replace_per_split(store):
    assert store.add_heldout_cases("m1", "sha256:ab", "shapes", "nested", _heldout_frame()) == 4
    store.add_heldout_cases("m1", "sha256:ab", "devices", "nested", _heldout_frame(methods=("model",)))
    got = store.heldout_cases("m1", "shapes", "nested").to_pylist()
    assert len(got) == 4 and got[0]["model_id"] == "m1" and got[0]["data_fingerprint"] == "sha256:ab"
    assert got[0]["method"] == "model" and got[0]["r1"] == 1.5 and got[0]["r10"] == 1.0
    assert got[0]["hit_rank"] == 2 and got[0]["pick_key"] == "cfg-model-a"
    # recording the split again replaces its rows and leaves the other split alone
    store.add_heldout_cases("m1", "sha256:cd", "shapes", "nested", _heldout_frame(shapes=("a",)))
    again = store.heldout_cases("m1", "shapes", "nested").to_pylist()
    assert len(again) == 2 and {r["data_fingerprint"] for r in again} == {"sha256:cd"}
    assert store.heldout_cases("m1", "devices", "nested").num_rows == 2
    assert store.heldout_cases("m1", "shapes", "fixed").num_rows == 0
    assert store.heldout_cases("nope", "shapes", "nested").num_rows == 0


def test_heldout_cases_refuse_a_frame_without_their_fields_and_keep_what_is_stored(store):
    store.add_heldout_cases("m1", "sha256:ab", "shapes", "nested", _heldout_frame())
    with pytest.raises(StoreError, match=r"lack column\(s\) pick_key"):
        store.add_heldout_cases("m1", "sha256:ab", "shapes", "nested", _heldout_frame().drop("pick_key"))
    assert store.heldout_cases("m1", "shapes", "nested").num_rows == 4


# -- a store changed outside zmlx-pipeline -----------------------------------------------------


def _refused_on_open(path: Path, before: bytes) -> list[str]:
    """The CorruptStore messages of opening `path` writable and read-only, after checking the file is still `before`."""
    messages = []
    for flags in ({}, {"read_only": True}):
        with pytest.raises(CorruptStore) as err:
            Store(path, **flags)
        messages.append(str(err.value))
    assert path.read_bytes() == before
    return messages


@pytest.mark.parametrize("sql, says", [
    ("ALTER TABLE measurements RENAME COLUMN median_us TO med", "table measurements has no column median_us (DOUBLE)"),
    ("ALTER TABLE measurements ALTER median_us TYPE VARCHAR", "column measurements.median_us is VARCHAR, not DOUBLE"),
    ("ALTER TABLE measurements DROP COLUMN p90_us", "table measurements has no column p90_us (DOUBLE)"),
    ("ALTER TABLE models ADD COLUMN note VARCHAR", "table models has column note, which its schema has not"),
    ("DROP TABLE repeats", "has no table repeats"),
])
def test_a_table_whose_columns_were_changed_is_refused_on_open_and_left_as_it_was(tmp_path, tampered_store, sql, says):
    """Every later read of such a table would fail with DuckDB's binder error; the open says what changed."""
    path = tmp_path / "s.duckdb"
    for message in _refused_on_open(path, tampered_store(path, sql)):
        assert message.startswith(f"store {path}") and says in message and "\n" not in message, message
        assert message.endswith("restore it from a copy, or ingest its shards into a new --db")


@pytest.mark.parametrize("sql, says", [
    ("DELETE FROM _migrations", "it records no migration but holds table bundles, devices, heldout_cases"),
    ("DELETE FROM _migrations WHERE version = 3", "it records migrations up to 2 but holds table heldout_cases"),
    ("DELETE FROM _migrations WHERE version = 2", "it records migrations [1, 3], not 1 to 3"),
    ("DROP TABLE _migrations", "it has no _migrations table"),
])
def test_a_damaged_migration_record_is_refused_not_migrated_again(tmp_path, tampered_store, sql, says):
    """Migrating again would fail on tables that exist ('already exists'): the record is what is damaged."""
    path = tmp_path / "s.duckdb"
    for message in _refused_on_open(path, tampered_store(path, sql)):
        assert message.startswith(f"store {path}'s migration record is damaged ({says}") and "\n" not in message, message
        assert "restore it from a copy" in message


@pytest.mark.parametrize("sql, says", [
    ("UPDATE measurements SET median_us = 'nan'", "an ok row needs a finite positive median_us, not nan"),
    ("UPDATE measurements SET median_us = -2", "an ok row needs a finite positive median_us, not -2.0"),
    ("UPDATE measurements SET config = 'not json'", "config is not a JSON object: 'not json'"),
    ("UPDATE measurements SET shape = '[1]'", "shape is not a JSON object: '[1]'"),
])
def test_stored_rows_ingest_would_refuse_are_refused_when_read(tmp_path, tampered_store, sql, says):
    """Training, evaluation and noise would fail on them (or learn from them): one line naming the row instead."""
    path = tmp_path / "s.duckdb"
    tampered_store(path, sql + " WHERE shape_key = (SELECT min(shape_key) FROM measurements)")
    with Store(path, read_only=True) as s:
        for read in (s.measurements_arrow, s.measurements, s.repeat_pairs):
            with pytest.raises(CorruptStore) as err:
                read()
            message = str(err.value)
            assert message.startswith(f"store {path} holds a measurement no ingest would take ({DEVICE}, my_norm, "
                                      "float16, shape ") and says in message and "\n" not in message, message
        assert s.measurements_arrow(device="nvidia-h100").num_rows == 0  # rows of other filters still read


def test_a_repeat_of_no_finite_time_is_refused_when_read(tmp_path, tampered_store):
    path = tmp_path / "s.duckdb"
    tampered_store(path, "UPDATE repeats SET median_us = 'inf'")
    with Store(path, read_only=True) as s, pytest.raises(CorruptStore, match=r"holds a repeated timing no ingest "
                                                                            r"would take \(.*median_us inf\)"):
        s.repeat_pairs()


@pytest.mark.parametrize("sql, says", [
    ("UPDATE models SET scores = 'garbage'", "its scores column is not JSON ('garbage')"),
    ("UPDATE models SET params = '[1, 2]'", "its params column is not a JSON object ('[1, 2]')"),
    ("UPDATE models SET path = NULL", "it has no model file path"),
])
def test_a_registry_row_changed_outside_is_refused_when_read(tmp_path, tampered_store, sql, says):
    path = tmp_path / "s.duckdb"
    tampered_store(path, sql)
    with Store(path, read_only=True) as s:
        for read in (s.models, lambda: s.models(kernel="my_norm"), lambda: s.models(model_id="my_norm-1")):
            with pytest.raises(CorruptStore) as err:
                read()
            assert str(err.value).startswith(f"store {path}: registered model my_norm-1: {says}: the registry was "
                                             "changed outside zmlx-pipeline"), str(err.value)


@pytest.mark.parametrize("sql, says", [
    ("UPDATE measurements SET median_us = 'nan'", "an ok row needs a finite positive median_us, not nan"),
    ("UPDATE measurements SET p10_us = 50", "p10_us <= median_us <= p90_us does not hold"),
    ("UPDATE measurements SET device_id = 'Apple M3'", "device_id 'Apple M3' is not a device id"),
])
def test_export_refuses_rows_ingest_would_refuse_and_writes_nothing(tmp_path, tampered_store, sql, says):
    """An exported shard always ingests again."""
    path = tmp_path / "s.duckdb"
    tampered_store(path, sql + " WHERE shape_key = (SELECT min(shape_key) FROM measurements)")
    with Store(path, read_only=True) as s:
        with pytest.raises(StoreError) as err:
            s.export_shard(tmp_path / "out.parquet")
    message = str(err.value)
    assert says in message and "nothing was exported" in message and "\n" not in message, message
    assert not (tmp_path / "out.parquet").exists()
    assert not [p for p in tmp_path.iterdir() if p.suffix != ".duckdb" and p.is_file()]


def test_the_store_works_in_utc_whatever_the_local_time_zone(tmp_path, subprocess_env):
    """DuckDB converts aware timestamps in its TimeZone setting, which follows TZ unless the store sets it."""
    script = textwrap.dedent(f"""
        from zmlx_pipeline.data.store import Store
        with Store({str(tmp_path / 's.duckdb')!r}) as s:
            print(s._conn.execute("SELECT current_setting('TimeZone'), "
                                  "TIMESTAMPTZ '2026-01-01 12:00:00+00'::TIMESTAMP").fetchone())
    """)
    done = subprocess.run([sys.executable, "-c", script], env={**subprocess_env, "TZ": "America/St_Johns"},
                          capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "('UTC', datetime.datetime(2026, 1, 1, 12, 0))", done.stderr


def test_kernel_contents_holds_a_kernel_s_values_devices_and_runs(store, make_measurement):
    assert store.kernel_contents("vec") is None
    runs = []
    for device, configs in (("nvidia-h100-sxm", [{"v": 2}, {"v": 1}]), ("nvidia-h200", [{"v": 4}])):
        run = store.start_run(device, host=None, backend="cuda", mlx_version=None, pipeline_version="0",
                              settings={"file": f"{device}.json", "format": "t4"})
        store.record([make_measurement(run_id=run, device_id=device, kernel="vec", config=c) for c in configs])
        store.finish_run(run, "imported")
        runs.append(run)
    store.record([make_measurement(kernel="other")])
    got = store.kernel_contents("vec")
    assert got["configs"] == [{"v": 1}, {"v": 2}, {"v": 4}] and got["shapes"] == [{"rows": 64, "cols": 4096}]
    assert got["kernel_versions"] == ["sha256:0000000000000001"]
    assert [(d["device"], d["measurements"]) for d in got["devices"]] == [("nvidia-h100-sxm", 2), ("nvidia-h200", 1)]
    assert [(r["run_id"], r["device_id"], r["status"], r["settings"]["file"], r["rows"]) for r in got["runs"]] == [
        (runs[0], "nvidia-h100-sxm", "imported", "nvidia-h100-sxm.json", 2),
        (runs[1], "nvidia-h200", "imported", "nvidia-h200.json", 1)]
    assert all(r["first_measured_at"] <= r["last_measured_at"] <= r["finished_at"] for r in got["runs"])


def test_kernel_contents_refuses_a_tampered_row_of_that_kernel(store, make_measurement):
    store.record([make_measurement(kernel="vec")])
    store._conn.execute("UPDATE measurements SET median_us = 'nan'")
    with pytest.raises(CorruptStore, match=r"holds a measurement no ingest would take \(apple-m3-max-40, vec, "):
        store.kernel_contents("vec")
