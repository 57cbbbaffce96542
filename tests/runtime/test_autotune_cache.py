"""The autotune cache: ZMLX's v3 layout, v2/v1 files migrated with nothing lost, safe concurrent writes."""

import json
import subprocess
import sys
import textwrap

import pytest

from zmlx_pipeline.runtime import cache

V2 = {
    "M3_Max_0.30.0": {
        json.dumps({"name": "kernel_a", "shapes": [[4, 8]], "dtypes": ["float16"], "grid": [8, 1, 1]}):
            {"tg": [128, 1, 1], "template": [["T", "float16"]]},
        json.dumps({"name": "kernel_b", "shapes": [[1, 2]], "dtypes": ["float32"], "grid": [2, 1, 1]}):
            "[64, 1, 1]",  # a v1-style value
    },
    "M1_0.29.0": {
        json.dumps({"name": "kernel_c", "shapes": [[9]], "dtypes": ["float32"], "grid": [9, 1, 1]}):
            {"tg": [256, 1, 1], "template": []},
    },
}


def test_cache_lives_in_home_dot_cache_zmlx(isolated_home, monkeypatch):
    monkeypatch.delenv("ZMLX_CACHE_DIR", raising=False)
    assert cache.cache_path() == isolated_home / ".cache" / "zmlx" / "autotune_v3.json"


def test_a_v2_file_is_migrated_without_losing_entries(tmp_path):
    (tmp_path / "autotune_v2.json").write_text(json.dumps(V2))
    path = tmp_path / "autotune_v3.json"
    read = cache.read_cache(path)
    assert read["schema_version"] == "3.0"
    assert set(read["devices"]) == set(V2)
    assert len(read["devices"]["M3_Max_0.30.0"]["entries"]) == 2
    assert read["devices"]["M3_Max_0.30.0"]["entries"][list(V2["M3_Max_0.30.0"])[1]] == {"tg": [64, 1, 1], "template": []}
    # a write for another device keeps every migrated section and entry
    cache.save_entries("nvidia-h200_0.32.4", {"k": {"tg": [512, 1, 1], "template": [], "config": {"TG": 512}}},
                       {"device_id": "nvidia-h200"}, path)
    on_disk = json.loads(path.read_text())
    assert on_disk["schema_version"] == "3.0"
    assert set(on_disk["devices"]) == set(V2) | {"nvidia-h200_0.32.4"}
    for dkey, entries in V2.items():
        assert set(on_disk["devices"][dkey]["entries"]) == set(entries)
        assert on_disk["devices"][dkey]["metadata"]["migrated_from"] == "autotune_v2.json"
    assert on_disk["devices"]["nvidia-h200_0.32.4"]["metadata"] == {"device_id": "nvidia-h200"}
    assert json.loads((tmp_path / "autotune_v2.json").read_text()) == V2  # the old file is left as it was
    assert cache.migrate(path) == 4


def test_migrate_writes_v3_from_v2(tmp_path):
    (tmp_path / "autotune_v2.json").write_text(json.dumps(V2))
    assert cache.migrate(tmp_path / "autotune_v3.json") == 3
    assert set(json.loads((tmp_path / "autotune_v3.json").read_text())["devices"]) == set(V2)


def test_an_unreadable_v3_file_is_moved_aside_not_lost(tmp_path):
    import pytest

    path = tmp_path / "autotune_v3.json"
    path.write_text("{half a file")
    with pytest.warns(UserWarning, match="moved aside"):
        cache.save_entries("d_1", {"k": {"tg": [1, 1, 1]}}, None, path)
    assert list(json.loads(path.read_text())["devices"]) == ["d_1"]
    assert [p.read_text() for p in tmp_path.glob("autotune_v3.json.corrupt-*")] == ["{half a file"]


