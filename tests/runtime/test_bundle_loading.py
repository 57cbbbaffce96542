"""load_bundle: every sha256 is checked; a bad bundle is refused and the one in use keeps serving."""

import json
import os
from pathlib import Path

import pytest

from bundle_fixtures import copy_bundle, latest_dir
from zmlx_pipeline.runtime import BundleError, BundleWarning, active_bundle, load_bundle, predicted_config
from zmlx_pipeline.runtime.bundle import default_bundle, read_dir

SHAPE = {"rows": 64, "cols": 4096}


def _lookup():
    return predicted_config("toy_scale", SHAPE, "float16", device="nvidia-h100-sxm")


def _rewrite_manifest(bundle: Path, **changes) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest.update(changes)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_a_good_bundle_loads_and_answers(toy_bundle):
    _, publish_dir = toy_bundle
    bundle = load_bundle(publish_dir, strict=True)
    assert bundle is active_bundle()
    assert bundle.root == latest_dir(publish_dir)
    assert _lookup().bundle_id == bundle.bundle_id
    assert _lookup().evidence == "measured"


@pytest.mark.parametrize("damage", ["tampered", "truncated", "wrong_schema", "newer_schema", "missing_file",
                                    "unsafe_name", "not_json", "malformed_contents"])
def test_a_bad_bundle_is_refused_and_the_previous_one_keeps_serving(toy_bundle, tmp_path, damage):
    _, publish_dir = toy_bundle
    good = load_bundle(publish_dir, strict=True)
    before = _lookup()
    bad = copy_bundle(publish_dir, tmp_path / "bad")
    kernels = bad / "kernels.json"
    if damage == "tampered":
        text = kernels.read_text()
        kernels.write_text(text.replace('"TG":512', '"TG":511', 1))
        assert kernels.read_text() != text
        expect = "sha256"
    elif damage == "truncated":
        kernels.write_bytes(kernels.read_bytes()[:100])
        expect = "truncated"
    elif damage == "wrong_schema":
        _rewrite_manifest(bad, schema="something-else")
        expect = "not a zmlx-pipeline bundle"
    elif damage == "newer_schema":
        _rewrite_manifest(bad, schema_version=99)
        expect = "newer"
    elif damage == "missing_file":
        kernels.unlink()
        expect = "cannot read kernels.json"
    elif damage == "unsafe_name":
        manifest = json.loads((bad / "manifest.json").read_text())
        manifest["files"]["../../etc/passwd"] = {"sha256": "0" * 64, "bytes": 1}
        (bad / "manifest.json").write_text(json.dumps(manifest))
        expect = "unsafe path"
    elif damage == "malformed_contents":  # hashes re-signed, but not the layout this runtime reads
        import hashlib

        kernels.write_text(json.dumps({"kernel_list": []}))
        manifest = json.loads((bad / "manifest.json").read_text())
        blob = kernels.read_bytes()
        manifest["files"]["kernels.json"] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
        (bad / "manifest.json").write_text(json.dumps(manifest))
        expect = "malformed index files"
    else:
        (bad / "manifest.json").write_text("{not json")
        expect = "not valid JSON"
    with pytest.warns(BundleWarning, match=expect) as caught:
        kept = load_bundle(bad)
    assert f"still using bundle {good.bundle_id}" in str(caught[0].message)
    assert kept is good and active_bundle() is good
    after = _lookup()
    assert after is before  # the same remembered answer: nothing was dropped
    with pytest.raises(BundleError, match=expect):
        load_bundle(bad, strict=True)


def test_a_refused_first_bundle_leaves_the_default_in_use(tmp_path):
    with pytest.warns(BundleWarning, match="no such bundle directory"):
        kept = load_bundle(tmp_path / "nowhere")
    assert kept is not None and kept.source == "default bundle"


def test_the_latest_pointer_names_the_newest_version(toy_bundle, tmp_path):
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.publish import publish

    db, _ = toy_bundle
    out = tmp_path / "pub"
    with Store(db, read_only=True) as store:
        first = publish(store, out, evaluate=False, devices=["nvidia-h200"])
        second = publish(store, out, evaluate=False, devices=["nvidia-h200", "apple-m4-max-40c"])
    assert first["bundle_id"] != second["bundle_id"]
    assert (out / "latest").read_text().strip() == Path(second["path"]).name
    assert load_bundle(out, strict=True).bundle_id == second["bundle_id"]
    assert read_dir(first["path"]).bundle_id == first["bundle_id"]  # the old version is intact
    assert not [p for p in os.listdir(out) if p.startswith(".")]  # no temp dir or pointer left behind


