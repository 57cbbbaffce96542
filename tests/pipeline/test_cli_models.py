"""train, evaluate and models through click's CliRunner: the JSON contract, tables, one-line errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.data.catalog import get_device
from zmlx_pipeline.pipeline.cli import cli

REPO = Path(__file__).resolve().parents[2]
HOTSPOT = REPO / "tests" / "data" / "fixtures" / "hotspot"
DEVICES = ("nvidia-rtx-a4000", "nvidia-rtx-a6000")
ROW_KEYS = ["kernel", "device", "method", "k", "regret_geomean", "regret_p95", "hit_2pct", "cases"]
TIED_KEYS = ["regret_tied_geomean", "hit_tied", "tied_band", "tied_band_source"]  # after the score keys
BASELINES = {"chip_default", "seed_candidates", "most_common_best", "nearest_shape", "other_device_best"}


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.fixture
def filled(store, make_measurement):
    """Two devices, one kernel (TG x VEC) at four row counts; closed so the CLI can open the store."""
    for device_id in DEVICES:
        store.upsert_device({**get_device(device_id).as_row(), "device_id": device_id, "in_catalog": True})
    store.record([
        make_measurement(device_id=d, kernel="rms", dtype="float32", shape={"rows": rows, "cols": 1024},
                         config={"TG": tg, "VEC": vec}, median_us=rows * (1 + i) / vec + abs(tg - 64 * rows ** 0.5) / 16 + 1)
        for i, d in enumerate(DEVICES) for rows in (1, 16, 256, 4096) for tg in (64, 256, 1024) for vec in (1, 4)
    ])
    path = store.path
    store.close()
    return path


def test_evaluate_json_has_the_flat_result_rows(filled):
    result = invoke("evaluate", "--split", "shapes", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["split"] == "shapes" and data["models"] == ["robust"]
    rows = data["results"]
    assert rows and all(list(r) == ROW_KEYS + TIED_KEYS for r in rows)
    assert data["noise"]["fallback"] is True  # the fixture has no repeats
    assert {r["tied_band_source"] for r in rows if r["cases"]} == {"fallback"}
    assert {r["method"] for r in rows} == {"model"} | BASELINES
    assert {r["k"] for r in rows} == {1, 3, 5}
    pooled = {(r["method"], r["k"]): r for r in rows if r["device"] is None}
    assert pooled[("model", 1)]["cases"] == 8  # every shape held out once, on both devices
    assert pooled[("model", 1)]["regret_geomean"] >= 1.0 and 0.0 <= pooled[("model", 1)]["hit_2pct"] <= 1.0
    assert pooled[("other_device_best", 1)]["cases"] == 0 and pooled[("other_device_best", 1)]["regret_geomean"] is None
    assert {r["device"] for r in rows if r["method"] == "model"} == {None, *DEVICES}


def test_evaluate_devices_split_and_its_old_name(filled):
    result = invoke("evaluate", "--split", "lodo", "--kernel", "rms", "--k", "1", "--model", "prior", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["split"] == "devices"
    pooled = {r["method"]: r for r in data["results"] if r["device"] is None}
    assert set(pooled) == {"model", "oracle_device"} | BASELINES and pooled["model"]["cases"] == 8
    assert pooled["nearest_shape"]["cases"] == 0  # nothing of the left-out device is measured


def test_evaluate_table(filled):
    result = invoke("evaluate", "--split", "devices", "--model", "prior")
    assert result.exit_code == 0, result.output
    header = result.output.splitlines()[0].split()
    assert header[:6] == ["kernel", "device", "method", "regret@1", "p95@1", "hit@1"] and header[-1] == "cases"
    assert any(line.split()[:3] == ["rms", "(all)", "model"] for line in result.output.splitlines())
    assert "split devices" in result.output
    assert header[6] == "tied@1" and "tie band: FALLBACK 2% for every case" in result.output


def test_evaluate_tie_band_comes_from_the_stores_repeats(filled, make_measurement):
    """Every measurement timed again 10% slower in a second run: the band is 10%, from each device's own pairs."""
    from zmlx_pipeline.data.store import Store

    with Store(filled) as store:
        again = [make_measurement(**{k: m[k] for k in ("device_id", "kernel", "kernel_version", "dtype")},
                                  shape=m["shape"], config=m["config"], run_id="run-2", median_us=m["median_us"] * 1.1)
                 for m in store.measurements()]
        assert store.record_repeat(again) == len(again)
    result = invoke("evaluate", "--split", "shapes", "--model", "prior", "--k", "1", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["noise"]["fallback"] is False and data["noise"]["pairs"] == len(again)
    for r in data["results"]:
        if r["cases"]:
            assert r["tied_band"] == pytest.approx(0.1) and r["regret_tied_geomean"] <= r["regret_geomean"]
            assert r["hit_tied"] >= r["hit_2pct"]  # a 10% band forgives at least what 2% does
    table = invoke("evaluate", "--split", "shapes", "--model", "prior", "--k", "1")
    assert table.exit_code == 0 and "FALLBACK" not in table.output and "tie band = median" in table.output


def test_train_then_list_and_verify(filled):
    result = invoke("train", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["kernel_filter"] == "rms" and row["params"]["model"] == "robust"
    assert isinstance(row["scores"]["prune_k"], int) and row["data_fingerprint"].startswith("sha256:")
    table = invoke("train", "--model", "prior")
    assert table.exit_code == 0, table.output
    header = next(line for line in table.output.splitlines() if line.startswith("kernel"))  # progress goes to stderr
    assert "prune_k" in header.split() and "rms" in table.output
    listed = invoke("models", "--verify", "--json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.output)
    assert [r["params"]["model"] for r in rows] == ["prior", "robust"]  # newest first
    assert rows[1]["model_id"] == row["model_id"]


def test_a_tampered_model_file_fails_verification_in_one_line(filled):
    assert invoke("train", "--model", "gbr_shared").exit_code == 0
    (model_file,) = (Path(filled).parent / "models").glob("*.zmodel")
    model_file.write_bytes(b"PK" + model_file.read_bytes()[2:-4] + b"evil")
    assert invoke("train", "--model", "prior").exit_code == 0  # a good file, registered after the bad one
    result = invoke("models", "--verify")
    assert result.exit_code == 1
    *table, error = result.output.strip().splitlines()
    assert error.startswith("Error: 1 of 2 model files refused; rms-") and "changed since it was registered" in error
    verdicts = {line.split()[2]: line for line in table if line.startswith("rms ")}  # by model name
    assert verdicts["prior"].rstrip().endswith(" ok") and "changed since it was registered" in verdicts["gbr_shared"]
    listed = invoke("models", "--verify", "--json")
    assert listed.exit_code == 1
    rows = json.loads(listed.output[:listed.output.rindex("]") + 1])
    assert [r["verified"] == "ok" for r in rows] == [True, False]  # newest first: every file was checked


def test_a_model_file_the_disk_refuses_is_named_in_the_one_line(filled, tmp_path, monkeypatch):
    """A full disk while the model is written: the line says which file could not be saved, nothing is registered
    and no part file is left."""
    import errno
    import zipfile

    real = zipfile.ZipFile.writestr

    def full(self, *args, **kwargs):  # a file on disk; the model's arrays are zipped in memory first
        if self.filename:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(zipfile.ZipFile, "writestr", full)
    folder = tmp_path / "models_here"
    result = invoke("train", "--models-dir", folder)
    assert result.exit_code == 1, result.output
    last = result.output.splitlines()[-1]
    assert last.startswith(f"Error: cannot save the model file {folder}/rms-") and last.endswith(
        ".zmodel: No space left on device; free space there or choose another --models-dir"), last
    assert not folder.exists()  # no part file, and the folder this train made went with it
    assert invoke("models").output.startswith("Error: no trained model in store ")


@pytest.mark.parametrize("args, message", [
    (("evaluate", "--split", "shapes", "-k", "nope"), "Error: no ok measurements of kernel(s) nope; the store has rms\n"),
    (("evaluate", "--split", "shapes", "--model", "nope"), "Error: unknown model 'nope'"),
    (("train", "--kernel", "nope"), "Error: no ok measurements of kernel(s) nope; the store has rms\n"),
    (("train", "--model", "nope"), "Error: unknown model 'nope'"),
    (("models",), "Error: no trained model in store "),
    (("models", "--kernel", "rms"), "Error: no trained model for kernel 'rms' in store "),
])
def test_errors_are_one_line(filled, args, message):
    result = invoke(*args)
    assert result.exit_code == 1, result.output
    assert result.output.startswith(message) and result.output.count("\n") == 1



@pytest.mark.parametrize("args, message", [
    (("--kernel", "nope"), "no ok measurements of kernel(s) nope; the store has rms"),
    (("--kernel", "RMS"), "no ok measurements of kernel(s) RMS; the store has rms"),
    (("--kernel", "rms,nope"), "no ok measurements of kernel(s) nope; the store has rms"),
    (("--device", "nope"), "no measurements of device(s) nope in {db}; it has nvidia-rtx-a4000, nvidia-rtx-a6000"),
    (("--kernel", "nope", "--models-dir", "{tmp}/a/b/models"), "no ok measurements of kernel(s) nope; the store has rms"),
])
def test_a_refused_train_changes_nothing_and_leaves_no_models_folder(filled, tmp_path, args, message):
    """The default models/ (or a new --models-dir and its new parents) made before the selection is read goes
    again with the refusal; the store is byte for byte as it was."""
    before = filled.read_bytes()
    result = invoke("train", *(a.format(tmp=tmp_path) for a in args))
    assert result.exit_code == 1, result.output
    assert result.output == f"Error: {message.format(db=filled)}\n"
    assert filled.read_bytes() == before
    assert not (tmp_path / "models").exists() and not (tmp_path / "a").exists()

@pytest.mark.parametrize("args, message", [
    (("--split", "random"), "Invalid value for '--split': 'random' is not one of 'shapes', 'devices', 'lodo'."),
    (("--split", "nope"), "Invalid value for '--split': 'nope' is not one of 'shapes', 'devices', 'lodo'."),
    (("--split", "shapes", "--k", "99999999999"),
     "Invalid value for '--k': 99999999999 is not in the range 1<=x<=4096."),
    (("--split", "shapes", "--k", "4097"), "Invalid value for '--k': 4097 is not in the range 1<=x<=4096."),
])
def test_an_unknown_split_or_a_k_past_the_cap_is_a_usage_error(filled, args, message):
    """--split is one of the splits or their aliases and --k at most the runtime's prune-k cap (4096), each a usage
    error (exit 2, one line) said before the store is read."""
    result = invoke("evaluate", *args)
    assert result.exit_code == 2, result.output
    assert result.output == f"Error: {message} (cli evaluate --help)\n"


def test_evaluate_split_choices_are_the_splits_and_their_aliases():
    from zmlx_pipeline.models.folds import SPLIT_ALIASES, SPLITS
    from zmlx_pipeline.pipeline.cli_models import EVALUATION_SPLITS
    from zmlx_pipeline.runtime.contents import MAX_PRUNE_K

    assert EVALUATION_SPLITS == (*SPLITS, *SPLIT_ALIASES) and MAX_PRUNE_K == 4096


@pytest.mark.parametrize("command", [("evaluate", "--split", "shapes"), ("train",)])
@pytest.mark.parametrize("jobs", ["0", "-2", "two"])
def test_jobs_must_be_a_positive_count(filled, command, jobs):
    result = invoke(*command, "--jobs", jobs)
    assert result.exit_code == 2 and "Invalid value for '--jobs' / '-j'" in result.output
    assert "Traceback" not in result.output


def test_evaluate_json_is_the_same_with_workers(filled, monkeypatch):
    from zmlx_pipeline.models import pool as pool_module

    one = invoke("evaluate", "--split", "devices", "-k", "rms", "--k", "1", "-j", "1", "--json")
    monkeypatch.setattr(pool_module, "PARALLEL_MIN_ROWS", 0)  # the fixture is small: use the workers anyway
    two = invoke("evaluate", "--split", "devices", "-k", "rms", "--k", "1", "-j", "2", "--json")
    assert one.exit_code == two.exit_code == 0, one.output + two.output
    assert json.loads(one.output) == json.loads(two.output)


def test_an_empty_store_says_what_to_do(store):
    store.close()
    for args in (("evaluate", "--split", "shapes"), ("train",)):
        result = invoke(*args)
        assert result.exit_code == 1
        assert result.output.startswith("Error: the store has no ok measurements: run `zmlx-pipeline run`")


@pytest.mark.parametrize("command", [("train",), ("evaluate", "--split", "shapes"), ("models",)])
def test_a_mistyped_db_path_is_refused_and_left_uncreated(tmp_path, command):
    """A command that reads measurements leaves no empty store behind at a wrong --db (train opens it writable)."""
    where = tmp_path / "stores"
    where.mkdir()
    missing = where / "typo.duckdb"
    result = invoke(*command, "--db", missing)
    assert result.exit_code == 1, result.output
    assert result.output.startswith(f"Error: no store at {missing}: run ") and result.output.count("\n") == 1
    assert list(where.iterdir()) == []


def test_a_kernel_tuner_file_of_another_kernel_imports_and_evaluates(tmp_path):
    """Hotspot (calculate_temp, 11 parameters of its own) on an A100 and an A4000: no kernel-specific code."""
    db = tmp_path / "hotspot.duckdb"
    imported = invoke("import", "--db", db, HOTSPOT, "--json")
    assert imported.exit_code == 0, imported.output
    assert sorted((r["device"], r["kernel"], r["added"]) for r in json.loads(imported.output)) == [
        ("nvidia-a100-pcie-40gb", "calculate_temp", 13), ("nvidia-rtx-a4000", "calculate_temp", 13)]
    result = invoke("evaluate", "--db", db, "--split", "devices", "--json")
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["results"]
    pooled = {(r["method"], r["k"]): r for r in rows if r["device"] is None}
    assert pooled[("model", 1)]["cases"] == 2 and pooled[("model", 1)]["regret_geomean"] >= 1.0
    # block_size_x * block_size_y is its threadgroup: the seed's candidates apply, the catalog default does not
    assert {m for m, _ in pooled} == {"model", "common_top10", "seed_candidates", "most_common_best",
                                      "nearest_shape", "other_device_best", "oracle_device"}
    trained = invoke("train", "--db", db, "--json")
    assert trained.exit_code == 0, trained.output
    (row,) = json.loads(trained.output)
    assert row["kernel_filter"] == "calculate_temp" and row["scores"]["prune_split"] == "devices"
    assert 1 <= row["scores"]["prune_k"] <= 13


def test_evaluate_marks_the_oracle_as_a_floor_and_takes_a_protocol(filled):
    table = invoke("evaluate", "--split", "devices", "--model", "prior", "--k", "1")
    assert table.exit_code == 0, table.output
    assert any(line.split()[:4] == ["rms", "(all)", "oracle_device", "(floor)"] for line in table.output.splitlines())
    assert "oracle_device (floor) = after the fact" in table.output and "protocol nested" in table.output
    fixed = invoke("evaluate", "--split", "devices", "--model", "ensemble", "--k", "1", "--protocol", "fixed", "--json")
    assert fixed.exit_code == 0, fixed.output
    data = json.loads(fixed.output)
    assert data["protocol"] == "fixed" and set(data["floors"]) == {"oracle_device"}
    bad = invoke("evaluate", "--split", "devices", "--protocol", "loose")
    assert bad.exit_code == 2 and "'loose' is not one of 'nested', 'fixed'" in bad.output


def test_evaluate_reads_what_train_recorded_and_refit_fits_the_same_numbers(filled):
    trained = invoke("train", "--model", "prior", "-j", "1", "--json")
    assert trained.exit_code == 0, trained.output
    model_id = json.loads(trained.output)[0]["model_id"]
    read = invoke("evaluate", "--split", "shapes", "--model", "prior", "-j", "1", "--json")
    refit = invoke("evaluate", "--split", "shapes", "--model", "prior", "-j", "1", "--refit", "--json")
    assert read.exit_code == 0 and refit.exit_code == 0, read.output + refit.output
    read, refit = json.loads(read.output), json.loads(refit.output)
    assert read["reused"] == {"rms": model_id} and refit["reused"] == {}
    assert read["results"] == refit["results"]
    table = invoke("evaluate", "--split", "shapes", "--model", "prior", "-j", "1")
    assert f"train recorded (registered model, unchanged rows; --refit fits again): rms ({model_id})" in table.output


def test_evaluate_records_the_folds_it_fitted_for_the_registered_model(filled):
    from zmlx_pipeline.data.store import Store

    trained = invoke("train", "--model", "prior", "-j", "1", "--json")
    assert trained.exit_code == 0, trained.output
    model_id = json.loads(trained.output)[0]["model_id"]
    with Store(filled) as store:  # as a model registered before train recorded left-out devices
        assert store.heldout_count(model_id, "devices", "nested") > 0
        store._conn.execute("DELETE FROM heldout_cases WHERE split = 'devices'")
    first = invoke("evaluate", "--split", "devices", "--model", "prior", "-j", "1", "--json")
    second = invoke("evaluate", "--split", "devices", "--model", "prior", "-j", "1", "--json")
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    first, second = json.loads(first.output), json.loads(second.output)
    assert first["reused"] == {} and second["reused"] == {"rms": model_id}
    assert second["results"] == first["results"]


def test_evaluate_says_when_a_kernel_has_nothing_to_hold_out(filled, tmp_path):
    """A kernel measured on one device has no left-out-device case: the table says so in a line of its own beside
    a kernel with cases (which gets no such line); a store where no kernel has one is refused as report refuses it."""
    one = tmp_path / "one.duckdb"
    assert invoke("import", "--db", one, "--device", "nvidia-rtx-a4000", HOTSPOT / "A4000.json").exit_code == 0
    before = one.read_bytes()
    for extra in ((), ("--json",)):
        alone = invoke("evaluate", "--db", one, "--split", "devices", *extra)
        assert alone.exit_code == 1 and alone.stdout == "", alone.output
        assert alone.stderr.strip() == (f"Error: no held-out cases under --split devices in {one}: it needs two devices "
                                        "that measured the same kernel (try --split shapes)")
    assert one.read_bytes() == before
    mixed = tmp_path / "mixed.duckdb"
    mixed.write_bytes(filled.read_bytes())
    assert invoke("import", "--db", mixed, "--device", "nvidia-rtx-a4000", HOTSPOT / "A4000.json").exit_code == 0
    result = invoke("evaluate", "--db", mixed, "--split", "devices")
    assert result.exit_code == 0, result.output
    assert "calculate_temp: no held-out cases: measured on one device; left-out devices need two or more" \
        in result.output.splitlines()
    both = invoke("evaluate", "--db", filled, "--split", "devices")
    assert both.exit_code == 0 and "no held-out cases" not in both.output


@pytest.fixture
def read_only_mount(monkeypatch):
    """DuckDB opening any store for writing as on a read-only mount (what root's tests cannot get from chmod)."""
    import duckdb

    from zmlx_pipeline.data import store as store_module

    real = duckdb.connect

    def connect(path=":memory:", read_only=False, **kwargs):
        if not read_only and path != ":memory:":
            raise duckdb.IOException(f'IO Error: Cannot open file "{path}": Read-only file system')
        return real(path, read_only=read_only, **kwargs)

    monkeypatch.setattr(store_module.duckdb, "connect", connect)


def test_a_store_this_user_cannot_write_is_evaluated_and_published_but_not_filled(filled, read_only_mount, tmp_path):
    before = Path(filled).read_bytes()
    published = invoke("publish", "--db", filled, "--to", tmp_path / "bundles", "--device", DEVICES[0], "--json")
    assert published.exit_code == 0, published.output
    assert (tmp_path / "bundles" / "latest").read_text().strip() == json.loads(published.stdout)["bundle_id"]
    result = invoke("evaluate", "--db", filled, "--split", "shapes", "--model", "prior", "--json")
    assert result.exit_code == 0, result.output
    assert "model" in {r["method"] for r in json.loads(result.output)["results"]}
    for args in (("train", "--db", filled), ("ingest", "--db", filled, REPO / "data" / "nvidia-h100-sxm-32sm.parquet")):
        refused = invoke(*args)
        assert refused.exit_code == 1
        assert refused.output.splitlines()[-1] == (f"Error: store {filled} cannot be written (Read-only file system): "
                                                   "commands that only read it still work; copy it somewhere "
                                                   "writable or pass another --db")
    assert Path(filled).read_bytes() == before


def test_a_model_of_a_long_kernel_name_gets_a_short_file_name_the_same_for_the_same_name(tmp_path):
    """(train.py's model id: a test of models/ kept here, beside the train command.) A kernel name of hundreds of
    characters made `train` fail after fitting ("File name too long") on saving `.<id>.zmodel.tmp-...`."""
    from datetime import datetime

    from zmlx_pipeline.models.persist import SUFFIX
    from zmlx_pipeline.models.train import _model_id

    now = datetime(2026, 1, 2, 3, 4, 5)
    long, other = "k" * 300, "k" * 299 + "j"
    ids = [_model_id(name, now) for name in (long, long, other)]
    assert all(len(i) <= 100 for i in ids)
    assert ids[0].rsplit("-", 1)[0] == ids[1].rsplit("-", 1)[0] != ids[2].rsplit("-", 1)[0]  # the name's hash
    assert ids[0].startswith("k" * 55 + "-") and "-20260102T030405-" in ids[0]
    (tmp_path / f".{ids[0]}{SUFFIX}.tmp-4194304-0123abcd").write_bytes(b"")  # the temp file save_model writes first
    assert _model_id("rms", now).startswith("rms-20260102T030405-")  # a short name as before
