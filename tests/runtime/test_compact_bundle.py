"""Compact bundles (schema 5): every file gzip-compressed, hashes of the stored bytes, one device inflated at a time."""

import json
import zlib
from pathlib import Path

import pytest

from bundle_fixtures import TOY_DEVICES, TOY_SHAPES, latest_dir
from zmlx_pipeline.publish.writer import PublishError, rewrite_bundle
from zmlx_pipeline.runtime import BundleError, BundleWarning, active_bundle, load_bundle, predicted_config
from zmlx_pipeline.runtime.bundle import COMPACT_SCHEMA_VERSION, read_dir


@pytest.fixture
def compact(toy_bundle, tmp_path) -> Path:
    manifest, path = rewrite_bundle(toy_bundle[1], tmp_path / "compact", compact=True)
    assert path == tmp_path / "compact"
    return path


def _answers():
    return [(kernel_dtype, device, tuple(shape.items()), p.config, p.evidence, p.predicted_us, p.expected_regret,
             [c for c in p.candidates])
            for device in (*TOY_DEVICES, "apple-m3-max-40c", "nvidia-a100-sxm4-80gb")
            for shape in (*TOY_SHAPES, {"rows": 300, "cols": 2000})
            for kernel_dtype in [("toy_scale", "float16")]
            for p in [predicted_config(*kernel_dtype[:1], shape, kernel_dtype[1], device=device)]]


def test_a_compact_bundle_stores_every_file_compressed_and_is_much_smaller(toy_bundle, compact):
    plain = json.loads((latest_dir(toy_bundle[1]) / "manifest.json").read_text())
    manifest = json.loads((compact / "manifest.json").read_text())
    assert manifest["schema_version"] == COMPACT_SCHEMA_VERSION == 5
    assert sorted(manifest["files"]) == sorted(name + ".gz" for name in plain["files"])
    assert sorted(p.relative_to(compact).as_posix() for p in compact.rglob("*") if p.is_file()) == sorted(
        [*manifest["files"], "manifest.json"])
    stored = sum(e["bytes"] for e in manifest["files"].values())
    assert stored * 3 < sum(e["bytes"] for e in plain["files"].values())
    for field in ("model_id", "models", "data_fingerprint", "kernels", "measured_devices", "created"):
        assert manifest[field] == plain[field]


