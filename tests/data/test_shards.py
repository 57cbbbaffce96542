"""Parquet shards: export, idempotent ingest, refusal of bad files, queries in place."""

from __future__ import annotations

import re
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import duckdb
import pyarrow.parquet as pq
import pytest

from zmlx_pipeline.data.shards import (
    SHARD_COLUMNS,
    BadShard,
    check_shard,
    export_shard,
    ingest_shard,
    ingest_shards,
    query_shards,
    shard_filename,
    shard_paths,
)
from zmlx_pipeline.core.keys import mapping_key
from zmlx_pipeline.data.store import CorruptStore, Store, StoreError

MAC, GPU = "apple-m3-max-40", "nvidia-h100-sxm"


def fill(store: Store, make_measurement, device: str, configs=(64, 128, 256), shapes=(1, 2)) -> str:
    """A device row, a finished run and one measurement per (shape, config); returns the run id."""
    figures = {"vendor": "apple", "gpu_cores": 40, "memory_bandwidth_gbps": 400.0}  # MAC: a chip the catalog lacks
    if device == GPU:  # a catalog chip's shard gives its catalog figures
        figures = {"name": "NVIDIA H100 SXM5 80GB", "vendor": "nvidia", "gpu_cores": 132,
                   "memory_bandwidth_gbps": 3350.0}
    store.upsert_device({"device_id": device, "name": device.upper(), **figures, "in_catalog": True,
                         "reported": {"device_name": device}})
    run = store.start_run(device, host="host-" + device, backend="metal", mlx_version="0.29.1",
                          pipeline_version="0.1.0", settings={"repeats": 10})
    store.record([
        make_measurement(run_id=run, device_id=device, shape={"rows": r, "cols": 1024},
                         config={"TG": tg}, status="ok" if tg < 256 else "launch_error",
                         **({"median_us": tg / r, "p10_us": 0.9 * tg / r, "p90_us": 1.1 * tg / r} if tg < 256 else {}))
        for r in shapes for tg in configs
    ])
    store.finish_run(run, "finished")
    return run


def contents(store: Store) -> tuple[list, list, list]:
    """Everything ingest carries, comparable across stores."""
    return store.measurements(), store.runs(), store.devices()


def test_export_then_ingest_into_fresh_store_is_identical(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    fill(store, make_measurement, GPU, configs=(32, 512))
    shard = tmp_path / "shards" / "all.parquet"
    assert export_shard(store, shard) == 10

    with Store(tmp_path / "central.duckdb") as central:
        assert ingest_shard(central, shard) == {"rows": 10, "added": 10, "skipped": 0}
        assert contents(central) == contents(store)
        assert central.summary() == store.summary()
        assert ingest_shard(central, shard) == {"rows": 10, "added": 0, "skipped": 10}
        assert contents(central) == contents(store)


def test_shard_is_one_zstd_parquet_file_with_the_documented_columns(store, make_measurement, tmp_path):
    run = fill(store, make_measurement, MAC)
    shard = tmp_path / "mac.parquet"
    export_shard(store, shard)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".parquet") or ".tmp-" in p.name] == ["mac.parquet"]
    meta = pq.ParquetFile(shard).metadata
    assert meta.num_rows == 6
    assert {meta.row_group(0).column(i).compression for i in range(meta.num_columns)} == {"ZSTD"}
    assert meta.metadata[b"zmlx_pipeline_shard"] == b"1"
    table = pq.read_table(shard)
    assert table.column_names == list(SHARD_COLUMNS)
    row = table.slice(0, 1).to_pylist()[0]
    assert row["device_name"] == MAC.upper() and row["device_gpu_cores"] == 40
    assert row["run_host"] == "host-" + MAC and row["run_status"] == "finished" and row["run_id"] == run


