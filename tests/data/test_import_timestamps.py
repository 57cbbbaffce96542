"""An imported row's measured_at is when the file says it was timed, read as UTC; the time of the import where the
file says nothing, and the run's settings say which; a timestamp in the future or before 2000 refuses the file."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.data.importers import ImportFileError, import_files
from zmlx_pipeline.data.importers.timestamps import Stamp, read_timestamp
from zmlx_pipeline.data.store import FUTURE_SKEW, Store, StoreError
from zmlx_pipeline.pipeline.cli import cli

WILD = Path(__file__).parent / "fixtures" / "kernel_tuner_wild"
NOON = datetime(2024, 1, 1, 12, 0, 0)


def now() -> datetime:
    return datetime.now(timezone.utc).replace(tzinfo=None)


# -- how tuners write a time ----------------------------------------------------------------------------------------

WRITTEN = [
    # Kernel Tuner: str(datetime.now(timezone.utc)) in each cache entry and T4 result (KernelTuner/kernel_tuner
    # test/test_cache_files/small_cache.json; AutoTuningAssociation/benchmark_hub cachefiles/*/*_T4.json.gz and
    # hyperparametertuning/cachefiles/hyperparamtuning_paper_bruteforce_diff_evo_T4.json)
    ("2023-12-22 09:54:05.502007+00:00", datetime(2023, 12, 22, 9, 54, 5, 502007), True),
    ("2023-12-22 09:54:05+00:00", datetime(2023, 12, 22, 9, 54, 5), True),  # str() of a whole second
    # KTT's T4 writer, the metadata and each result (HiPerCoRe/KTT Tutorials/03KernelTuning/FullSearchSpace.t4.json;
    # Examples/CoulombSum3d/coulomb_2080_full_search_space_converted.json)
    ("2026-03-05 09:04:43 UTC", datetime(2026, 3, 5, 9, 4, 43), True),
    # KTT 2.2's own JSON, a second of one digit (HiPerCoRe/KTT Tutorials/03KernelTuning/FullSearchSpace.ktt.json)
    ("2026-04-21 07:19:6 UTC", datetime(2026, 4, 21, 7, 19, 6), True),
    # KTT's TunerMetadata and Timestamp.h: the date library's system_clock time, nanoseconds on Linux
    ("2024-05-06 12:34:56.123456789 UTC", datetime(2024, 5, 6, 12, 34, 56, 123456), True),
    # ISO 8601 as other writers give it
    ("2024-01-01T12:00:00Z", NOON, True),
    ("2024-01-01T12:00:00.250Z", NOON.replace(microsecond=250000), True),
    ("2024-01-01T14:00:00+02:00", NOON, True),
    ("2024-01-01T07:00:00-0500", NOON, True),
    ("2024-01-01 13:00:00 +01", NOON, True),
    ("2024-01-01t12:00:00z", NOON, True),
    ("2016-12-31 23:59:60 UTC", datetime(2017, 1, 1), True),  # a leap second
    ("2024-01-01 12:00:00", NOON, False),  # no zone: read as UTC, and said so
    ("2024-01-01T12:00", NOON, False),
    ("2024-01-01", datetime(2024, 1, 1), False),
    # seconds since 1970 (time.time()), milliseconds (JavaScript's Date.now()), nanoseconds (time.time_ns())
    (1704110400, NOON, True),
    (1704110400.25, NOON.replace(microsecond=250000), True),
    (1704110400000, NOON, True),
    (1704110400000000000, NOON, True),
]


@pytest.mark.parametrize("value, at, zone_given", WRITTEN, ids=[str(w[0]) for w in WRITTEN])
def test_a_written_time_is_read_as_utc(value, at, zone_given):
    assert read_timestamp(value) == Stamp(at, zone_given)


@pytest.mark.parametrize("value", [None, "", "  "])
def test_no_time_is_none(value):
    assert read_timestamp(value) is None


@pytest.mark.parametrize("value, says", [
    ("yesterday", "'yesterday' is not a date and time such as 2024-05-01 12:00:00+00:00"),
    ("2024-13-01 10:00", "is no date and time (month must be in 1..12)"),
    ("2024-02-30 10:00", "is no date and time (day is out of range for month)"),
    ("2024-01-01 25:00", "is no date and time (hour must be in 0..23)"),
    ("2024-01-01 12:61", "is no date and time (minute must be in 0..59)"),
    ("2026-04-21 07:19:99 UTC", "is no date and time (second must be in 0..59)"),  # never 07:19:59
    ("2026-04-21 07:19:61", "is no date and time (second must be in 0..59)"),
    ("2024-01-01 12:00 CET", "is not a date and time"),  # a zone's name says no offset that is sure
    ("2024-01-01T12:00:00+25:00", "names an offset of +25:00, which no time zone has"),
    ("20240101", "is not a date and time"),
    (True, "is bool True, not a date and time"),
    ([2024, 1, 1], "is list [2024, 1, 1], not a date and time"),
    (float("nan"), "is nan, not a date and time"),
    (-5, "is -5, not a date and time"),
    (1e21, "too large to be a count of seconds or nanoseconds since 1970"),
    (10**400, "is 10000000000000000000... (401 digits), too large to be a count of seconds or nanoseconds"),
])
def test_what_is_no_time_is_refused_saying_why(value, says):
    with pytest.raises(ValueError, match=None) as err:
        read_timestamp(value)
    assert says in str(err.value)


# -- every format the importers read -----------------------------------------------------------------------------------

def runs_and_rows(store) -> tuple[list[dict], dict[str, datetime]]:
    """The store's runs, and each stored row's measured_at by its config's JSON."""
    return store.runs(), {json.dumps(m["config"], sort_keys=True): m["measured_at"] for m in store.measurements()}