def test_a_compact_bundle_declares_each_files_unpacked_size_and_a_bomb_stops_there(toy_bundle, compact):
    plain = json.loads((latest_dir(toy_bundle[1]) / "manifest.json").read_text())
    manifest = json.loads((compact / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        inflated = zlib.decompress((compact / name).read_bytes(), wbits=31)
        assert entry["unpacked_bytes"] == len(inflated) == plain["files"][name[:-3]]["bytes"]
    assert not any("unpacked_bytes" in e for e in plain["files"].values())
    name = _replace_table(compact, "nvidia-h100-sxm")
    declared = manifest["files"][name]["unpacked_bytes"]
    _replace_table(compact, "nvidia-h100-sxm", _gzip_bomb(64), unpacked_bytes=declared)
    load_bundle(compact, strict=True)
    with pytest.raises(BundleError, match=rf"{name} unpacks to more than {declared} bytes \(its manifest's "
                                          r"unpacked_bytes\)"):
        predicted_config("toy_scale", SHAPE, "float16", device="nvidia-h100-sxm")


def test_the_shipped_bundle_declares_every_unpacked_size():
    from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR

    manifest = json.loads((Path(DEFAULT_BUNDLE_DIR) / "manifest.json").read_text())
    assert all(type(e.get("unpacked_bytes")) is int and e["unpacked_bytes"] > e["bytes"]
               for e in manifest["files"].values())


def test_a_compact_bundle_answers_exactly_as_its_json_form(toy_bundle, compact):
    load_bundle(toy_bundle[1], strict=True)
    plain = _answers()
    load_bundle(compact, strict=True)
    assert active_bundle().schema_version == 5
    assert _answers() == plain
    assert {a[4] for a in plain} >= {"measured", "predicted"}


def test_only_the_device_asked_for_is_decompressed_and_parsed(compact, monkeypatch):
    from zmlx_pipeline.runtime import bundle as bundle_module

    inflated = []
    real = bundle_module._decompressed
    monkeypatch.setattr(bundle_module, "_decompressed",
                        lambda data, *a, **k: inflated.append(len(data)) or real(data, *a, **k))
    bundle = load_bundle(compact, strict=True)
    assert len(inflated) == 3  # the index files: kernels, profiles, tables
    assert set(bundle._parsed) == {"kernels.json", "profiles.json", "tables.json"}
    predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h200")
    assert len(inflated) == 4
    assert set(bundle._parsed) == {"kernels.json", "profiles.json", "tables.json", bundle.tables["nvidia-h200"]}
    predicted_config("toy_scale", {"rows": 1, "cols": 1024}, "float16", device="nvidia-h200")
    assert len(inflated) == 4


def test_json_to_compact_and_back_gives_the_same_files(toy_bundle, compact, tmp_path):
    plain = json.loads((latest_dir(toy_bundle[1]) / "manifest.json").read_text())
    manifest, back = rewrite_bundle(compact, tmp_path / "back", compact=False)
    assert manifest["schema_version"] == 4
    assert manifest["files"] == plain["files"] and manifest["bundle_id"] == plain["bundle_id"]
    again, _ = rewrite_bundle(back, tmp_path / "again", compact=True)
    assert again["files"] == json.loads((compact / "manifest.json").read_text())["files"]  # gzip without timestamps


def test_rewriting_in_place_replaces_the_bundle(compact):
    before = json.loads((compact / "manifest.json").read_text())
    manifest, path = rewrite_bundle(compact, compact, compact=False)
    assert path == compact and manifest["schema_version"] == 4
    assert not any(p.name.endswith(".gz") for p in compact.rglob("*"))
    assert read_dir(compact).manifest["bundle_id"] == manifest["bundle_id"] != before["bundle_id"]


@pytest.mark.parametrize("damage", ["tampered", "truncated", "not_gzip"])
def test_a_damaged_compact_bundle_is_refused_and_the_previous_one_keeps_serving(toy_bundle, compact, damage):
    good = load_bundle(toy_bundle[1], strict=True)
    table = compact / (json.loads(zlib.decompress((compact / "tables.json.gz").read_bytes(), wbits=31))
                       ["devices"]["nvidia-h100-sxm"] + ".gz")
    blob = table.read_bytes()
    if damage == "tampered":
        table.write_bytes(blob[:-9] + bytes([blob[-9] ^ 1]) + blob[-8:])
        expect = "sha256"
    elif damage == "truncated":
        table.write_bytes(blob[: len(blob) // 2])
        expect = "truncated"
    else:  # stored bytes that match the manifest but are not gzip: caught when that device is first asked for
        import hashlib

        table.write_bytes(b"not gzip at all")
        manifest = json.loads((compact / "manifest.json").read_text())
        manifest["files"][table.relative_to(compact).as_posix()] = {
            "sha256": hashlib.sha256(b"not gzip at all").hexdigest(), "bytes": 15}
        (compact / "manifest.json").write_text(json.dumps(manifest))
        load_bundle(compact, strict=True)
        with pytest.raises(BundleError, match="not valid gzip"):  # strict: the bundle it was pointed at, or nothing
            predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h100-sxm")
        load_bundle(compact)
        with pytest.warns(BundleWarning, match="not valid gzip"):
            p = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h100-sxm")
        assert p.evidence == "default"
        assert predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16",
                                device="nvidia-h200").evidence == "measured"
        return
    with pytest.warns(BundleWarning, match=expect):
        kept = load_bundle(compact)
    assert kept is good is active_bundle()
    with pytest.raises(BundleError, match=expect):
        load_bundle(compact, strict=True)


@pytest.mark.parametrize("plain_schema", [2, 4])
def test_compressed_names_mean_nothing_in_a_plain_schema(compact, plain_schema):
    manifest = json.loads((compact / "manifest.json").read_text())
    manifest["schema_version"] = plain_schema
    (compact / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="lacks kernels.json, profiles.json, tables.json"):
        read_dir(compact)


def test_a_schema_1_bundle_is_not_rewritten_as_a_newer_one(toy_bundle, tmp_path):
    import shutil

    old = tmp_path / "old"
    shutil.copytree(latest_dir(toy_bundle[1]), old)
    manifest = json.loads((old / "manifest.json").read_text())
    manifest["schema_version"] = 1
    (old / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PublishError, match="schema 1 predates schema 2; publish it again"):
        rewrite_bundle(old, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_compact_bundle_is_fetched_from_a_url_and_cached(compact, tmp_path, isolated_home):
    import functools
    import shutil
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    www = tmp_path / "www"
    shutil.copytree(compact, www / "v1")
    (www / "latest").write_text("v1\n")
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(www))
    handler.log_message = lambda *a, **k: None
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/"
    try:
        fetched = load_bundle(url, strict=True)
        assert fetched.schema_version == 5
        assert predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16",
                                device="nvidia-h100-sxm").evidence == "measured"
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert (fetched.root / "tables.json.gz").is_file()
    with pytest.warns(BundleWarning, match="using the cached copy"):
        again = load_bundle(url, strict=True)
    assert again.bundle_id == fetched.bundle_id and again.schema_version == 5
    assert predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16",
                            device="nvidia-h200").evidence == "measured"


SHAPE = {"rows": 64, "cols": 4096}


def _gzip_bomb(megabytes: int) -> bytes:
    """A valid gzip file of `{` + `megabytes` MiB of spaces + `}` (JSON `{}`), about 1 KB per MiB, built in a blink:
    each MiB after a full flush compresses to the same bytes, so one block is repeated."""
    import struct

    spaces = b" " * 2**20
    packer = zlib.compressobj(9, zlib.DEFLATED, -15)
    head = packer.compress(b"{") + packer.flush(zlib.Z_FULL_FLUSH)
    block = packer.compress(spaces) + packer.flush(zlib.Z_FULL_FLUSH)
    tail = packer.compress(b"}") + packer.flush()
    crc = zlib.crc32(b"{")
    for _ in range(megabytes):
        crc = zlib.crc32(spaces, crc)
    crc = zlib.crc32(b"}", crc)
    size = (megabytes * 2**20 + 2) & 0xFFFFFFFF
    return b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff" + head + block * megabytes + tail + struct.pack("<II", crc, size)


def _replace_table(compact: Path, device: str, blob: bytes | None = None, **entry) -> str:
    """Store `blob` as `device`'s table (or keep it), `entry` added to its manifest entry; its stored name."""
    import hashlib

    name = json.loads(zlib.decompress((compact / "tables.json.gz").read_bytes(), wbits=31))["devices"][device] + ".gz"
    if blob is not None:
        (compact / name).write_bytes(blob)
    blob = (compact / name).read_bytes()
    manifest = json.loads((compact / "manifest.json").read_text())
    manifest["files"][name] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob), **entry}
    (compact / "manifest.json").write_text(json.dumps(manifest))
    return name