def test_a_latest_pointer_longer_than_a_pointer_is_refused_without_reading_it_whole(toy_bundle, tmp_path):
    import shutil

    from zmlx_pipeline.runtime.bundle import MAX_POINTER_BYTES, published_place

    out = tmp_path / "pub"
    shutil.copytree(toy_bundle[1], out)
    name = (out / "latest").read_text().strip()
    with open(out / "latest", "r+b") as fh:  # the name, then 16 GiB of nothing (sparse): read whole, it would not fit
        fh.truncate(1 << 34)
    message = f"{out / 'latest'} is over {MAX_POINTER_BYTES} bytes, longer than a latest pointer (one version "
    with pytest.raises(BundleError, match="^" + message.replace("(", r"\(").replace(")", r"\)")):
        load_bundle(out, strict=True)
    assert published_place(out) is None  # no pointer: not read as naming a bundle
    (out / "latest").write_text(name + "\n")
    assert load_bundle(out, strict=True).root == out / name


def test_the_default_bundle_verifies():
    bundle = default_bundle()
    assert set(bundle.logical_names()) >= {"kernels.json", "profiles.json", "tables.json", "autotune_v3.json"}
    assert "nvidia-h100-sxm" in bundle.manifest["measured_devices"]


def test_an_unreachable_server_falls_back_to_the_cached_copy(toy_bundle, tmp_path, isolated_home):
    import functools
    import shutil
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    from zmlx_pipeline.runtime.bundle import cache_root

    www = tmp_path / "www"
    shutil.copytree(toy_bundle[1], www)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a, **k: None
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    try:
        fetched = load_bundle(url, strict=True)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert str(cache_root()).startswith(str(isolated_home)) and (cache_root()).is_dir()
    assert fetched.root.parent.parent == cache_root()
    load_bundle(latest_dir(toy_bundle[1]), strict=True)  # something else in use meanwhile
    with pytest.warns(BundleWarning, match="cannot fetch.*using the cached copy"):
        again = load_bundle(url, strict=True)  # even strict: unreachable is not invalid
    assert again.bundle_id == fetched.bundle_id and again is active_bundle()
    assert _lookup().evidence == "measured"


def _as_schema_1(bundle: Path) -> None:
    """Rewrite a bundle as schema 1 wrote it: no transfer, work or measured range, 6-field entries."""
    import hashlib

    from zmlx_pipeline.runtime.lookup import ENTRY_FIELDS

    manifest = json.loads((bundle / "manifest.json").read_text())
    kernels = json.loads((bundle / "kernels.json").read_text())
    for meta in kernels["kernels"].values():
        for field in ("transfer", "work", "measured_range"):
            meta.pop(field)
    files = {"kernels.json": kernels}
    for name in json.loads((bundle / "tables.json").read_text())["devices"].values():
        table = json.loads((bundle / name).read_text())
        for by_dtype in table["kernels"].values():
            for t in by_dtype.values():
                for kind in t.values():
                    for key, entry in kind.items():  # a list by position (lookup.ENTRY_FIELDS' first six)
                        kind[key] = [entry[f] for f in ENTRY_FIELDS[:6]]
        files[name] = table
    for name, content in files.items():
        blob = json.dumps(content).encode()
        (bundle / name).write_bytes(blob)
        manifest["files"][name] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
    manifest["schema_version"] = 1
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def test_a_schema_1_bundle_still_loads_and_answers_as_honestly_as_it_can(toy_bundle, tmp_path):
    old = copy_bundle(toy_bundle[1], tmp_path / "old")
    _as_schema_1(old)
    bundle = load_bundle(old, strict=True)
    assert bundle.schema_version == 1
    assert _lookup().evidence == "measured"
    # the family is worked out from the profiles; no time was moved to the chip, so none is quoted
    apple = predicted_config("toy_scale", SHAPE, "float16", device="apple-m3-max-40c")
    assert (apple.evidence, apple.expected_regret, apple.predicted_us) == ("extrapolated", None, None)
    assert "measured families: nvidia hopper" in apple.note
    pcie = predicted_config("toy_scale", SHAPE, "float16", device="nvidia-h100-pcie")
    assert pcie.evidence == "predicted" and pcie.expected_regret is not None and pcie.predicted_us is None
    _rewrite_manifest(old, schema_version=0)
    with pytest.raises(BundleError, match="bundle schema 0 is older than this runtime reads"):
        load_bundle(old, strict=True)