def test_a_cache_s_entries_are_dated_by_their_own_timestamps(store):
    import_files(store, [WILD / "small_cache_1.0.0.json"], device="nvidia-rtx-a4000")
    (run,), rows = runs_and_rows(store)
    rows = {json.loads(k)["block_size_y"]: v for k, v in rows.items()}
    assert rows == {1: datetime(2023, 12, 22, 9, 54, 5, 502007), 2: datetime(2023, 12, 22, 9, 54, 6, 508453)}
    assert run["settings"]["measured_at_from"] == "entries" and "measured_at_zone" not in run["settings"]
    assert run["started_at"] == rows[1] < run["finished_at"]  # its first timing, then the import


@pytest.mark.parametrize("name, device, at", [
    ("t4_target.json", "nvidia-a100-pcie-40gb", datetime(2023, 12, 21, 10, 44, 42, 236642)),  # Kernel Tuner's T4
    ("vectorAdd_rtx500ada.t4.json", "nvidia-rtx-4000-ada", datetime(2026, 3, 5, 9, 4, 43)),  # KTT's T4
    ("vectorAdd_rtx500ada.ktt.json", "nvidia-rtx-4000-ada", datetime(2026, 4, 21, 7, 19, 6)),  # KTT's JSON
])
def test_t4_and_ktt_results_are_dated_by_their_timestamps(store, name, device, at):
    import_files(store, [WILD / name], device=device)
    (run,), rows = runs_and_rows(store)
    assert set(rows.values()) == {at} and run["started_at"] == at
    assert run["settings"]["measured_at_from"] == "entries"


@pytest.mark.parametrize("fmt", ["t4", "ktt"])
def test_results_without_their_own_timestamp_take_the_file_s(store, tmp_path, fmt):
    """KTT's T4 writer stamps the metadata, KTT's JSON its Metadata: results that carry none take that time."""
    name = "vectorAdd_rtx500ada.t4.json" if fmt == "t4" else "vectorAdd_rtx500ada.ktt.json"
    doc = json.loads((WILD / name).read_text())
    field, results, metadata = ("timestamp", "results", "metadata") if fmt == "t4" else ("Timestamp", "Results",
                                                                                        "Metadata")
    for result in doc[results]:
        del result[field]
    doc[metadata][field] = "2025-07-01 08:00:00 UTC"
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    import_files(store, [path], device="nvidia-rtx-4000-ada")
    (run,), rows = runs_and_rows(store)
    assert set(rows.values()) == {datetime(2025, 7, 1, 8)} and run["settings"]["measured_at_from"] == "file"