def test_a_gzip_bomb_table_is_refused_before_it_is_inflated(compact, monkeypatch):
    import time
    import tracemalloc

    from zmlx_pipeline.runtime import bundle as bundle_module

    monkeypatch.setattr(bundle_module, "MAX_FILE_BYTES", 16 * 2**20)  # as a 1 GiB cap against a 32 GiB bomb
    bomb = _gzip_bomb(512)
    assert len(bomb) < 2**20
    name = _replace_table(compact, "nvidia-h100-sxm", bomb)
    load_bundle(compact, strict=True)  # the index files are fine: the table is inflated when first asked for
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(BundleError, match=rf"{name} unpacks to more than {16 * 2**20} bytes \(the most a bundle "
                                              r"file may hold\): a gzip bomb or a damaged file"):
            predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h100-sxm")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert time.perf_counter() - start < 1.0 and peak < 64 * 2**20  # 16 MiB inflated, not 512
    load_bundle(compact)
    with pytest.warns(BundleWarning, match="unpacks to more than"):
        p = predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h100-sxm")
    assert p.evidence == "default"
    assert predicted_config("toy_scale", SHAPE, "float16", device="nvidia-h200").evidence == "measured"


def test_a_table_unpacking_past_its_declared_size_is_refused(compact):
    raw = zlib.decompress((compact / _replace_table(compact, "nvidia-h200")).read_bytes(), wbits=31)
    name = _replace_table(compact, "nvidia-h200", unpacked_bytes=len(raw) - 1)
    load_bundle(compact, strict=True)
    with pytest.raises(BundleError, match=rf"{name} unpacks to more than {len(raw) - 1} bytes \(its manifest's "
                                          r"unpacked_bytes\)"):
        predicted_config("toy_scale", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h200")
    _replace_table(compact, "nvidia-h200", unpacked_bytes=len(raw))
    load_bundle(compact, strict=True)
    assert predicted_config("toy_scale", SHAPE, "float16", device="nvidia-h200").evidence == "measured"
    _replace_table(compact, "nvidia-h200", unpacked_bytes="many")
    with pytest.raises(BundleError, match=rf"manifest entry for '{name}' gives its unpacked size as 'many', not a "
                                          "whole number of bytes"):
        load_bundle(compact, strict=True)