def _resign(bundle: Path, name: str, blob: bytes) -> None:
    """Write one file of the bundle and its manifest entry, so its hashes match but its content is malformed."""
    import hashlib

    (bundle / name).write_bytes(blob)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def _edit(bundle: Path, name: str, change) -> None:
    data = json.loads((bundle / name).read_text())
    change(data)
    _resign(bundle, name, json.dumps(data).encode())


def _toy(data: dict) -> dict:
    return data["kernels"]["toy_scale"]


def _h200_table(bundle: Path) -> str:
    return json.loads((bundle / "tables.json").read_text())["devices"]["nvidia-h200"]


def _h200_entries(data: dict) -> list:
    table = _toy(data)["float16"]
    return list(table["measured"].values()) + list(table["buckets"].values())


def _set_all(field, value):
    return lambda data: [entry.__setitem__(field, value) for entry in _h200_entries(data)]


def _manifest(bundle: Path, change) -> None:
    manifest = json.loads((bundle / "manifest.json").read_text())
    change(manifest)
    (bundle / "manifest.json").write_text(json.dumps(manifest))


#: index files (and the manifest) whose hashes match but whose content the runtime cannot read: refused at load
BAD_INDEX = {
    "configs ints": lambda b: _edit(b, "kernels.json", lambda d: _toy(d).__setitem__("configs", [1] * 12)),
    "measured range bad": lambda b: _edit(b, "kernels.json",
                                          lambda d: _toy(d).__setitem__("measured_range", {"rows": "x"})),
    "prune_k str": lambda b: _edit(b, "kernels.json", lambda d: _toy(d).__setitem__("prune_k", "abc")),
    "prune_k negative": lambda b: _edit(b, "kernels.json", lambda d: _toy(d).__setitem__("prune_k", -3)),
    "dim_weights str": lambda b: _edit(b, "kernels.json",
                                       lambda d: _toy(d).__setitem__("dim_weights", {"rows": "heavy"})),
    "order out of range": lambda b: _edit(b, "kernels.json", lambda d: _toy(d).__setitem__("order", [99999])),
    "dims short": lambda b: _edit(b, "kernels.json", lambda d: _toy(d).__setitem__("dims", ["rows"])),
    "kernels nested deep": lambda b: _resign(b, "kernels.json", b"[" * 100000 + b"]" * 100000),
    "kernels NaN": lambda b: _resign(b, "kernels.json",
                                     (b / "kernels.json").read_bytes().replace(b"{", b'{"nan": NaN, ', 1)),
    "profiles list": lambda b: _edit(b, "profiles.json", lambda d: d.__setitem__("devices", [])),
    "profile null": lambda b: _edit(b, "profiles.json", lambda d: d["devices"].__setitem__("nvidia-h200", None)),
    "max threads str": lambda b: _edit(
        b, "profiles.json", lambda d: d["devices"]["nvidia-h200"].__setitem__("max_threads_per_threadgroup", "abc")),
    "schema_version true": lambda b: _manifest(b, lambda m: m.__setitem__("schema_version", True)),
    "file bytes str": lambda b: _manifest(b, lambda m: m["files"]["kernels.json"].__setitem__("bytes", "many")),
    "file bytes huge": lambda b: _manifest(b, lambda m: m["files"]["kernels.json"].__setitem__("bytes", 10**30)),
    "file bytes negative": lambda b: _manifest(b, lambda m: m["files"]["kernels.json"].__setitem__("bytes", -1)),
    "manifest nested deep": lambda b: (b / "manifest.json").write_bytes(b"[" * 100000),
    # a constraint the runtime cannot evaluate would be skipped, letting every config pass it
    "constraint no expression": lambda b: _edit(b, "kernels.json", lambda d: _toy(d).__setitem__("constraints",
                                                                                                ["TG < ("])),
    "constraint not arithmetic": lambda b: _edit(b, "kernels.json", lambda d: _toy(d).__setitem__(
        "constraints", ["TG.bit_length() < 9"])),
    "constraint of an unknown name": lambda b: _edit(b, "kernels.json", lambda d: _toy(d).__setitem__(
        "constraints", ["TG <= nope"])),
    "config lacks a parameter": lambda b: _edit(b, "kernels.json", lambda d: _toy(d)["configs"][0].pop("VEC")),
    "config of another parameter": lambda b: _edit(b, "kernels.json", lambda d: _toy(d)["configs"][0].__setitem__(
        "ROWS", 1)),
    "config value str": lambda b: _edit(b, "kernels.json", lambda d: _toy(d)["configs"][0].__setitem__("TG", "128")),
    "config value bool": lambda b: _edit(b, "kernels.json", lambda d: _toy(d)["configs"][0].__setitem__("TG", True)),
    "config value float": lambda b: _edit(b, "kernels.json", lambda d: _toy(d)["configs"][0].__setitem__("TG", 128.0)),
    "config value huge": lambda b: _edit(b, "kernels.json", lambda d: _toy(d)["configs"][0].__setitem__("TG", 2**64)),
    "threadgroup_param not a parameter": lambda b: _edit(b, "kernels.json", lambda d: _toy(d).__setitem__(
        "threadgroup_param", "WG")),
    "prune_k past the cap": lambda b: _edit(b, "kernels.json", lambda d: _toy(d).__setitem__("prune_k", 10**9)),
    "bucket shape past the largest dim": lambda b: _edit(b, "kernels.json", lambda d: next(iter(
        _toy(d)["buckets"].values())).__setitem__("rows", 2**31)),
    "measured range past the largest dim": lambda b: _edit(b, "kernels.json", lambda d: _toy(d)[
        "measured_range"].__setitem__("rows", [1, 2**40])),
    "by_dim key of thousands of digits": lambda b: _edit(b, "profiles.json", lambda d: d["devices"][
        "nvidia-h200"].__setitem__("general", {"by_dim": {"9" * 5000: [256]}})),
}