def test_two_processes_writing_at_once_leave_a_valid_file_with_both(tmp_path, subprocess_env):
    path = tmp_path / "autotune_v3.json"
    (tmp_path / "autotune_v2.json").write_text(json.dumps(V2))
    script = textwrap.dedent("""
        import sys
        from zmlx_pipeline.runtime import cache
        who, path = sys.argv[1], sys.argv[2]
        for i in range(40):
            cache.save_entries(f"dev-{who}_0.30.0", {f"{who}-{i}": {"tg": [i, 1, 1], "template": []}},
                               {"writer": who}, path)
            cache.save_entries("shared_0.30.0", {f"{who}-{i}": {"tg": [i, 1, 1], "template": []}}, None, path)
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, who, str(path)], env=subprocess_env) for who in "ab"]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    data = json.loads(path.read_text())
    assert set(data["devices"]) == set(V2) | {"dev-a_0.30.0", "dev-b_0.30.0", "shared_0.30.0"}
    for who in "ab":
        assert set(data["devices"][f"dev-{who}_0.30.0"]["entries"]) == {f"{who}-{i}" for i in range(40)}
    assert len(data["devices"]["shared_0.30.0"]["entries"]) == 80
    assert not list(tmp_path.glob(".autotune_v3.json.*"))  # no temp file left


def test_keys_are_canonical_and_never_object_ids():
    a = cache.entry_key("rmsnorm", "sha256:1", {"cols": 8, "rows": 2}, ("rows", "cols"), "float16", ["VEC", "TG"])
    b = cache.entry_key("rmsnorm", "sha256:1", {"rows": 2, "cols": 8}, ["rows", "cols"], "float16", ("TG", "VEC"))
    assert a == b
    key = json.loads(a)
    assert key["name"] == "rmsnorm" and key["shapes"] == [[2, 8]] and key["dtypes"] == ["float16"]
    assert key["t_params"] == [["T", "float16"], ["TG", "tuned"], ["VEC", "tuned"], ["kernel_version", "sha256:1"]]
    assert key["grid"] == [0, 0, 0]  # the config decides the grid; ZMLX's loader needs a grid to read the key
    value = cache.entry_value({"TG": 256, "VEC": 4}, "float16", (256, 1, 1))
    assert value["tg"] == [256, 1, 1] and ["TG", 256] in value["template"]


ENTRY = {"k": {"tg": [256, 1, 1], "template": [], "config": {"TG": 256}}}


def test_a_cache_path_that_is_a_symlink_is_written_through_to_its_target(tmp_path):
    real = tmp_path / "dotfiles" / "autotune_v3.json"
    real.parent.mkdir()
    real.write_text(json.dumps({"schema_version": "3.0", "devices": {"other_1": {"entries": {"x": {"tg": [1]}}}}}))
    link = tmp_path / "autotune_v3.json"
    link.symlink_to(real)
    cache.save_entries("d_1", ENTRY, None, link)
    cache.save_refusal("d_1", "rmsnorm", {"TG": 1024}, "too many threads", link)
    assert link.is_symlink() and link.resolve() == real
    on_disk = json.loads(real.read_text())
    assert set(on_disk["devices"]) == {"other_1", "d_1"} and on_disk["zmlx_pipeline"]["refused"]["d_1"]


def test_a_rewritten_cache_file_keeps_its_mode_and_a_new_one_gets_the_umasks(tmp_path):
    import os
    import stat

    kept = tmp_path / "kept.json"
    kept.write_text("{}")
    kept.chmod(0o644)
    cache.save_entries("d_1", ENTRY, None, kept)
    assert stat.S_IMODE(kept.stat().st_mode) == 0o644
    old = os.umask(0o027)
    try:
        cache.save_entries("d_1", ENTRY, None, tmp_path / "new" / "autotune_v3.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new" / "autotune_v3.json").stat().st_mode) == 0o640


@pytest.mark.parametrize("text", ["[1, 2]", "null", "7", '"a string"'])
def test_a_cache_file_whose_json_is_not_an_object_is_moved_aside_not_lost(tmp_path, text):
    path = tmp_path / "autotune_v3.json"
    path.write_text(text)
    with pytest.warns(UserWarning, match="not an object.*moved aside"):
        cache.save_entries("d_1", ENTRY, None, path)
    assert list(json.loads(path.read_text())["devices"]) == ["d_1"]
    assert [p.read_text() for p in tmp_path.glob("autotune_v3.json.corrupt-*")] == [text]


@pytest.mark.parametrize("kind", ["directory", "symlink to a directory", "fifo"])
def test_a_cache_path_that_is_no_regular_file_is_refused_and_left_as_it_is(tmp_path, kind):
    import os

    from zmlx_pipeline.runtime import BadArgument

    path = tmp_path / "autotune_v3.json"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "adir").mkdir()
        path.symlink_to(tmp_path / "adir")
    before = os.lstat(path)
    with pytest.raises(BadArgument) as info:
        cache.save_entries("d_1", ENTRY, None, path)
    assert "\n" not in str(info.value) and "autotune_v3.json" in str(info.value)
    after = os.lstat(path)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)


@pytest.mark.parametrize("text, why", [
    ('{"schema_version": "3.0", "devices": []}', "its devices is a JSON array, not an object"),
    ('{"schema_version": "3.0", "devices": {"d_1": "x"}}', "its device section 'd_1' is a JSON string, not an object"),
    ('{"schema_version": "3.0", "devices": {"d_1": {"entries": [1]}}}', "its entries of device section 'd_1' is a "),
    ('{"schema_version": "3.0", "devices": {"d_1": {"metadata": [1]}}}', "its metadata of device section 'd_1' is a "),
    ('{"schema_version": "3.0", "zmlx_pipeline": "x"}', "its zmlx_pipeline is a JSON string, not an object"),
    ('{"schema_version": "3.0", "zmlx_pipeline": {"refused": {"d_1": {}}}}',
     r"its zmlx_pipeline.refused\['d_1'\] is a JSON object, not an array"),
    ('{"schema_version": "3.0", "zmlx_pipeline": {"entries": {"d_1": 7}}}', r"its zmlx_pipeline.entries\['d_1'\] is"),
    ('{"schema_version": 3, "devices": {}}', "its schema_version 3 is no version of the v3 layout"),
    ('{"devices": {"d_1": "x"}}', "it has a devices or zmlx_pipeline section but no schema_version"),
    ('{"zmlx_pipeline": "x"}', "it has a devices or zmlx_pipeline section but no schema_version"),
    ('{"M3_0.30.0": "x"}', "its v2 device section 'M3_0.30.0' is a JSON string, not an object"),
])
@pytest.mark.parametrize("write", ["entries", "refusal"])
def test_a_cache_file_of_a_layout_we_do_not_read_is_moved_aside_not_lost(tmp_path, text, why, write):
    path = tmp_path / "autotune_v3.json"
    path.write_text(text)
    assert cache.read_cache(path) == {"schema_version": "3.0", "devices": {}}
    with pytest.warns(UserWarning, match=rf"could not be used as the autotune cache \({why}.*\); moved aside to "
                                         r"autotune_v3.json.corrupt-\d+$"):
        if write == "entries":
            cache.save_entries("d_1", ENTRY, None, path)
        else:
            cache.save_refusal("d_1", "k", {"TG": 1}, "refused", path)
    assert [p.read_text() for p in tmp_path.glob("autotune_v3.json.corrupt-*")] == [text]
    data = json.loads(path.read_text())
    assert data["schema_version"] == "3.0"
    assert (cache.load_entries("d_1", path) == ENTRY if write == "entries"
            else [r["config"] for r in cache.load_refusals("d_1", path)] == [{"TG": 1}])


def test_odd_entries_leave_the_file_in_place(tmp_path):
    path = tmp_path / "autotune_v3.json"
    odd = {"schema_version": "3.0", "devices": {"d_1": {"entries": {"a": "x", "b": 7}, "metadata": None}}}
    path.write_text(json.dumps(odd))
    cache.save_entries("d_1", ENTRY, None, path)
    assert not list(tmp_path.glob("*.corrupt-*"))
    assert cache.load_entries("d_1", path) == {"a": "x", "b": 7, **ENTRY}


@pytest.mark.parametrize("version", ["99.0", "3.1", "4"])
def test_a_newer_zmlxs_cache_file_is_never_rewritten_or_read(tmp_path, version, recwarn):
    (tmp_path / "zc").mkdir()
    path = tmp_path / "zc" / "autotune_v3.json"
    text = json.dumps({"schema_version": version, "devices": {"d_1": {"entries": {"k": {"tg": [2, 1, 1]}}}},
                       "zmlx_pipeline": {"refused": {"d_1": [{"kernel": "k", "config": {"TG": 2}}]}}, "new": [1]})
    path.write_text(text)
    before = path.stat().st_mtime_ns
    assert cache.load_entries("d_1", path) == {} and cache.load_refusals("d_1", path) == []
    assert cache.save_entries("d_1", ENTRY, None, path) == path
    cache.save_refusal("d_1", "k", {"TG": 1}, "refused", path)
    assert cache.migrate(path) == 0
    assert path.read_text() == text and path.stat().st_mtime_ns == before
    assert sorted(p.name for p in path.parent.iterdir()) == ["autotune_v3.json", "autotune_v3.json.lock"]
    said = [str(w.message) for w in recwarn]
    assert len(said) == 1 and said[0] == (
        f"zmlx-pipeline: {path} is an autotune cache of schema {version!r}, newer than this runtime reads (3.0): it is "
        "left as it is, and nothing is read from it or cached in it (upgrade zmlx-pipeline, or give another "
        "cache_path or $ZMLX_CACHE_DIR)")


def test_a_tune_answers_beside_a_newer_zmlxs_cache_file_and_caches_nothing(real_bundle, tmp_path):
    from zmlx_pipeline.runtime import load_bundle, tune

    load_bundle(real_bundle[1], strict=True)
    path = tmp_path / "autotune_v3.json"
    text = json.dumps({"schema_version": "99.0", "devices": {}})
    path.write_text(text)
    with pytest.warns(UserWarning, match="newer than this runtime reads"):
        first = tune("rmsnorm", {"rows": 3000, "cols": 2048}, "float16", device="nvidia-h200",
                     measure=lambda *a: ("ok", 10.0), cache_path=str(path))
    again = tune("rmsnorm", {"rows": 3000, "cols": 2048}, "float16", device="nvidia-h200",
                 measure=lambda *a: ("ok", 10.0), cache_path=str(path))
    assert first.source == again.source == "timed" and first.config == again.config and first.median_us == 10.0
    assert path.read_text() == text


def test_a_narrowed_search_neither_replaces_nor_answers_a_wider_ones_winner(tmp_path):
    """`threadgroups` or `configs` narrow a search: it answers from the cache only with one of its own configs, its
    winner never replaces a cached one (a slower config would then answer every later tune), and an entry it wrote
    answers no wider search later, which times again and replaces it."""
    from zmlx_pipeline.runtime import AutotuneError, tune

    shape = {"rows": 4096, "cols": 4096}

    def measure(spec, cfg, shape, dtype):
        return "ok", 1.0 if cfg["TG"] == 128 else 10.0

    def run(path, **options):
        return tune("rmsnorm", shape, "float16", device="nvidia-h200", measure=measure, cache_path=str(path), **options)

    path = tmp_path / "autotune_v3.json"
    wide = run(path, device_aware=False)
    assert (wide.source, wide.config["TG"], wide.median_us) == ("timed", 128, 1.0)
    stored = path.read_text()
    narrow = run(path, threadgroups=[256])
    assert (narrow.source, narrow.config["TG"], narrow.median_us) == ("timed", 256, 10.0)
    kept = " ".join(f"{name}={value}" for name, value in sorted(wide.config.items()))
    assert narrow.note.endswith(f"not cached: the cache keeps {kept} for this case, another search's winner")
    given = run(path, configs=[{"TG": 512, "ROWS": 1, "VEC": 4}])
    assert (given.source, given.config) == ("timed", {"TG": 512, "ROWS": 1, "VEC": 4})
    assert path.read_text() == stored
    assert (run(path, device_aware=False).source, run(path).config) == ("cache", wide.config)

    first = tmp_path / "narrow_first.json"
    assert run(first, threadgroups=[256]).config["TG"] == 256
    (entry,) = [v for device in json.loads(first.read_text())["devices"].values() for v in device["entries"].values()]
    assert entry["restricted"] is True
    assert run(first, threadgroups=[256]).source == "cache"
    later = run(first, device_aware=False)
    assert (later.source, later.config["TG"]) == ("timed", 128)
    (entry,) = [v for device in json.loads(first.read_text())["devices"].values() for v in device["entries"].values()]
    assert entry["config"]["TG"] == 128 and "restricted" not in entry

    with pytest.raises(AutotuneError, match="none of the 1 given configs is a legal config for"):  # True is no 1
        run(path, configs=[{"TG": 128, "ROWS": True, "VEC": 8}], use_cache=False)


@pytest.mark.parametrize("mark", [1, "yes", None])
def test_an_entry_whose_restricted_mark_is_not_true_or_false_is_timed_again(tmp_path, mark):
    """A `restricted` mark of another type cannot say which searches the entry answers: a miss, timed again."""
    from zmlx_pipeline.runtime import tune

    path = tmp_path / "autotune_v3.json"
    shape = {"rows": 4096, "cols": 4096}

    def run(**options):
        return tune("rmsnorm", shape, "float16", device="nvidia-h200", cache_path=str(path),
                    measure=lambda spec, cfg, shape, dtype: ("ok", 1.0 if cfg["TG"] == 128 else 10.0), **options)

    assert run(threadgroups=[512]).config["TG"] == 512
    doc = json.loads(path.read_text())
    for section in (doc["devices"], doc.get("zmlx_pipeline", {}).get("devices", {})):
        for device in section.values():
            for entry in device["entries"].values():
                entry["restricted"] = mark
    path.write_text(json.dumps(doc))
    again = run(device_aware=False)
    assert again.source == "timed" and again.config["TG"] == 128


@pytest.mark.parametrize("options, message", [
    ({"threadgroups": []}, "threadgroups is empty: give at least one, or None to search every legal config"),
    ({"configs": []}, "configs is empty: give at least one, or None to search every legal config")])
def test_an_empty_search_is_refused_saying_so(options, message):
    from zmlx_pipeline.runtime import BadArgument, tune

    with pytest.raises(BadArgument) as info:
        tune("rmsnorm", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h200", use_cache=False,
             measure=lambda *a: ("ok", 1.0), **options)
    assert str(info.value) == message


def test_given_configs_that_threadgroups_leave_out_are_refused_saying_so():
    from zmlx_pipeline.runtime import AutotuneError, tune

    with pytest.raises(AutotuneError) as info:
        tune("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", device="nvidia-h200", use_cache=False,
             measure=lambda *a: ("ok", 1.0), configs=[{"TG": 128, "VEC": 8, "ROWS": 1}], threadgroups=[512])
    assert str(info.value).startswith("rmsnorm: none of the 1 given configs is a legal config of threadgroup 512 for")