def test_export_one_device_and_replace_existing_shard(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    fill(store, make_measurement, GPU, configs=(32,))
    shard = tmp_path / "gpu.parquet"
    assert export_shard(store, shard, device=MAC) == 6
    assert export_shard(store, shard, device=GPU) == 2
    assert set(pq.read_table(shard).column("device_id").to_pylist()) == {GPU}
    assert export_shard(store, tmp_path / "none.parquet", device="nobody") == 0
    left = sorted(p.name for p in tmp_path.iterdir() if p.is_file() and ".duckdb" not in p.name)
    assert left == ["gpu.parquet", "none.parquet"]  # no temporary file stays behind


def test_export_works_from_a_read_only_store(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    path = store.path
    store.close()
    with Store(path, read_only=True) as ro:
        assert ro.export_shard(tmp_path / "ro.parquet") == 6


def test_overlapping_shards_keep_one_row_per_key_the_newest(make_measurement, tmp_path):
    shared = [make_measurement(config={"TG": tg}) for tg in (64, 128)]
    with Store(tmp_path / "a.duckdb") as a:
        a.record(shared + [make_measurement(config={"TG": 32})])
        a.export_shard(tmp_path / "shards" / "a.parquet")
    with Store(tmp_path / "b.duckdb") as b:
        b.record([make_measurement(run_id="run-b", config=m.config, median_us=1.0, p10_us=0.9, p90_us=1.1)
                  for m in shared]
                 + [make_measurement(run_id="run-b", config={"TG": 512})])
        b.export_shard(tmp_path / "shards" / "b.parquet")
    with Store(tmp_path / "central.duckdb") as central:
        totals = ingest_shards(central, [tmp_path / "shards"])
        # b timed the two shared keys later: its timings replace a's
        assert (totals["files"], totals["rows"], totals["added"], totals["skipped"], totals["replaced"]) == (2, 6, 4, 0, 2)
        assert totals["per_file"][str(tmp_path / "shards" / "b.parquet")] == {"rows": 3, "added": 1, "skipped": 0,
                                                                               "replaced": 2}
        rows = central.measurements()
        assert sorted(r["config"]["TG"] for r in rows) == [32, 64, 128, 512]
        assert {r["run_id"] for r in rows if r["config"]["TG"] in (64, 128)} == {"run-b"}
        assert ingest_shards(central, [tmp_path / "shards"])["skipped"] == 6  # idempotent
        assert {r["run_id"] for r in central.runs()} == {"run-1", "run-b"}
        assert {r["status"] for r in central.runs()} == {"imported"}  # their runs were not in a/b's stores


def test_ingest_keeps_local_device_facts_and_fills_gaps(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    shard = tmp_path / "mac.parquet"
    export_shard(store, shard)
    with Store(tmp_path / "central.duckdb") as central:
        central.upsert_device({"device_id": MAC, "name": "catalog name", "gpu_cores": None})
        ingest_shard(central, shard)
        (device,) = central.devices()
        assert device["name"] == "catalog name"
        assert device["gpu_cores"] == 40


def test_truncated_shard_is_refused_and_store_unchanged(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    shard = tmp_path / "mac.parquet"
    export_shard(store, shard)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with Store(tmp_path / "central.duckdb") as central:
        fill(central, make_measurement, GPU)
        before = contents(central)
        with pytest.raises(BadShard) as err:
            ingest_shard(central, shard)
        assert str(err.value).startswith(f"{shard} is not a readable Parquet shard (")
        assert str(err.value).endswith("): re-export it")
        assert contents(central) == before


@pytest.mark.parametrize("name, content, says", [
    ("A100.json", b'{"cache": {}}', "it looks like JSON: a Kernel Tuner or KTT file goes in with `zmlx-pipeline import "),
    ("A100.json.gz", b"\x1f\x8b\x08\x00", "it looks like gzip: a Kernel Tuner or KTT file goes in with `zmlx-pipeline "
                                       "import "),
    ("s.parquet", b"version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 9\n",
     "it is a Git LFS pointer, not the shard: fetch it with `git lfs pull` in its repository"),
])
def test_a_file_that_is_no_shard_says_what_it_looks_like(tmp_path, name, content, says):
    path = tmp_path / name
    path.write_bytes(content)
    with Store(tmp_path / "central.duckdb") as central:
        with pytest.raises(BadShard) as err:
            ingest_shard(central, path)
        assert says in str(err.value) and "\n" not in str(err.value)
        assert central.measurements() == []


def test_shard_missing_columns_is_refused_listing_them(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    shard = tmp_path / "mac.parquet"
    export_shard(store, shard)
    table = pq.read_table(shard)
    pq.write_table(table.drop_columns(["status", "config_key"]), shard)
    with Store(tmp_path / "central.duckdb") as central:
        with pytest.raises(BadShard) as err:
            ingest_shard(central, shard)
        assert str(err.value) == (
            f"{shard} is missing shard columns config_key, status: re-export it with zmlx-pipeline export"
        )
        assert contents(central) == ([], [], [])


def test_shard_with_invalid_rows_rolls_back_devices_and_runs_too(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    shard = tmp_path / "mac.parquet"
    export_shard(store, shard)
    con = duckdb.connect()
    con.execute(
        "COPY (SELECT * REPLACE (CASE WHEN median_us IS NULL THEN 'exploded' ELSE status END AS status) "
        "FROM read_parquet(?)) TO 'PLACEHOLDER' (FORMAT parquet)".replace("PLACEHOLDER", str(tmp_path / "bad.parquet")),
        [str(shard)],
    )
    con.close()
    with Store(tmp_path / "central.duckdb") as central:
        with pytest.raises(BadShard, match=r"bad.parquet, row \d+: unknown status 'exploded'.*the store is unchanged"):
            ingest_shard(central, tmp_path / "bad.parquet")
        assert contents(central) == ([], [], [])
        assert ingest_shard(central, shard)["added"] == 6


def test_missing_shard_file_and_read_only_store(store, tmp_path):
    with pytest.raises(BadShard, match="no such shard file"):
        ingest_shard(store, tmp_path / "nope.parquet")
    with pytest.raises(BadShard, match="no such shard file or directory"):
        shard_paths(tmp_path / "nope")
    path = store.path
    store.close()
    with Store(path, read_only=True) as ro, pytest.raises(StoreError, match="open read-only"):
        ro.ingest_shard(tmp_path / "nope.parquet")


def test_query_shards_in_place_matches_ingested_summary(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    fill(store, make_measurement, GPU, configs=(32, 512), shapes=(1, 2, 3))
    shards = tmp_path / "shards"
    export_shard(store, shards / "mac.parquet", device=MAC)
    export_shard(store, shards / "gpu.parquet", device=GPU)
    (shards / "notes.txt").write_text("not a shard")
    assert query_shards(shards) == store.summary()
    assert query_shards(shards, device=GPU) == store.summary(device=GPU)
    assert query_shards(shards / "mac.parquet") == store.summary(device=MAC)
    (first, *_), timed = query_shards(shards, kernel="softmax"), store.summary(device=MAC, kernel="softmax")[0]
    assert first == {
        "device": MAC, "kernel": "softmax", "dtype": "float16", "measurements": 6,
        "by_status": {"ok": 4, "launch_error": 2}, "shapes": 2, "shapes_ok": 2,
        "first_measured_at": timed["first_measured_at"], "last_measured_at": timed["last_measured_at"],
    }
    assert first["first_measured_at"] is not None
    con = duckdb.connect()
    (n,) = con.execute("SELECT count(*) FROM read_parquet(?)", [str(shards / "*.parquet")]).fetchone()
    con.close()
    assert n == 12


def test_query_shards_empty_missing_and_broken(tmp_path, store, make_measurement):
    empty = tmp_path / "empty"
    empty.mkdir()
    assert query_shards(empty) == []
    with pytest.raises(BadShard, match="no such shard directory or file"):
        query_shards(tmp_path / "absent")
    fill(store, make_measurement, MAC)
    export_shard(store, empty / "good.parquet")
    (empty / "broken.parquet").write_bytes(b"PAR1 definitely not parquet")
    with pytest.raises(BadShard, match="cannot read shards"):
        query_shards(empty)


def test_shard_filename():
    when = datetime(2025, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
    assert shard_filename("Apple M3 Max (40-core)", when) == "apple-m3-max-40-core-20250304T050607Z.parquet"


def test_repeated_timings_travel_with_the_shard(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    first = store.measurements(status="ok")[0]
    run2 = store.start_run(MAC, host="h", backend="metal", mlx_version=None, pipeline_version="0.1.0",
                           settings={"repeat": True})
    store.record_repeat([make_measurement(run_id=run2, device_id=MAC, shape=first["shape"],
                                          config=first["config"], median_us=first["median_us"] * 1.03)])
    shard = tmp_path / "s.parquet"
    export_shard(store, shard)
    with Store(tmp_path / "central.duckdb") as central:
        ingest_shard(central, shard)
        pairs = central.repeat_pairs()
        assert len(pairs) == 1 and pairs[0]["repeat_us"] == pytest.approx(first["median_us"] * 1.03)
        ingest_shard(central, shard)  # idempotent for repeats too
        assert len(central.repeats()) == 1


def test_a_key_measured_again_keeps_its_newest_timing_in_either_order(make_measurement, tmp_path):
    """Re-timing a device (say with another timer) and ingesting it over the old data must not be
    'already present': the newer timing wins, and the old timing's repeats go with it."""
    def shard(name: str, median: float, when: datetime, repeat: float) -> object:
        with Store(tmp_path / f"{name}.duckdb") as s:
            run = fill(s, make_measurement, GPU, configs=(64,), shapes=(1,))
            s._conn.execute("UPDATE measurements SET median_us = ?, p10_us = ?, p90_us = ?, measured_at = ?",
                            [median, median, median, when])
            s._conn.execute("UPDATE runs SET started_at = ?", [when])  # a row is timed during its run
            s.record_repeat([make_measurement(run_id=run + "-rep", device_id=GPU, shape={"rows": 1, "cols": 1024},
                                              config={"TG": 64}, median_us=repeat)])
            path = tmp_path / f"{name}.parquet"
            export_shard(s, path)
        return path

    old = shard("old", 20.0, datetime(2026, 1, 1), 25.0)
    new = shard("new", 7.0, datetime(2026, 6, 1), 7.1)
    for order in ((old, new), (new, old)):
        with Store(tmp_path / f"central-{order[0].stem}.duckdb") as central:
            first = ingest_shard(central, order[0])
            second = ingest_shard(central, order[1])
            assert first == {"rows": 1, "added": 1, "skipped": 0}
            assert second == ({"rows": 1, "added": 0, "skipped": 0, "replaced": 1} if order[1] == new
                              else {"rows": 1, "added": 0, "skipped": 1})
            assert [m["median_us"] for m in central.measurements()] == [7.0]
            assert [p["repeat_us"] for p in central.repeat_pairs()] == [7.1]
            assert ingest_shard(central, new) == {"rows": 1, "added": 0, "skipped": 1}


def _rewrite(shard, out, replace_sql: str, where: str = "TRUE") -> None:
    """Copy `shard` to `out` with `replace_sql` (a REPLACE clause body) applied to the rows `where` picks."""
    con = duckdb.connect()
    con.execute(
        f"COPY (SELECT * REPLACE ({replace_sql}) FROM (SELECT *, row_number() OVER () AS _n FROM read_parquet(?)) "
        f"WHERE {where} UNION ALL BY NAME SELECT * FROM (SELECT *, row_number() OVER () AS _n FROM read_parquet(?)) "
        f"WHERE NOT ({where})) TO 'PLACEHOLDER' (FORMAT parquet)".replace("PLACEHOLDER", str(out)),
        [str(shard), str(shard)],
    )
    con.close()


BAD_ROWS = {
    "nan time": ("CAST('nan' AS DOUBLE) AS median_us", "status = 'ok'", "finite positive median_us"),
    "negative time": ("-3.0 AS median_us", "status = 'ok'", "finite positive median_us"),
    "zero time": ("0.0 AS median_us", "status = 'ok'", "finite positive median_us"),
    "infinite time": ("CAST('inf' AS DOUBLE) AS median_us", "status = 'ok'", "finite positive median_us"),
    "nan p90": ("CAST('nan' AS DOUBLE) AS p90_us", "status = 'ok'", "p10_us / p90_us"),
    "future timestamp": ("TIMESTAMP '2999-01-01 00:00:00' AS measured_at", "TRUE", "in the future"),
    "no timestamp": ("NULL::TIMESTAMP AS measured_at", "_n = 4",
                     "row 1: measured_at is missing (every row says when it was timed); nothing"),
    "config not json": ("'{TG: 64' AS config", "TRUE", "config is not a JSON object"),
    "config a list": ("'[64]' AS config", "TRUE", "config is not a JSON object"),
    "shape not json": ("'rows=4' AS shape", "TRUE", "shape is not a JSON object"),
    "negative samples": ("-1 AS samples", "TRUE", "samples must be a whole number from 0"),
    "fractional samples": ("2.7::DOUBLE AS samples", "TRUE", "samples must be a whole number, not 2.7"),
    "fractional core count": ("40.5::DOUBLE AS device_gpu_cores", "TRUE",
                              "device_gpu_cores must be a whole number, not 40.5"),
    "kernel with a trailing space": ("'softmax ' AS kernel", "TRUE", "kernel 'softmax ' starts or ends with white space"),
    "kernel in another case": ("'SoftMax' AS kernel", "TRUE",
                               "kernel 'SoftMax' differs from the built-in kernel 'softmax' only in case"),
    "device id with a trailing space": (f"'{MAC} ' AS device_id", "TRUE",
                                        f"device_id '{MAC} ' starts or ends with white space"),
    "device id in upper case": (f"'{MAC.upper()}' AS device_id", "TRUE", f"device_id '{MAC.upper()}' is not a device id"),
    "device id with a bad core limit": (f"'{MAC}@0sm' AS device_id", "TRUE", f"device_id '{MAC}@0sm' is not a device id"),
    "repeat at no time": ("""'[{"run_id":"r","median_us":1.5,"measured_at":"yesterday"}]' AS repeats""", "TRUE",
                          "a repeat's measured_at is not a timestamp: 'yesterday'"),
    "key of another config": ("'sha256:0000000000000000' AS config_key", "TRUE", "is not the key of config"),
    "config naming a key twice": ("""'{"TG":64,"TG":128}' AS config""", "_n = 1",
                                  """config names the key 'TG' twice: '{"TG":64,"TG":128}'; write each key once"""),
    "config naming a key twice alike": ("""'{"TG":64,"TG":64}' AS config""", "_n = 1",
                                        "config names the key 'TG' twice"),
    "shape naming a key twice": ("""'{"cols":1024,"rows":1,"rows":2}' AS shape""", "_n = 1",
                                 """shape names the key 'rows' twice: '{"cols":1024,"rows":1,"rows":2}'"""),
    "config missing a parameter": (f"""'{{"VEC":1}}' AS config, '{mapping_key({"VEC": 1})}' AS config_key""",
                                   "_n = 2", "config names parameters"),
    # what the store's own checks let through
    "shape size as text": ("""'{"cols":1024,"rows":"big"}' AS shape""", "_n = 2", "rows='big' is not a positive integer"),
    "zero shape size": ("""'{"cols":0,"rows":1}' AS shape""", "TRUE", "cols=0 is not a positive integer"),
    "negative shape size": ("""'{"cols":1024,"rows":-4}' AS shape""", "TRUE", "rows=-4 is not a positive integer"),
    "fractional shape size": ("""'{"cols":1024,"rows":1.5}' AS shape""", "TRUE", "rows=1.5 is not a positive integer"),
    "shape size past an array dimension": ("""'{"cols":1024,"rows":4294967296}' AS shape""", "TRUE",
                                           "rows=4294967296 is larger than an array dimension can be"),
    "dims of another kernel": ("""'{"depth":7}' AS shape""", "_n = 3",
                               "kernel 'softmax' is built in, with shape dims rows, cols, not depth"),
    "config value as text": ("""'{"TG":"x"}' AS config""", "TRUE", "whose parameters are integers, not TG='x'"),
    "config value null": ("""'{"TG":null}' AS config""", "TRUE", "whose parameters are integers, not TG=None"),
    "parameter of another kernel": ("""'{"threadgroup":64}' AS config""", "TRUE",
                                    "kernel 'softmax' is built in, with parameters CACHE, ROWS, TG, VEC, not threadgroup"),
    "kernel not in NFC": ("'cafe\u0301' AS kernel", "TRUE",
                          "kernel 'cafe\\u0301' is not in Unicode's composed form (NFC), which writes it 'caf\\xe9'"),
    "fullwidth built-in kernel": ("'\uff53\uff4f\uff46\uff54\uff4d\uff41\uff58' AS kernel", "TRUE",
                                  "differs from the built-in kernel 'softmax' only in case, white space or Unicode "
                                  "compatibility form (NFKC)"),
    "config value past int64": ("""'{"TG":9223372036854775808}' AS config""", "TRUE",
                                "config parameter TG=9223372036854775808 is an integer outside int64"),
    "config value nan": ("""'{"TG":NaN}' AS config""", "TRUE", "config parameter TG=nan is not a finite number"),
    "timestamp of year 1": ("TIMESTAMP '0001-01-01 00:00:00' AS measured_at", "TRUE",
                            "row 1: measured_at 0001-01-01 00:00:00 is before 2000-01-01, earlier than any timing"),
    "timestamp before its run started": ("TIMESTAMP '2001-01-01 00:00:00' AS measured_at", "TRUE",
                                         "row 1: measured_at 2001-01-01 00:00:00 is before its run started"),
    "unknown dtype": ("'float64' AS dtype", "TRUE", "dtype 'float64' is not one the store holds"),
    "empty dtype": ("'' AS dtype", "TRUE", "dtype '' is not one the store holds"),
    "empty device id": ("'' AS device_id", "TRUE", "device_id is empty"),
    "empty kernel": ("'' AS kernel", "TRUE", "kernel is empty"),
    "kernel of 300 characters": (f"'{'k' * 300}' AS kernel", "TRUE",
                                 f"kernel {'k' * 40!r}... (300 characters) is longer than 100 characters, the most a "
                                 "name may hold (5 more rows like it); nothing"),
    "device id of 200 characters": (f"'{'d' * 200}' AS device_id", "TRUE",
                                    f"device_id {'d' * 40!r}... (200 characters) is longer than 100 characters"),
    "dtype of 300 characters": (f"'{'f' * 300}' AS dtype", "TRUE", f"dtype {'f' * 40!r}... (300 characters) is not "
                                "one the store holds"),
    "config its kernel excludes": ("""'{"TG":999999}' AS config""", "status = 'ok'",
                                   "breaks its constraint 'TG <= max_threads'"),
    "p10 above p90": ("1000.0 AS p10_us, 1.0 AS p90_us", "status = 'ok'", "p10_us <= median_us <= p90_us does not hold"),
    "no samples": ("0 AS samples", "status = 'ok'", "an ok row is timed by 1 sample or more, not 0"),
    "repeat of nan": ("""'[{"run_id":"r","median_us":NaN,"measured_at":"2026-01-01 00:00:00"}]' AS repeats""", "TRUE",
                      "a repeat needs a finite positive median_us, not nan"),
    "repeat of -1": ("""'[{"run_id":"r","median_us":-1,"measured_at":"2026-01-01 00:00:00"}]' AS repeats""", "TRUE",
                     "a repeat needs a finite positive median_us, not -1"),
    "repeats not json": ("'not json' AS repeats", "_n = 4", "repeats is not a JSON list"),
    "repeat in the future": ("""'[{"run_id":"r","median_us":1.5,"measured_at":"2999-01-01 00:00:00"}]' AS repeats""",
                             "TRUE", "a repeat's measured_at 2999-01-01 00:00:00 is in the future"),
    "repeat of 1990": ("""'[{"run_id":"r","median_us":1.5,"measured_at":"1990-01-01 00:00:00"}]' AS repeats""", "TRUE",
                       "a repeat's measured_at 1990-01-01 00:00:00 is before 2000-01-01"),
    "repeat of 1e300 us": ("""'[{"run_id":"r","median_us":1e300,"measured_at":"2026-01-01 00:00:00"}]' AS repeats""",
                           "status = 'ok'", "a repeat's median_us 1e+300 is more than 1000x from the row's"),
    "repeat of a millionth": ("""'[{"run_id":"r","median_us":1e-9,"measured_at":"2026-01-01 00:00:00"}]' AS repeats""",
                              "status = 'ok'", "a repeat's median_us 1e-09 is more than 1000x from the row's"),
    "repeat of the row's own run": (
        """'[{"run_id":"' || run_id || '","median_us":1.5,"measured_at":"2026-01-01 00:00:00"}]' AS repeats""",
        "TRUE", "is the row's own run: a repeat is the key timed again in another run"),
    # the device's figures and JSON, which every later step reads
    "device reported not json": ("'not json{' AS device_reported", "TRUE", "device_reported must be a JSON object"),
    "device reported nested too deep": (f"'{'[' * 100000}' AS device_reported", "TRUE",
                                        "device_reported must be a JSON object"),
    "device reported huge number": (f"'{'9' * 5000}' AS device_reported", "TRUE", "device_reported must be a JSON object"),
    "run settings a list": ("'[1]' AS run_settings", "TRUE", "run_settings must be a JSON object"),
    "run settings of inf": ("""'{"repeats": 1e999}' AS run_settings""", "TRUE",
                            "run_settings holds the number 1e999, which is not finite: write it as strict JSON"),
    "device reported nan": ("""'{"memory": NaN}' AS device_reported""", "TRUE",
                            "device_reported holds the number NaN, which is not finite"),
    # what collect keeps beside a timing: a JSON object, read back by every reader of the row
    "extra not json": ("'{bad' AS extra", "_n = 2", "row 1: extra must be a JSON object, not '{bad'; nothing"),
    "extra of inf": ("""'{"chain": 1e999}' AS extra""", "TRUE", "extra holds the number 1e999, which is not finite"),
    "extra of -Infinity": ("""'{"chain": -Infinity}' AS extra""", "TRUE",
                           "extra holds the number -Infinity, which is not finite"),
    "extra a list": ("'[1]' AS extra", "TRUE", "extra must be a JSON object, not '[1]'"),
    "negative core count": ("-3 AS device_gpu_cores", "TRUE", "device_gpu_cores must be a finite number above 0"),
    "infinite clock": ("CAST('inf' AS DOUBLE) AS device_clock_mhz", "TRUE",
                       "device_clock_mhz must be a finite number above 0"),
    # NaN equals nothing, not even itself: the row holding it must still be found and named
    "nan bandwidth": ("CAST('nan' AS DOUBLE) AS device_memory_bandwidth_gbps", "_n = 3",
                      "row 1: device_memory_bandwidth_gbps must be a finite number above 0, not nan; nothing"),
    "nan clock": ("CAST('nan' AS DOUBLE) AS device_clock_mhz", "TRUE",
                  "row 1: device_clock_mhz must be a finite number above 0, not nan (5 more rows like it)"),
    "nan memory": ("CAST('nan' AS DOUBLE) AS device_memory_gb", "TRUE",
                   "device_memory_gb must be a finite number above 0, not nan"),
}


@pytest.mark.parametrize("case", sorted(BAD_ROWS))
def test_a_bad_row_refuses_the_shard_naming_file_row_and_reason(case, store, make_measurement, tmp_path):
    replace_sql, where, reason = BAD_ROWS[case]
    fill(store, make_measurement, MAC)
    shard = tmp_path / "mac.parquet"
    export_shard(store, shard)
    bad = tmp_path / "bad.parquet"
    _rewrite(shard, bad, replace_sql, where)
    with Store(tmp_path / "central.duckdb") as central:
        assert ingest_shard(central, shard)["added"] == 6
        before = contents(central)
        with pytest.raises(BadShard) as info:
            ingest_shard(central, bad)
        message = str(info.value)
        assert "\n" not in message
        assert message.startswith(f"{bad}, row ") and reason in message, message
        assert message.endswith("nothing was ingested, the store is unchanged")
        assert contents(central) == before


def test_the_store_itself_refuses_an_over_long_name_showing_it_shortened(make_measurement, tmp_path):
    """Store.ingest_shard, called directly, applies the same limit to every name it stores (a long dtype is first
    refused as no dtype the store holds)."""
    with Store(tmp_path / "a.duckdb") as a:
        fill(a, make_measurement, MAC)
        a.export_shard(tmp_path / "good.parquet")
    for column in ("kernel", "run_id", "kernel_version", "device_id", "dtype"):
        long = "k" * 101 if column != "device_id" else "d" * 101
        _rewrite(tmp_path / "good.parquet", tmp_path / "long.parquet", f"'{long}' AS {column}")
        with Store(tmp_path / "central.duckdb") as central:
            with pytest.raises(BadShard) as info:
                central.ingest_shard(tmp_path / "long.parquet")
            why = ("is not one the store holds (float16, bfloat16, float32)" if column == "dtype" else
                   "is longer than 100 characters, the most a name may hold")
            assert str(info.value) == (f"{tmp_path / 'long.parquet'}, row 1: {column} {long[:40]!r}... (101 "
                                       f"characters) {why} (5 more rows like it); nothing was ingested, the store is "
                                       "unchanged")
            assert contents(central) == ([], [], [])


def test_a_bad_ok_row_never_replaces_a_good_timing(make_measurement, tmp_path):
    with Store(tmp_path / "a.duckdb") as a:
        fill(a, make_measurement, MAC)
        a.export_shard(tmp_path / "good.parquet")
    _rewrite(tmp_path / "good.parquet", tmp_path / "bad.parquet",
             "CAST('nan' AS DOUBLE) AS median_us, TIMESTAMP '2100-01-01' AS measured_at", "status = 'ok'")
    with Store(tmp_path / "central.duckdb") as central:
        ingest_shard(central, tmp_path / "good.parquet")
        good = contents(central)
        with pytest.raises(BadShard):
            ingest_shard(central, tmp_path / "bad.parquet")
        assert contents(central) == good


def test_a_timing_of_the_same_key_and_time_with_another_result_is_refused_not_dropped(make_measurement, tmp_path):
    """Of two timings at one time neither is newer: one of them would be lost as 'already present'."""
    with Store(tmp_path / "a.duckdb") as a:
        fill(a, make_measurement, MAC)
        a.export_shard(tmp_path / "good.parquet")
    _rewrite(tmp_path / "good.parquet", tmp_path / "other.parquet",
             "median_us * 1.01 AS median_us, p10_us * 1.01 AS p10_us, p90_us * 1.01 AS p90_us", "status = 'ok'")
    con = duckdb.connect()  # the shard twice, once with other results: conflicting rows within one file
    con.execute(f"COPY (SELECT * FROM read_parquet(['{tmp_path / 'good.parquet'}', '{tmp_path / 'other.parquet'}'])) "
                f"TO '{tmp_path / 'both.parquet'}' (FORMAT parquet)")
    con.execute(f"COPY (SELECT * FROM read_parquet(['{tmp_path / 'good.parquet'}', '{tmp_path / 'good.parquet'}'])) "
                f"TO '{tmp_path / 'twice.parquet'}' (FORMAT parquet)")
    con.close()
    with Store(tmp_path / "central.duckdb") as central:
        ingest_shard(central, tmp_path / "good.parquet")
        good = contents(central)
        with pytest.raises(BadShard, match=r"other\.parquet, row \d+: .* timed this config and shape at .* already, "
                                           r"with another result .*neither replaces the other"):
            ingest_shard(central, tmp_path / "other.parquet")
        assert contents(central) == good
        assert ingest_shard(central, tmp_path / "good.parquet")["skipped"] == len(good[0])  # an exact repeat passes
    with Store(tmp_path / "fresh.duckdb") as fresh:
        with pytest.raises(BadShard, match=r"both\.parquet, row \d+: same device, config, shape and time as row 1 "):
            ingest_shard(fresh, tmp_path / "both.parquet")
        assert contents(fresh) == ([], [], [])
        rows = ingest_shard(fresh, tmp_path / "twice.parquet")  # the same rows twice in one file: one of each
        assert rows["added"] == rows["skipped"] == len(good[0])


def _two_shards(make_measurement, tmp_path, b_name="b.parquet"):
    """tmp_path/shards holding a.parquet (the Mac's rows) and, at `b_name` below it, the GPU's; returns the folder."""
    shards = tmp_path / "shards"
    with Store(tmp_path / "a.duckdb") as a:
        fill(a, make_measurement, MAC)
        a.export_shard(shards / "a.parquet")
    with Store(tmp_path / "b.duckdb") as b:
        fill(b, make_measurement, GPU)
        b.export_shard(shards / b_name)
    return shards


def test_a_directory_ingest_is_all_or_nothing(make_measurement, tmp_path):
    shards = _two_shards(make_measurement, tmp_path)
    _rewrite(shards / "b.parquet", shards / "c.parquet", "-1.0 AS median_us", "status = 'ok'")
    with Store(tmp_path / "central.duckdb") as central:
        with pytest.raises(BadShard, match=r"c\.parquet, row \d+: an ok row needs a finite positive median_us"):
            ingest_shards(central, [shards])
        assert contents(central) == ([], [], [])  # a.parquet and b.parquet, checked first, did not go in either
        (shards / "c.parquet").unlink()
        assert ingest_shards(central, [shards])["files"] == 2


def test_a_directory_stands_for_the_shards_below_it_hidden_ones_left_out(make_measurement, tmp_path):
    shards = _two_shards(make_measurement, tmp_path, "nested/deeper/b.parquet")
    # hidden copies (a notebook's checkpoints, an export under way) are never read, even broken ones
    for hidden in (shards / ".ipynb_checkpoints" / "a-checkpoint.parquet", shards / ".a.parquet.tmp-1.parquet"):
        hidden.parent.mkdir(exist_ok=True)
        hidden.write_bytes(b"not parquet")
    assert shard_paths(shards) == [shards / "a.parquet", shards / "nested" / "deeper" / "b.parquet"]
    with Store(tmp_path / "central.duckdb") as central:
        assert ingest_shards(central, [shards])["added"] == 12
        assert {d["device_id"] for d in central.devices()} == {MAC, GPU}


def test_a_shard_named_twice_is_read_once_and_counted_once(make_measurement, tmp_path):
    """Its folder and itself, or two paths to one file: its rows are added once and the counts say so (they used to
    count every row as already present although the rows went in)."""
    shards = _two_shards(make_measurement, tmp_path)
    with Store(tmp_path / "central.duckdb") as central:
        result = ingest_shards(central, [shards, shards / "a.parquet", tmp_path / "shards" / "." / "b.parquet"])
        assert result["files"] == 2 and result["added"] == 12 and result["skipped"] == 0
        again = ingest_shards(central, [shards / "a.parquet", shards / "a.parquet"])
        assert again["files"] == 1 and again["added"] == 0 and again["skipped"] == 6


def test_a_fifo_below_a_shard_directory_is_refused_in_one_line_never_skipped(make_measurement, tmp_path):
    import os

    from click.testing import CliRunner

    from zmlx_pipeline.pipeline.cli import cli

    shards = tmp_path / "shards"
    with Store(tmp_path / "a.duckdb") as a:
        fill(a, make_measurement, MAC)
        a.export_shard(shards / "a.parquet")
    (shards / "sub").mkdir()
    os.mkfifo(shards / "sub" / "pipe.parquet")
    db = tmp_path / "central.duckdb"
    result = CliRunner().invoke(cli, ["ingest", "--db", str(db), str(shards)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output == (f"Error: {shards / 'sub' / 'pipe.parquet'}: a FIFO (named pipe), not a shard file; "
                             f"remove it from {shards} or name the shards to ingest; nothing was ingested, the store "
                             "is unchanged\n")
    assert not db.exists()


def test_an_empty_directory_is_an_error_not_a_silent_success(store, tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(BadShard, match="no .parquet shard in this directory"):
        ingest_shards(store, [tmp_path / "empty"])


def test_a_failed_row_may_hold_a_config_its_kernel_excludes_and_a_device_may_be_new(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    shard = tmp_path / "mac.parquet"
    export_shard(store, shard)
    failed = tmp_path / "failed.parquet"  # TG 999999 is why the launch failed
    _rewrite(shard, failed, f"""'{{"TG":999999}}' AS config, '{mapping_key({"TG": 999999})}' AS config_key""",
             "status = 'launch_error'")
    new = tmp_path / "new.parquet"  # a GPU the catalog does not have yet: the shard carries what it reported
    _rewrite(shard, new, "'nvidia-rtx-9090' AS device_id, FALSE AS device_in_catalog")
    with Store(tmp_path / "central.duckdb") as central:
        assert ingest_shards(central, [failed, new])["added"] == 12
        assert {d["device_id"] for d in central.devices()} == {MAC, "nvidia-rtx-9090"}


CATALOG_CONTRADICTIONS = {
    "relabelled as an Apple chip": ("'apple-m3-max-40c' AS device_id",
                                    "device_vendor is 'nvidia', but the catalog gives apple-m3-max-40c 'apple'"),
    "bandwidth far below the chip's": (
        "1.0 AS device_memory_bandwidth_gbps",
        "device_memory_bandwidth_gbps is 1.0, but the catalog gives nvidia-h100-sxm 3350"),
    "core limit above the chip's": (f"'{GPU}@999sm' AS device_id, 999 AS device_gpu_cores, '{GPU}' AS "
                                    "device_core_limited_from",
                                    f"device_id '{GPU}@999sm' limits {GPU} to 999 SMs, but it has 132"),
    "core limit with the whole chip's count": (f"'{GPU}@66sm' AS device_id, '{GPU}' AS device_core_limited_from",
                                               f"device_gpu_cores is 132, but the catalog gives {GPU}@66sm 66"),
    "core limit of the whole chip's count": (f"'{GPU}@132sm' AS device_id, 132 AS device_gpu_cores, '{GPU}' AS "
                                             "device_core_limited_from",
                                             f"device_id '{GPU}@132sm' limits {GPU} to 132 SMs, but it has 132"),
    "core limit of an Apple chip, whose cores are no SMs": (
        "'apple-m3-8c@4sm' AS device_id, 4 AS device_gpu_cores, 'apple-m3-8c' AS device_core_limited_from",
        "device_id 'apple-m3-8c@4sm' limits apple-m3-8c to 4 SMs, but its cores are GPU cores, not SMs; a core limit "
        "(@<N>sm, CUDA MPS) is only of an NVIDIA chip"),
    "core-limited id limited from nothing": (f"'{GPU}@66sm' AS device_id, 66 AS device_gpu_cores",
                                             f"device_core_limited_from is None, but {GPU}@66sm is limited from {GPU}; "
                                             "a core-limited device names the chip it is limited from"),
    "core-limited id limited from another chip": (
        f"'{GPU}@66sm' AS device_id, 66 AS device_gpu_cores, 'nvidia-h200' AS device_core_limited_from",
        f"device_core_limited_from is 'nvidia-h200', but {GPU}@66sm is limited from {GPU}; a core-limited device "
        "names the chip it is limited from"),
    "another simd width": ("64 AS device_simd_width", f"device_simd_width is 64, but the catalog gives {GPU} 32"),
    "another chip's name": ("'Fake name' AS device_name",
                            f"device_name is 'Fake name', but the catalog names {GPU} 'NVIDIA H100 SXM5 80GB'"),
    "a core limit under another name": (
        f"'{GPU}@32sm' AS device_id, 32 AS device_gpu_cores, '{GPU}' AS device_core_limited_from, 'Fake name' AS "
        "device_name, 'NVIDIA H100 80GB HBM3' AS device_reported_name",
        f"device_name is 'Fake name', but the catalog names {GPU}@32sm 'NVIDIA H100 SXM5 80GB [32 SMs]' or "
        "'NVIDIA H100 80GB HBM3 [32 SMs]'"),
}


@pytest.mark.parametrize("case", sorted(CATALOG_CONTRADICTIONS))
def test_device_columns_that_contradict_the_catalog_are_refused(case, store, make_measurement, tmp_path):
    replace_sql, says = CATALOG_CONTRADICTIONS[case]
    fill(store, make_measurement, GPU)
    shard = tmp_path / "gpu.parquet"
    export_shard(store, shard)
    bad = tmp_path / "bad.parquet"
    _rewrite(shard, bad, replace_sql)
    with Store(tmp_path / "central.duckdb") as central:
        # the entry point, and the store's own methods called directly
        for ingest in (ingest_shards, Store.ingest_shards, lambda store, paths: store.ingest_shard(paths[0])):
            with pytest.raises(BadShard) as info:
                ingest(central, [bad])
            tail = ("; a core limit is below the chip's count (the whole chip is its own id)" if "SMs, but it has" in
                    says else "" if "core-limited device" in says or "CUDA MPS" in says else
                    "; a shard of a catalog device gives the catalog's figures (or none): correct its device_id or "
                    "that column")
            assert str(info.value) == (f"{bad}, row 1: {says}{tail} (5 more rows like it); nothing was ingested, the "
                                       "store is unchanged")
            assert contents(central) == ([], [], [])


def test_a_core_limited_chip_and_figures_left_empty_pass_the_catalog_check(store, make_measurement, tmp_path):
    fill(store, make_measurement, GPU)
    shard = tmp_path / "gpu.parquet"
    export_shard(store, shard)
    limited, empty = tmp_path / "limited.parquet", tmp_path / "empty.parquet"
    _rewrite(shard, limited, f"'{GPU}@66sm' AS device_id, 66 AS device_gpu_cores, '{GPU}' AS device_core_limited_from, "
             "'NVIDIA H100 SXM5 80GB [66 SMs]' AS device_name")
    _rewrite(shard, empty, "NULL::DOUBLE AS device_memory_bandwidth_gbps, NULL::VARCHAR AS device_vendor")
    with Store(tmp_path / "central.duckdb") as central:
        assert ingest_shards(central, [limited, empty])["added"] == 12
        assert {d["device_id"]: d["gpu_cores"] for d in central.devices()} == {GPU: 132, f"{GPU}@66sm": 66}


# A device the catalog lacks has no catalog row to compare with; its kind is still one of the catalog's, and a core
# limit names the device its id is limited from (bundle loading refuses a profile of anything else).
KIND_REFUSALS = [
    pytest.param("'vulkan' AS device_backend",
                 "device_backend is 'vulkan', none of the catalog's (metal, cuda, rocm)", id="backend"),
    pytest.param("'warps' AS device_core_unit",
                 "device_core_unit is 'warps', none of the catalog's (gpu_cores, sms, cus)", id="core_unit"),
    pytest.param("'intel' AS device_vendor",
                 "device_vendor is 'intel', none of the catalog's (apple, nvidia, amd)", id="vendor"),
    pytest.param("'acme-x1@10sm' AS device_id, 10 AS device_gpu_cores, 'acme-x2' AS device_core_limited_from",
                 "device_core_limited_from is 'acme-x2', but acme-x1@10sm is limited from acme-x1; a core-limited "
                 "device names the device it is limited from", id="core_limited_from-mismatched"),
    pytest.param("'acme-x1@10sm' AS device_id, 10 AS device_gpu_cores",
                 "device_core_limited_from is None, but acme-x1@10sm is limited from acme-x1; a core-limited device "
                 "names the device it is limited from", id="core_limited_from-missing"),
    pytest.param("'acme-x1' AS device_core_limited_from",
                 f"device_core_limited_from is 'acme-x1', but {MAC} is no core limit (<id>@<N>sm); only a "
                 "core-limited device names the device it is limited from", id="core_limited_from-of-no-limit"),
]


@pytest.mark.parametrize("replace_sql, says", KIND_REFUSALS)
def test_a_device_the_catalog_lacks_of_another_kind_or_core_limit_is_refused_at_ingest(
        replace_sql, says, store, make_measurement, tmp_path):
    from click.testing import CliRunner

    from zmlx_pipeline.pipeline.cli import cli

    fill(store, make_measurement, MAC)
    export_shard(store, tmp_path / "mac.parquet")
    bad = tmp_path / "bad.parquet"
    _rewrite(tmp_path / "mac.parquet", bad, replace_sql)
    db = tmp_path / "central.duckdb"
    with Store(db) as central:
        fill(central, make_measurement, GPU)
    before = db.read_bytes()
    result = CliRunner().invoke(cli, ["ingest", "--db", str(db), str(bad)])
    assert result.exit_code == 1, result.output
    assert result.output == (f"Error: {bad}, row 1: {says} (5 more rows like it); nothing was ingested, the store is "
                             "unchanged\n")
    assert db.read_bytes() == before


def test_a_legitimate_device_the_catalog_lacks_still_ingests_and_exports_again(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    shard = tmp_path / "mac.parquet"
    export_shard(store, shard)
    unknown, limited = tmp_path / "unknown.parquet", tmp_path / "limited.parquet"
    _rewrite(shard, unknown, "'nvidia-rtx-9090' AS device_id, 'nvidia' AS device_vendor, 'cuda' AS device_backend, "
             "'sms' AS device_core_unit, FALSE AS device_in_catalog")
    _rewrite(shard, limited, "'nvidia-rtx-9090@10sm' AS device_id, 'nvidia' AS device_vendor, 'cuda' AS "
             "device_backend, 'sms' AS device_core_unit, 10 AS device_gpu_cores, 'nvidia-rtx-9090' AS "
             "device_core_limited_from")
    with Store(tmp_path / "central.duckdb") as central:
        assert ingest_shards(central, [unknown, limited])["added"] == 12
        rows = {d["device_id"]: (d["backend"], d["core_unit"], d["core_limited_from"]) for d in central.devices()}
        assert rows == {"nvidia-rtx-9090": ("cuda", "sms", None),
                        "nvidia-rtx-9090@10sm": ("cuda", "sms", "nvidia-rtx-9090")}
        assert export_shard(central, tmp_path / "again.parquet") == 12
        with Store(tmp_path / "third.duckdb") as third:
            assert ingest_shard(third, tmp_path / "again.parquet")["added"] == 12
            assert contents(third) == contents(central)


TAMPERED_KINDS = [
    pytest.param(("UPDATE devices SET backend = 'vulkan'",), MAC, "backend is 'vulkan', none of the catalog's "
                 "(metal, cuda, rocm)", id="backend"),
    pytest.param(("UPDATE devices SET core_unit = 'warps'",), MAC, "core_unit is 'warps', none of the catalog's "
                 "(gpu_cores, sms, cus)", id="core_unit"),
    pytest.param(("UPDATE devices SET vendor = 'intel'",), MAC, "vendor is 'intel', none of the catalog's "
                 "(apple, nvidia, amd)", id="vendor"),
    pytest.param(("UPDATE devices SET device_id = 'acme-x1@10sm', core_limited_from = 'acme-x2'",
                  "UPDATE measurements SET device_id = 'acme-x1@10sm'"), "acme-x1@10sm",
                 "core_limited_from is 'acme-x2', but acme-x1@10sm is limited from acme-x1; a core-limited device "
                 "names the device it is limited from", id="core_limited_from-mismatched"),
    pytest.param(("UPDATE devices SET core_limited_from = 'acme-x1'",), MAC,
                 f"core_limited_from is 'acme-x1', but {MAC} is no core limit (<id>@<N>sm); only a core-limited "
                 "device names the device it is limited from", id="core_limited_from-of-no-limit"),
]


@pytest.mark.parametrize("sql, device, says", TAMPERED_KINDS)
def test_export_refuses_a_stored_device_row_no_ingest_would_take_in_one_line(sql, device, says, store,
                                                                             make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    for statement in sql:
        store._conn.execute(statement)
    with pytest.raises(CorruptStore) as info:
        store.export_shard(tmp_path / "out.parquet")
    assert str(info.value) == (
        f"store {store.path} holds a device row no ingest would take (devices table, {device}: {says}), so nothing "
        "was exported: it was changed outside zmlx-pipeline; restore it from a copy, or delete that row and ingest "
        "its shards again")
    assert not [p for p in tmp_path.iterdir() if ".parquet" in p.name]


def test_the_cli_refuses_to_export_a_device_row_of_another_backend_in_one_line(store, make_measurement, tmp_path):
    from click.testing import CliRunner

    from zmlx_pipeline.pipeline.cli import cli

    fill(store, make_measurement, MAC)
    store._conn.execute("UPDATE devices SET backend = 'vulkan'")
    store.close()
    result = CliRunner().invoke(cli, ["export", "--db", str(store.path), str(tmp_path / "out.parquet")])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "Traceback" not in result.output
    assert result.output.startswith(f"Error: store {store.path} holds a device row no ingest would take (devices "
                                    f"table, {MAC}: backend is 'vulkan', none of the catalog's (metal, cuda, rocm))")
    assert not (tmp_path / "out.parquet").exists()


def test_the_cli_refuses_a_relabelled_chip_in_one_line_and_stores_nothing(store, make_measurement, tmp_path):
    from click.testing import CliRunner

    from zmlx_pipeline.pipeline.cli import cli

    fill(store, make_measurement, GPU)
    export_shard(store, tmp_path / "gpu.parquet")
    _rewrite(tmp_path / "gpu.parquet", tmp_path / "apple.parquet", "'apple-m3-max-40c' AS device_id")
    db = tmp_path / "central.duckdb"
    with Store(db) as central:
        fill(central, make_measurement, MAC)
    before = db.read_bytes()
    result = CliRunner().invoke(cli, ["ingest", "--db", str(db), str(tmp_path / "apple.parquet")])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: {tmp_path / 'apple.parquet'}, row 1: device_vendor is 'nvidia', but "
                                    "the catalog gives apple-m3-max-40c 'apple'")
    assert db.read_bytes() == before


def test_the_cli_refuses_a_catalog_chip_under_another_name_and_stores_nothing(store, make_measurement, tmp_path):
    """A shard may not rename a catalog chip: the first shard of a device decides its stored row."""
    from click.testing import CliRunner

    from zmlx_pipeline.pipeline.cli import cli

    fill(store, make_measurement, GPU)
    export_shard(store, tmp_path / "gpu.parquet")
    _rewrite(tmp_path / "gpu.parquet", tmp_path / "renamed.parquet",
             f"'{GPU}@32sm' AS device_id, 32 AS device_gpu_cores, '{GPU}' AS device_core_limited_from, "
             "'Fake name' AS device_name")
    db = tmp_path / "central.duckdb"
    result = CliRunner().invoke(cli, ["ingest", "--db", str(db), str(tmp_path / "renamed.parquet")])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: {tmp_path / 'renamed.parquet'}, row 1: device_name is 'Fake name', but "
                                    f"the catalog names {GPU}@32sm 'NVIDIA H100 SXM5 80GB [32 SMs]'")
    assert not db.exists()


def test_every_committed_shard_passes_the_row_checks():
    shards = sorted((Path(__file__).resolve().parents[2] / "data").glob("*.parquet"))
    assert shards
    verdicts: dict = {}
    for shard in shards:
        check_shard(shard, verdicts)


def test_the_cli_refuses_a_bad_shard_in_one_line_and_ingests_nothing(store, make_measurement, tmp_path):
    from click.testing import CliRunner

    from zmlx_pipeline.pipeline.cli import cli

    fill(store, make_measurement, MAC)
    shard = tmp_path / "shards" / "good.parquet"
    export_shard(store, shard)
    _rewrite(shard, tmp_path / "shards" / "bad.parquet", """'{"cols":1024,"rows":"big"}' AS shape""", "_n = 5")
    db = tmp_path / "central.duckdb"
    with Store(db) as central:
        fill(central, make_measurement, GPU)
        before = contents(central)
    result = CliRunner().invoke(cli, ["ingest", "--db", str(db), str(tmp_path / "shards")])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.count("\n") == 1 and result.output.startswith(f"Error: {tmp_path / 'shards' / 'bad.parquet'}, row ")
    assert "rows='big' is not a positive integer" in result.output
    with Store(db, read_only=True) as central:
        assert contents(central) == before


def test_the_cli_refuses_extra_text_that_is_no_json_and_ingests_nothing(store, make_measurement, tmp_path):
    """A row whose extra no JSON reader takes would make every later read of the store fail: refused at the door."""
    from click.testing import CliRunner

    from zmlx_pipeline.pipeline.cli import cli

    fill(store, make_measurement, MAC)
    export_shard(store, tmp_path / "good.parquet")
    _rewrite(tmp_path / "good.parquet", tmp_path / "bad.parquet", "'{bad' AS extra", "_n = 3")
    db = tmp_path / "central.duckdb"
    result = CliRunner().invoke(cli, ["ingest", "--db", str(db), str(tmp_path / "bad.parquet")])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: {tmp_path / 'bad.parquet'}, row 1: extra must be a JSON object, "
                                    "not '{bad'; nothing was ingested")
    assert not db.exists()


@pytest.mark.parametrize("key, value, says", [
    ("schema_version", "99", " was written by a newer zmlx-pipeline (store schema 99; this one reads up to 3): upgrade "
                             "zmlx-pipeline to ingest it"),
    ("zmlx_pipeline_shard", "2", " was written by a newer zmlx-pipeline (shard format 2; this one reads up to 1): "
                                 "upgrade zmlx-pipeline to ingest it"),
    ("schema_version", "3.0", ": its metadata gives schema_version '3.0', not a version (a whole number from 1): "
                              "re-export it with zmlx-pipeline export"),
    ("schema_version", "", ": its metadata gives schema_version '', not a version"),
    ("zmlx_pipeline_shard", "one", ": its metadata gives zmlx_pipeline_shard 'one', not a version"),
], ids=["newer schema", "newer format", "fractional", "empty", "words"])
def test_a_shard_of_a_version_this_code_does_not_write_is_refused_in_one_line(key, value, says, store,
                                                                              make_measurement, tmp_path):
    """A newer shard's rows may mean what this code cannot tell: it is refused, never read as if it were its own."""
    from click.testing import CliRunner

    from zmlx_pipeline.pipeline.cli import cli

    fill(store, make_measurement, MAC)
    export_shard(store, tmp_path / "good.parquet")
    table = pq.read_table(tmp_path / "good.parquet")
    assert table.schema.metadata[b"schema_version"] == b"3"  # what export writes
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, key.encode(): value.encode()}),
                   tmp_path / "odd.parquet")
    db = tmp_path / "central.duckdb"
    with Store(db) as central:
        fill(central, make_measurement, GPU)
        before = contents(central)
    result = CliRunner().invoke(cli, ["ingest", "--db", str(db), str(tmp_path / "odd.parquet")])
    assert result.exit_code == 1 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"Error: {tmp_path / 'odd.parquet'}{says}"), result.output
    assert result.output.endswith("; nothing was ingested, the store is unchanged\n")
    with Store(db, read_only=True) as central:
        assert contents(central) == before
    # without the versions (a shard another tool wrote) its columns alone decide
    pq.write_table(table.replace_schema_metadata({}), tmp_path / "plain.parquet")
    with Store(db) as central:
        assert ingest_shard(central, tmp_path / "plain.parquet")["added"] == 6


def test_a_path_that_is_no_regular_file_is_refused_unread(store, tmp_path):
    import os

    os.mkfifo(tmp_path / "pipe.parquet")
    with pytest.raises(BadShard, match=r"pipe.parquet: a FIFO \(named pipe\), not a shard file or a directory of them"):
        ingest_shards(store, [tmp_path / "pipe.parquet"])
    with pytest.raises(BadShard, match="/dev/zero: a character device, not a shard file"):
        ingest_shards(store, ["/dev/zero"])
    assert contents(store) == ([], [], [])


@pytest.mark.parametrize("replace_sql, column, says", [
    ("CAST(measured_at AS VARCHAR) AS measured_at", "measured_at", "is VARCHAR, but a shard's measured_at is a timestamp"),
    ("CAST(median_us AS VARCHAR) AS median_us", "median_us", "is VARCHAR, but a shard's median_us is a number"),
])
def test_a_column_of_another_type_is_refused_naming_the_file_column_and_type(replace_sql, column, says, store,
                                                                            make_measurement, tmp_path):
    """A column of the wrong type gets the same clear line whichever column it is (not DuckDB's binder error)."""
    fill(store, make_measurement, MAC)
    shard = tmp_path / "mac.parquet"
    export_shard(store, shard)
    bad = tmp_path / "bad.parquet"
    _rewrite(shard, bad, replace_sql)
    with Store(tmp_path / "central.duckdb") as central:
        for ingest in (ingest_shard, Store.ingest_shard):  # the entry point and the store's own check
            with pytest.raises(BadShard) as info:
                ingest(central, bad)
            assert str(info.value).startswith(f"{bad}: column {column} {says}"), str(info.value)
            assert "\n" not in str(info.value) and str(info.value).endswith("the store is unchanged")
        assert contents(central) == ([], [], [])


def test_timings_written_as_float32_by_pyarrow_are_refused_saying_to_write_float64(store, make_measurement, tmp_path):
    """1.728 as a 32-bit float is 1.7280000448...: the row would fail its p10 <= median <= p90 check, confusingly."""
    import pyarrow as pa

    fill(store, make_measurement, MAC)
    export_shard(store, tmp_path / "mac.parquet")
    table = pq.read_table(tmp_path / "mac.parquet")
    for column in ("median_us", "p10_us", "p90_us"):
        table = table.set_column(table.schema.get_field_index(column), column, table[column].cast(pa.float32()))
    pq.write_table(table, tmp_path / "f32.parquet")
    clock = pq.read_table(tmp_path / "mac.parquet")
    at = clock.schema.get_field_index("device_clock_mhz")
    pq.write_table(clock.set_column(at, "device_clock_mhz", pa.array([1398.0] * clock.num_rows, pa.float32())),
                   tmp_path / "clock.parquet")
    with Store(tmp_path / "central.duckdb") as central:
        for column, shard in (("median_us", tmp_path / "f32.parquet"),
                              ("device_clock_mhz", tmp_path / "clock.parquet")):
            for ingest in (ingest_shards, Store.ingest_shards):  # the entry point and the store's own check
                with pytest.raises(BadShard) as info:
                    ingest(central, [shard])
                assert str(info.value) == (
                    f"{shard}: column {column} is FLOAT, but a shard's {column} is a number (DOUBLE): write it as "
                    "float64 (a 32-bit float changes the value), or re-export it with zmlx-pipeline export; nothing "
                    "was ingested, the store is unchanged")
        assert contents(central) == ([], [], [])


def test_a_shard_naming_a_column_twice_is_refused(store, make_measurement, tmp_path):
    """DuckDB would read the second median_us as median_us_1 and ignore it."""
    import pyarrow as pa

    fill(store, make_measurement, MAC)
    export_shard(store, tmp_path / "mac.parquet")
    table = pq.read_table(tmp_path / "mac.parquet")
    twice = table.append_column("median_us", pa.array([-1.0] * table.num_rows))
    pq.write_table(twice, tmp_path / "twice.parquet")
    with Store(tmp_path / "central.duckdb") as central:
        for ingest in (ingest_shard, Store.ingest_shard):
            with pytest.raises(BadShard, match=r"twice\.parquet has more than one column named median_us"):
                ingest(central, tmp_path / "twice.parquet")
        assert contents(central) == ([], [], [])


def test_names_the_product_never_writes_are_refused_by_the_store_itself(make_measurement, tmp_path):
    """The store's own checks (Store._merge_shards: after the row checks, which refuse most of these first) refuse
    odd device ids, names with white space at an end, and a kernel named like a stored one but for its case."""
    with Store(tmp_path / "a.duckdb") as a:
        fill(a, make_measurement, MAC)
        a.record([make_measurement(device_id=MAC, kernel="my_norm", config={"TG": 64})])
        a.export_shard(tmp_path / "good.parquet")
    cases = {
        "NVIDIA-H200 AS device_id": "device_id 'NVIDIA-H200' is not a device id",
        "'nvidia-h200 ' AS device_id": "device_id 'nvidia-h200 ' is not a device id",
        "' softmax' AS kernel": "kernel ' softmax' starts or ends with white space",
        "'\uff4d\uff59_\uff4e\uff4f\uff52\uff4d' AS kernel": "kernel 'ｍｙ_ｎｏｒｍ' differs from kernel 'my_norm' only in "
                                                            "case, white space or Unicode compatibility form (NFKC)",
        "'My_Norm' AS kernel": "kernel 'My_Norm' differs from kernel 'my_norm' only in case, white space or Unicode "
                               "compatibility form (NFKC)",
    }
    with Store(tmp_path / "central.duckdb") as central:
        central.ingest_shard(tmp_path / "good.parquet")
        before = contents(central)
        for replace_sql, says in cases.items():
            replace_sql = replace_sql.replace("NVIDIA-H200 AS", "'NVIDIA-H200' AS")
            _rewrite(tmp_path / "good.parquet", tmp_path / "bad.parquet", replace_sql, "kernel = 'my_norm'")
            with pytest.raises(BadShard, match=r"bad\.parquet, row \d+: " + re.escape(says)):
                central._merge_shards([tmp_path / "bad.parquet"])
            with pytest.raises(BadShard, match=r"bad\.parquet, row \d+: "):
                central.ingest_shard(tmp_path / "bad.parquet")
            assert contents(central) == before


def _aware_shard(shard: Path, out: Path, when: datetime | None = None) -> None:
    """`shard` with measured_at as a UTC-aware timestamp (the same instants, or all `when`)."""
    import pyarrow as pa

    table = pq.read_table(shard)
    kind = pa.timestamp("us", tz="UTC")
    column = table["measured_at"].cast(kind) if when is None else pa.array([when] * table.num_rows, type=kind)
    pq.write_table(table.set_column(table.schema.get_field_index("measured_at"), pa.field("measured_at", kind), column),
                   out)


def _ingest_under(tz: str, db: Path, shard: Path, subprocess_env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "zmlx_pipeline", "ingest", "--db", str(db), str(shard)],
                          env={**subprocess_env, "TZ": tz}, capture_output=True, text=True, timeout=120)


def test_aware_timestamps_are_stored_in_utc_whatever_the_local_time_zone(store, make_measurement, tmp_path,
                                                                         subprocess_env):
    """The same instants ingested under two time zones are one timing, stored as UTC."""
    fill(store, make_measurement, MAC)
    export_shard(store, tmp_path / "naive.parquet")
    _aware_shard(tmp_path / "naive.parquet", tmp_path / "aware.parquet")
    db = tmp_path / "central.duckdb"
    first = _ingest_under("America/St_Johns", db, tmp_path / "aware.parquet", subprocess_env)
    assert first.returncode == 0 and "6 added" in first.stdout, first.stdout + first.stderr
    again = _ingest_under("UTC", db, tmp_path / "aware.parquet", subprocess_env)
    assert again.returncode == 0 and "0 added" in again.stdout and "replaced" not in again.stdout, again.stdout
    naive = _ingest_under("Asia/Kolkata", db, tmp_path / "naive.parquet", subprocess_env)
    assert "0 added" in naive.stdout and "replaced" not in naive.stdout, naive.stdout
    with Store(db, read_only=True) as central:
        assert [m["measured_at"] for m in central.measurements()] == [m["measured_at"] for m in store.measurements()]
    # and an export of it, under another time zone, ingests as the same timings
    out = tmp_path / "again.parquet"
    exported = subprocess.run([sys.executable, "-m", "zmlx_pipeline", "export", "--db", str(db), str(out)],
                              env={**subprocess_env, "TZ": "Pacific/Kiritimati"}, capture_output=True, text=True)
    assert exported.returncode == 0, exported.stderr
    assert pq.read_table(out)["measured_at"].to_pylist() == pq.read_table(tmp_path / "naive.parquet")["measured_at"].to_pylist()


@pytest.mark.parametrize("tz, ahead, refused", [("Pacific/Kiritimati", -5 * 60, False), ("Etc/GMT+12", 10 * 3600, True)])
def test_the_future_check_compares_utc_with_utc(tz, ahead, refused, store, make_measurement, tmp_path, subprocess_env):
    """Timed 5 minutes ago is no future anywhere; 10 hours ahead is, even where local time is 12 hours behind."""
    from datetime import timedelta

    fill(store, make_measurement, MAC)
    export_shard(store, tmp_path / "naive.parquet")
    _aware_shard(tmp_path / "naive.parquet", tmp_path / "aware.parquet",
                 datetime.now(timezone.utc) + timedelta(seconds=ahead))
    done = _ingest_under(tz, tmp_path / "central.duckdb", tmp_path / "aware.parquet", subprocess_env)
    if refused:
        assert done.returncode == 1 and "is in the future" in done.stderr and "Traceback" not in done.stderr
    else:
        assert done.returncode == 0 and "6 added" in done.stdout, done.stdout + done.stderr


def test_a_date_typed_timestamp_column_is_refused_not_stored_as_midnight(store, make_measurement, tmp_path):
    fill(store, make_measurement, MAC)
    shard, dated = tmp_path / "mac.parquet", tmp_path / "dated.parquet"
    export_shard(store, shard)
    con = duckdb.connect()
    con.execute(f"COPY (SELECT * REPLACE (measured_at::DATE AS measured_at) FROM read_parquet('{shard}')) "
                f"TO '{dated}' (FORMAT parquet)")
    con.close()
    with Store(tmp_path / "central.duckdb") as central:
        with pytest.raises(BadShard) as info:
            ingest_shard(central, dated)
        assert str(info.value) == (f"{dated}: column measured_at is DATE, but a shard's measured_at is a timestamp "
                                   "(TIMESTAMP): re-export it with zmlx-pipeline export; nothing was ingested, the "
                                   "store is unchanged")
        assert contents(central) == ([], [], [])


def test_a_folder_that_cannot_be_read_refuses_the_ingest(store, make_measurement, tmp_path, monkeypatch):
    """A subfolder os.walk cannot list (no permission: simulated, as root reads any folder) is named, never
    skipped with its shards."""
    import os

    fill(store, make_measurement, MAC)
    export_shard(store, tmp_path / "shards" / "a.parquet")
    export_shard(store, tmp_path / "shards" / "sub" / "b.parquet")
    real = os.scandir

    def scandir(path="."):
        if os.path.basename(os.fspath(path)) == "sub":
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with Store(tmp_path / "central.duckdb") as central:
        with pytest.raises(BadShard) as info:
            ingest_shards(central, [tmp_path / "shards"])
        assert str(info.value) == (f"{tmp_path / 'shards' / 'sub'} cannot be read (Permission denied), so its shards "
                                   "would be left out; make it readable or name the shards to ingest; nothing was "
                                   "ingested, the store is unchanged")
        assert contents(central) == ([], [], [])