#: a device's table whose hashes match but whose content the runtime cannot use: refused when first read
BAD_TABLE = {
    "best out of range": _set_all("best", 99999),
    "best negative": _set_all("best", -1),
    "ranked out of range": _set_all("ranked", [99999, -1]),
    "evidence bogus": _set_all("evidence", "bogus"),
    "time negative": _set_all("time_us", -5.0),
    "time str": _set_all("time_us", "fast"),
    "regret str": _set_all("expected_regret", "low"),
    "key not numbers": lambda d: _toy(d)["float16"].__setitem__("measured", {"a,b": _h200_entries(d)[0]}),
    "measured a list": lambda d: _toy(d)["float16"].__setitem__("measured", []),
    "kernels a list": lambda d: d.__setitem__("kernels", ["x"]),
    # a bucket key is each dim's log2: past 31 it names a shape no array can have (2**20000 rows)
    "bucket exponent past 31": lambda d: _toy(d)["float16"].__setitem__("buckets", {"20000,12": _h200_entries(d)[0]}),
    "bucket key of thousands of digits": lambda d: _toy(d)["float16"].__setitem__(
        "buckets", {"9" * 5000 + ",12": _h200_entries(d)[0]}),
    "measured dim past the largest": lambda d: _toy(d)["float16"].__setitem__(
        "measured", {"64,2147483648": _h200_entries(d)[0]}),
}


@pytest.mark.parametrize("damage", list(BAD_INDEX))
def test_a_bundle_whose_index_files_are_malformed_is_refused_at_load(toy_bundle, tmp_path, damage):
    from zmlx_pipeline.runtime import ALL_DEVICE_PROFILES, get_device_profile, get_threadgroup_candidates_for_shape

    good = load_bundle(toy_bundle[1], strict=True)
    before = _lookup()
    bad = copy_bundle(toy_bundle[1], tmp_path / "bad")
    BAD_INDEX[damage](bad)
    with pytest.raises(BundleError) as info:
        load_bundle(bad, strict=True)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400
    with pytest.warns(BundleWarning) as caught:
        kept = load_bundle(bad)
    assert len(caught) == 1 and kept is good is active_bundle()
    assert _lookup() is before
    profile = get_device_profile("nvidia-h200")
    assert isinstance(profile.max_threads_per_threadgroup, int) and len(ALL_DEVICE_PROFILES) == 16
    assert get_threadgroup_candidates_for_shape(profile, 4096)