@pytest.mark.parametrize("name, where, stamp", [
    ("vectorAdd_rtx500ada.ktt.json", "result", "2026-04-21 07:19:99 UTC"),
    ("vectorAdd_rtx500ada.ktt.json", "metadata", "2026-04-21 07:19:61 UTC"),
    ("vectorAdd_rtx500ada.t4.json", "result", "2026-03-05 09:04:61 UTC"),
])
def test_a_second_past_59_refuses_the_file_naming_it(store, tmp_path, name, where, stamp):
    """A second of 61 or 99 is no time, as a minute of 61 is: it refuses the file rather than being read as :59."""
    doc = json.loads((WILD / name).read_text())
    field, results, metadata = ("timestamp", "results", "metadata") if ".t4." in name else ("Timestamp", "Results",
                                                                                            "Metadata")
    for result in doc[results]:
        if where == "metadata":
            del result[field]
    (doc[metadata] if where == "metadata" else doc[results][0])[field] = stamp
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    with pytest.raises(ImportFileError) as err:
        import_files(store, [path], device="nvidia-rtx-4000-ada")
    message = str(err.value)
    assert f"its timestamp {stamp!r} is no date and time (second must be in 0..59)" in message
    assert "\n" not in message and message.endswith("nothing of it was stored")
    assert store.runs() == [] and store.measurements() == []

def test_a_results_file_holds_no_date_and_its_rows_carry_the_import_s_time(store):
    before = now()
    import_files(store, [WILD / "vector_add_results.json"])
    after = now()
    runs, rows = runs_and_rows(store)
    assert len(runs) == 3 and {r["settings"]["measured_at_from"] for r in runs} == {"import"}
    assert all(before <= at <= after for at in rows.values())
    assert all(before <= r["started_at"] <= after for r in runs)


def key_cache(stamps: dict[str, object]) -> dict:
    """A cache of two configs, each entry with the timestamp given for its key (none where it is left out)."""
    cache = {}
    for key, time in (("64", 1.0), ("128", 0.5)):
        cache[key] = {"block_size_x": int(key), "time": time}
        if key in stamps:
            cache[key]["timestamp"] = stamps[key]
    return {"device_name": "NVIDIA RTX A4000", "kernel_name": "vector_add", "problem_size": [4096],
            "tune_params_keys": ["block_size_x"], "tune_params": {"block_size_x": [64, 128]}, "cache": cache}


def write(tmp_path: Path, doc: dict, name: str = "A4000.json") -> Path:
    path = tmp_path / "vector_add" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def test_an_entry_without_a_timestamp_beside_dated_ones_is_dated_by_the_import_and_counted(store, tmp_path):
    before = now()
    import_files(store, [write(tmp_path, key_cache({"64": "2024-02-01 10:00:00+00:00"}))])
    (run,), rows = runs_and_rows(store)
    assert rows['{"block_size_x": 64}'] == datetime(2024, 2, 1, 10) and rows['{"block_size_x": 128}'] >= before
    assert {k: run["settings"][k] for k in ("measured_at_from", "undated_entries", "undated_entries_from")} == {
        "measured_at_from": "entries", "undated_entries": 1, "undated_entries_from": "import"}
    assert run["started_at"] == datetime(2024, 2, 1, 10)


def test_timestamps_without_a_zone_are_read_as_utc_and_the_run_says_so(store, tmp_path):
    import_files(store, [write(tmp_path, key_cache({"64": "2024-02-01T10:00:00", "128": "2024-02-01T10:00:01Z"}))])
    (run,), rows = runs_and_rows(store)
    assert sorted(rows.values()) == [datetime(2024, 2, 1, 10), datetime(2024, 2, 1, 10, 0, 1)]
    assert run["settings"]["measured_at_zone"] == "none given: read as UTC"


def test_a_timestamp_in_the_future_refuses_the_file_naming_it_and_its_row(store, tmp_path):
    ahead = (now() + FUTURE_SKEW + timedelta(hours=1)).replace(microsecond=0)
    path = write(tmp_path, key_cache({"64": "2024-02-01 10:00:00+00:00", "128": f"{ahead}+00:00"}))
    with pytest.raises(ImportFileError) as err:
        import_files(store, [path])
    assert str(err.value) == (
        f"cannot import {path}: cache entry '128': its timestamp '{ahead}+00:00' gives measured_at {ahead} is in the "
        "future; correct it, or remove it to import the row at the time of the import; nothing of it was stored")
    assert store.runs() == [] and store.measurements() == []


def test_a_time_within_the_clock_skew_a_shard_is_allowed_is_taken(store, tmp_path):
    soon = (now() + FUTURE_SKEW / 2).replace(microsecond=0)
    import_files(store, [write(tmp_path, key_cache({"64": soon.isoformat() + "Z", "128": soon.isoformat() + "Z"}))])
    assert set(runs_and_rows(store)[1].values()) == {soon}