@pytest.mark.parametrize("damage", list(BAD_TABLE))
def test_a_malformed_device_table_is_refused_strictly_and_answered_by_default_otherwise(toy_bundle, tmp_path, damage):
    bad = copy_bundle(toy_bundle[1], tmp_path / "bad")
    _edit(bad, _h200_table(bad), BAD_TABLE[damage])
    load_bundle(bad, strict=True)
    with pytest.raises(BundleError, match="malformed table") as info:
        predicted_config("toy_scale", SHAPE, "float16", device="nvidia-h200")
    assert "\n" not in str(info.value) and len(str(info.value)) < 400
    load_bundle(bad)
    with pytest.warns(BundleWarning, match="the table of nvidia-h200 is unusable") as caught:
        p = predicted_config("toy_scale", SHAPE, "float16", device="nvidia-h200")
        predicted_config("toy_scale", {"rows": 1, "cols": 1024}, "float16", device="nvidia-h200")
    assert len(caught) == 1 and p.evidence == "default" and p.predicted_us is None
    assert _lookup().evidence == "measured"  # another device's table is untouched


@pytest.mark.parametrize("damage", ["file bytes huge", "manifest nested deep", "constraint of an unknown name"])
def test_a_malformed_bundle_the_environment_names_is_one_warning_and_the_default_answers(toy_bundle, tmp_path,
                                                                                       monkeypatch, damage):
    bad = copy_bundle(toy_bundle[1], tmp_path / "bad")
    BAD_INDEX[damage](bad)
    monkeypatch.setenv("ZMLX_PIPELINE_BUNDLE", str(bad))
    with pytest.warns(BundleWarning, match=r"\(\$ZMLX_PIPELINE_BUNDLE\); using the default bundle") as caught:
        p = predicted_config("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", device="nvidia-h200")
    assert len(caught) == 1 and p.evidence == "measured" and p.bundle_id == default_bundle().bundle_id


def _rms(data: dict) -> dict:
    return data["kernels"]["rmsnorm"]


def _without_rows_param(data: dict) -> None:
    meta = _rms(data)
    meta["params"].remove("ROWS")
    for config in meta["configs"]:
        config.pop("ROWS")


#: rmsnorm described otherwise than the built-in kernel is (its constraints dropped, its parameters changed): a
#: lookup would answer configs the kernel cannot run, such as ROWS=1 TG=128 VEC=8 for 1 x 8
NOT_THE_BUILT_IN = {
    "no constraints": (lambda d: _rms(d).__setitem__("constraints", []), "lacks 6 constraint"),
    "a constraint that always holds": (lambda d: _rms(d).__setitem__("constraints", ["1"]), "lacks 6 constraint"),
    "one constraint dropped": (lambda d: _rms(d)["constraints"].remove("(TG // ROWS) * VEC <= cols"),
                               r"lacks 1 constraint.*'\(TG // ROWS\) \* VEC <= cols'"),
    "a parameter dropped": (_without_rows_param, "parameters TG, VEC are not the built-in kernel's"),
    "dims swapped": (lambda d: _rms(d).__setitem__("dims", ["cols", "rows"]), "dims cols, rows are not the built-in"),
    "another threadgroup parameter": (lambda d: _rms(d).__setitem__("threadgroup_param", "VEC"),
                                      "threadgroup_param 'VEC' is not the built-in kernel's"),
}


@pytest.mark.parametrize("change", list(NOT_THE_BUILT_IN))
def test_a_built_in_kernel_described_otherwise_than_the_shipped_one_is_refused_at_load(real_bundle, tmp_path,
                                                                                       change):
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.spec import Limits

    edit, says = NOT_THE_BUILT_IN[change]
    bad = copy_bundle(real_bundle[1], tmp_path / "bad")
    _edit(bad, "kernels.json", edit)
    with pytest.raises(BundleError, match=says) as info:
        load_bundle(bad, strict=True)
    assert "\n" not in str(info.value) and "kernels.json: kernels[rmsnorm]" in str(info.value)
    with pytest.warns(BundleWarning, match=says) as caught:
        kept = load_bundle(bad)
    assert len(caught) == 1 and kept.source == "default bundle"
    shape = {"rows": 1, "cols": 8}
    p = predicted_config("rmsnorm", shape, "float16", device="nvidia-h200")
    limits = Limits.from_device_row(kept.profiles["nvidia-h200"])
    assert all(get_kernel("rmsnorm").violations(c, shape, "float16", limits) == [] for c in p.candidates)


def test_a_built_in_kernel_may_hold_more_constraints_than_the_shipped_one(real_bundle, tmp_path):
    stricter = copy_bundle(real_bundle[1], tmp_path / "stricter")
    _edit(stricter, "kernels.json", lambda d: _rms(d)["constraints"].append("TG >= 512"))
    load_bundle(stricter, strict=True)
    p = predicted_config("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", device="nvidia-h200")
    assert p.candidates and all(c["TG"] >= 512 for c in p.candidates)


def _default_copy_with(tmp_path: Path, listed: str, kind: str) -> Path:
    """A copy of the shipped bundle where one listed file is replaced by something that is not a regular file."""
    import shutil

    from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR

    bad = tmp_path / "bad"
    shutil.copytree(DEFAULT_BUNDLE_DIR, bad)
    if listed == "device table":
        listed = default_bundle().stored_name(default_bundle().tables["nvidia-h200"])
    target = bad / listed
    target.unlink()
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "device":
        target.symlink_to("/dev/null")
    else:
        target.mkdir()
    return bad


def _within(seconds: float, call):
    """What `call()` returns or raises, run in a thread: fails instead of hanging when it blocks."""
    import threading

    out: dict = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the load blocked"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.mark.parametrize("kind, says", [("fifo", "a FIFO"), ("device", "a device"), ("directory", "a directory")])
@pytest.mark.parametrize("listed", ["kernels.json.gz", "device table"])
def test_a_listed_file_that_is_not_a_regular_file_is_refused_at_once(tmp_path, monkeypatch, listed, kind, says):
    bad = _default_copy_with(tmp_path, listed, kind)
    with pytest.raises(BundleError, match=f"{says}, not a regular file") as info:
        _within(30, lambda: load_bundle(bad, strict=True))
    assert "\n" not in str(info.value)
    with pytest.warns(BundleWarning) as caught:
        kept = _within(30, lambda: load_bundle(bad))
    assert len(caught) == 1 and kept.source == "default bundle"
    from zmlx_pipeline.runtime.bundle import reset

    reset()
    monkeypatch.setenv("ZMLX_PIPELINE_BUNDLE", str(bad))
    with pytest.warns(BundleWarning, match="ZMLX_PIPELINE_BUNDLE") as caught:
        p = _within(30, lambda: predicted_config("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", "nvidia-h200"))
    assert len(caught) == 1 and p.evidence == "measured"


def test_a_listed_file_larger_than_the_manifest_says_is_refused_unread(tmp_path, monkeypatch):
    import shutil

    from zmlx_pipeline.runtime import bundle as bundle_module

    bad = tmp_path / "bad"
    shutil.copytree(bundle_module.DEFAULT_BUNDLE_DIR, bad)
    (bad / "kernels.json.gz").write_bytes(b"\0" * (10 * 1024**2))
    sizes = json.loads((bad / "manifest.json").read_text())["files"]
    real = bundle_module.read_regular
    asked = []
    monkeypatch.setattr(bundle_module, "read_regular", lambda path, limit: asked.append(limit) or real(path, limit))
    with pytest.raises(BundleError, match=f"kernels.json.gz is larger than the {sizes['kernels.json.gz']['bytes']} "):
        load_bundle(bad, strict=True)
    assert asked and max(asked[1:]) <= max(e["bytes"] for e in sizes.values())


def test_a_file_url_is_read_as_its_path_and_a_location_no_bundle_can_be_at_is_refused(toy_bundle, monkeypatch):
    from urllib.parse import quote

    from zmlx_pipeline.runtime import BadArgument

    url = "file://" + quote(str(toy_bundle[1]))
    assert load_bundle(url, strict=True).bundle_id == read_dir(toy_bundle[1]).bundle_id
    for bad, says in (("ftp://example.org/bundles", "ftp:// is not read"), ("file://otherhost/b", "on host 'otherhost'"),
                      (str(toy_bundle[1]) + "\0", "holds a NUL byte")):
        with pytest.raises(BadArgument, match=says):
            load_bundle(bad)
    # the same location in $ZMLX_PIPELINE_BUNDLE is a refused bundle: one warning, the default answers
    import zmlx_pipeline.runtime.bundle as bundle_module

    monkeypatch.setattr(bundle_module, "_ACTIVE", None)
    monkeypatch.setenv("ZMLX_PIPELINE_BUNDLE", "ftp://example.org/bundles")
    with pytest.warns(BundleWarning, match=r"ftp:// is not read.*\(\$ZMLX_PIPELINE_BUNDLE\); using the default bundle"):
        active_bundle()
    assert active_bundle().bundle_id == default_bundle().bundle_id