@pytest.mark.parametrize("stamp, says", [
    ("1999-12-31 23:00:00+00:00", "gives measured_at 1999-12-31 23:00:00 is before 2000-01-01, earlier than any "
                                  "timing this tool made"),
    (0, "gives measured_at 1970-01-01 00:00:00 is before 2000-01-01"),
    ("2024-01-01 12:00 CET", "its timestamp '2024-01-01 12:00 CET' is not a date and time such as"),
])
def test_a_timestamp_before_2000_or_unreadable_refuses_the_file(store, tmp_path, stamp, says):
    path = write(tmp_path, key_cache({"64": "2024-02-01 10:00:00+00:00", "128": stamp}))
    with pytest.raises(ImportFileError, match="cache entry '128': ") as err:
        import_files(store, [path])
    assert says in str(err.value) and str(err.value).endswith("nothing of it was stored")
    assert store.runs() == []


def test_a_naive_time_in_the_future_says_it_was_read_as_utc(store, tmp_path):
    ahead = (now() + timedelta(days=2)).replace(microsecond=0)
    with pytest.raises(ImportFileError, match=r"is in the future \(it names no time zone and was read as UTC\)"):
        import_files(store, [write(tmp_path, key_cache({"64": ahead.isoformat()}))])


def test_the_cli_refuses_a_future_file_in_one_line_and_stores_nothing(tmp_path):
    db = tmp_path / "k.duckdb"
    path = write(tmp_path, key_cache({"64": "2999-01-01T00:00:00Z"}))
    result = CliRunner().invoke(cli, ["import", "--db", str(db), str(path)])
    assert result.exit_code == 1 and result.output.count("\n") == 1
    assert result.output.startswith(f"Error: cannot import {path}: cache entry '64': its timestamp "
                                    "'2999-01-01T00:00:00Z' gives measured_at 2999-01-01 00:00:00 is in the future")
    assert not db.exists()


def test_rows_dated_by_their_file_export_and_ingest_again(store, tmp_path):
    """A shard's row may not say it was timed over a day before its run started: an imported run starts at its first
    timing, so rows a file dated years ago leave in a shard and come in again."""
    import_files(store, [WILD / "small_cache_1.0.0.json"], device="nvidia-rtx-a4000")
    shard = tmp_path / "a4000.parquet"
    assert store.export_shard(shard) == 2
    with Store(tmp_path / "other.duckdb") as other:
        assert other.ingest_shards([shard])["added"] == 2
        assert sorted(m["measured_at"] for m in other.measurements()) == [
            datetime(2023, 12, 22, 9, 54, 5, 502007), datetime(2023, 12, 22, 9, 54, 6, 508453)]
        (run,) = other.runs()
        assert run["status"] == "imported" and run["settings"]["measured_at_from"] == "entries"


def test_a_reimport_adds_nothing_and_keeps_the_first_dates(store):
    import_files(store, [WILD / "small_cache_1.0.0.json"], device="nvidia-rtx-a4000")
    first = runs_and_rows(store)
    (row,) = import_files(store, [WILD / "small_cache_1.0.0.json"], device="nvidia-rtx-a4000")
    assert row["added"] == 0 and runs_and_rows(store) == first


# -- the store keeps a recorded row's own time, checked as a shard's is ---------------------------------------------

def test_the_store_keeps_a_measurement_s_own_time_in_utc(store, make_measurement):
    aware = datetime(2024, 1, 1, 14, 0, tzinfo=timezone(timedelta(hours=2)))
    store.record([make_measurement(measured_at=aware), make_measurement(config={"threadgroup": 64})])
    stamps = sorted(m["measured_at"] for m in store.measurements())
    assert stamps[0] == NOON and now() - stamps[1] < timedelta(minutes=5)


@pytest.mark.parametrize("when, says", [(datetime(3000, 1, 1), "measured_at 3000-01-01 00:00:00 is in the future"),
                                        (datetime(1999, 1, 1), "measured_at 1999-01-01 00:00:00 is before 2000-01-01")])
def test_the_store_refuses_a_measurement_timed_in_the_future_or_before_2000(store, make_measurement, when, says):
    with pytest.raises(StoreError, match=f"none of the measurements were recorded in .*: {says}"):
        store.record([make_measurement(config={"threadgroup": 64}), make_measurement(measured_at=when)])
    assert store.measurements() == []