class _Server:
    """A local HTTP server in a thread: `answer(handler)` serves every GET; stopped (and its trickles ended) on exit."""

    def __init__(self, answer):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.stop = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                try:
                    answer(self, outer.stop)
                except OSError:  # the client went away
                    pass

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def _timed(seconds, fn):
    """(what fn returned or raised, seconds it took), or fails when it is still running after `seconds`."""
    import threading
    import time

    out = []
    start = time.monotonic()

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(seconds)
    assert out, f"still running after {seconds} s"
    return out[0], time.monotonic() - start



def _trickle(handler, stop, start=b"HTTP/1.1 200 OK\r\n\r\n"):
    """`start`, then 1 byte every 0.05 s until the test ends (the default: a 200 with no size, then its body)."""
    import time

    handler.wfile.write(start)
    while not stop.is_set():
        handler.wfile.write(b"a")
        handler.wfile.flush()
        time.sleep(0.05)


@pytest.mark.parametrize("part", ["body", "headers"])
def test_a_server_that_trickles_is_cut_off_at_the_deadline(monkeypatch, part):
    import re

    from zmlx_pipeline.runtime import bundle as bundle_module

    monkeypatch.setattr(bundle_module, "FETCH_DEADLINE_S", 1.0, raising=False)  # raising: the code before had none
    start = b"HTTP/1.1 200 OK\r\n\r\n" if part == "body" else b"HTTP/1.1 200 OK\r\nX-Slow: "
    with _Server(lambda h, stop: _trickle(h, stop, start)) as server:
        error, took = _timed(10, lambda: load_bundle(server.url + "/b", strict=True))
    assert isinstance(error, bundle_module.FetchError), error
    assert re.fullmatch(rf"{server.url}/b/manifest.json: no complete answer within 1 s \(\d+ bytes received\): "
                        "the server stalls or sends too slowly", str(error))
    assert took < 5  # the manifest and then the `latest` pointer, 1 s each


def _serve_bundle(root: Path, slow: str):
    """An answer serving the files of `root` under /b/, but `slow` as a 200 announcing 100 MB, then trickled."""

    def answer(handler, stop):
        name = handler.path.split("/b/", 1)[1]
        if name == slow:
            return _trickle(handler, stop, b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n")
        try:
            blob = (root / name).read_bytes()
        except OSError:
            return handler.send_error(404)
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(blob)))
        handler.end_headers()
        handler.wfile.write(blob)

    return answer


@pytest.mark.parametrize("slow, limit", [("kernels.json", None), ("manifest.json", 64 * 1024**2)])
def test_a_file_the_server_announces_larger_than_it_may_be_is_refused_at_once(toy_bundle, slow, limit):
    root = latest_dir(toy_bundle[1])
    limit = limit or json.loads((root / "manifest.json").read_text())["files"]["kernels.json"]["bytes"]
    with _Server(_serve_bundle(root, slow)) as server:
        error, took = _timed(10, lambda: load_bundle(server.url + "/b", strict=True))
        assert isinstance(error, BundleError) and took < 5, error
        assert str(error) == (f"{server.url}/b/{slow}: the server announces 100000000 bytes, more than the {limit} "
                              "this file may have")
        with pytest.warns(BundleWarning, match="announces 100000000 bytes") as caught:
            kept = load_bundle(server.url + "/b")
    assert len(caught) == 1 and kept.bundle_id == default_bundle().bundle_id


def test_a_bundle_whose_files_each_come_slowly_is_cut_off_at_the_bundle_deadline(toy_bundle, monkeypatch):
    import time

    from zmlx_pipeline.runtime import bundle as bundle_module

    root = latest_dir(toy_bundle[1])
    files = json.loads((root / "manifest.json").read_text())["files"]
    assert len(files) >= 5
    serve = _serve_bundle(root, "")

    def slow(handler, stop):  # every file in time for its own deadline, but not the bundle in time for its
        time.sleep(0.4)
        serve(handler, stop)

    monkeypatch.setattr(bundle_module, "FETCH_DEADLINE_S", 1.0)
    monkeypatch.setattr(bundle_module, "FETCH_BUNDLE_DEADLINE_S", 1.5)
    with _Server(slow) as server:
        error, took = _timed(10, lambda: load_bundle(server.url + "/b", strict=True))
        assert isinstance(error, bundle_module.FetchError), error
        assert str(error).endswith(": the bundle's files did not all arrive within 1.5 s: the server sends too slowly")
        assert took < 3
        monkeypatch.setattr(bundle_module, "FETCH_BUNDLE_DEADLINE_S", 60.0)
        fetched = load_bundle(server.url + "/b", strict=True)
    assert fetched.bundle_id == json.loads((root / "manifest.json").read_text())["bundle_id"]


def _redirect(to):
    def answer(handler, stop):
        handler.send_response(302)
        target = to(handler.path)
        if target is not None:
            handler.send_header("Location", target)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def test_a_bundle_behind_a_redirect_is_followed(toy_bundle):
    root = latest_dir(toy_bundle[1])
    with _Server(_serve_bundle(root, "")) as files:
        with _Server(_redirect(lambda path: files.url + path)) as server:
            fetched = load_bundle(server.url + "/b", strict=True)
    assert fetched.bundle_id == json.loads((root / "manifest.json").read_text())["bundle_id"]
    assert _lookup().evidence == "measured"


@pytest.mark.parametrize("to, why", [
    (lambda path: path, r"a redirect loop, or more than 10 redirects; the last said: Found"),
    (lambda path: path + "x", r"a redirect loop, or more than 10 redirects; the last said: Found"),
    (lambda path: None, "it names no Location"),
    (lambda path: "ftp://127.0.0.1/b/manifest.json", "to 'ftp://127.0.0.1/b/manifest.json', not an http\\(s\\) URL"),
    (lambda path: "file:///etc/passwd", "Redirection to url 'file:///etc/passwd' is not allowed"),
], ids=["loop", "endless", "no location", "to ftp", "to a file"])
def test_a_redirect_that_is_not_followed_says_why_and_asks_for_the_final_url(to, why):
    import re

    with _Server(_redirect(to)) as server:
        error, _ = _timed(10, lambda: load_bundle(server.url + "/b", strict=True))
    assert isinstance(error, BundleError) and "\n" not in str(error)
    assert re.fullmatch(rf"{server.url}/b/manifest.json: HTTP 302, a redirect not followed \(.*{why}.*\): redirects "
                        r"are followed only to http\(s\) URLs, at most 10; give the bundle's final URL", str(error))


def test_a_fetch_the_full_disk_cannot_cache_leaves_no_temp_dir_and_the_next_sweeps_stale_ones(toy_bundle,
                                                                                              isolated_home,
                                                                                              monkeypatch):
    import errno
    import os
    import time

    from zmlx_pipeline.runtime.bundle import STALE_FETCH_S, _url_dir

    real_write = Path.write_bytes
    written = []

    def fills_up(self, data):  # the first file fits, the second finds the disk full
        if written:
            raise OSError(errno.ENOSPC, "No space left on device")
        written.append(self)
        return real_write(self, data)

    with _Server(_serve_bundle(latest_dir(toy_bundle[1]), "")) as server:
        url = server.url + "/b"
        monkeypatch.setattr(Path, "write_bytes", fills_up)
        with pytest.warns(BundleWarning, match=r"verified but not cached \(\[Errno 28\] No space left on device\)"):
            fetched = load_bundle(url, strict=True)
        monkeypatch.setattr(Path, "write_bytes", real_write)
        top = _url_dir(url)
        assert fetched.bundle_id == read_dir(latest_dir(toy_bundle[1])).bundle_id and written
        assert not list(top.glob(".fetch-*"))  # the half-written one is gone
        stale, fresh = top / ".fetch-died", top / ".fetch-writing"  # an earlier run's, and another process's now
        for d in (stale, fresh):
            (d / "devices").mkdir(parents=True)
            (d / "kernels.json").write_text("{}")
        old = time.time() - STALE_FETCH_S - 60
        os.utime(stale, (old, old))
        assert load_bundle(url, strict=True).root.parent == top
    assert sorted(p.name for p in top.glob(".fetch-*")) == [".fetch-writing"]
    assert (top / (top / "latest").read_text().strip() / "manifest.json").is_file()
