"""An imported kernel's config values may be text, fractions or booleans (Kernel Tuner tunes "fast"/"safe" and 0.5):
publish writes them and the runtime reads that bundle and answers with them; a built-in kernel's values, any
kernel's threadgroup sizes and whatever a constraint computes with stay whole numbers, refused in one line."""

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from bundle_fixtures import add_device, latest_dir
from zmlx_pipeline.data.records import Measurement
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.runtime import BundleError, load_bundle, predicted_config

KERNEL = "kt_mix"
DEVICES = ("nvidia-h100-sxm", "nvidia-h200")
SHAPES = [{"rows": r, "cols": c} for r in (1, 64, 4096) for c in (1024, 4096)]
CONFIGS = [{"TG": tg, "algo": algo, "ratio": ratio}
           for tg in (64, 128, 256) for algo in ("fast", "safe") for ratio in (0.5, 1.5)]
SHAPE = {"rows": 4096, "cols": 4096}  # a measured shape


def mix_time(device: str, shape: dict, config: dict) -> float:
    """A made-up time: "safe" is slower, ratio 0.5 faster, and each device has its own best threadgroup."""
    ideal = 7 if device == "nvidia-h200" else 8
    base = 2.0 + shape["rows"] * shape["cols"] / 2e6
    return base * (1 + 0.25 * abs(math.log2(config["TG"]) - ideal) + 0.3 * (config["algo"] == "safe")
                   + 0.1 * config["ratio"])


def mix_best(device: str, shape: dict) -> dict:
    return min(CONFIGS, key=lambda c: mix_time(device, shape, c))


@pytest.fixture(scope="module")
def mix_bundle(tmp_path_factory) -> tuple[Path, Path]:
    """(store, publish dir) of a kernel whose configs mix whole numbers, text and fractions, as an import stores it."""
    from zmlx_pipeline.publish import publish

    root = tmp_path_factory.mktemp("mix")
    with Store(root / "mix.duckdb") as store:
        for device in DEVICES:
            add_device(store, device)
            run = store.start_run(device, host="test", backend="cuda", mlx_version="0.30.0",
                                  pipeline_version="0.1.0", settings={}, status="imported")
            store.record([Measurement(run_id=run, device_id=device, kernel=KERNEL,
                                      kernel_version="sha256:00000000000000bb", dtype="float32", shape=shape,
                                      config=config, status="ok", median_us=mix_time(device, shape, config),
                                      p10_us=None, p90_us=None, samples=10)
                          for shape in SHAPES for config in CONFIGS])
            store.finish_run(run, "imported")
        publish(store, root / "pub", devices=["nvidia-h100-pcie"], evaluate=False)
    return root / "mix.duckdb", root / "pub"


def test_a_kernel_tuned_over_text_and_fractions_is_published_and_answered(mix_bundle):
    bundle = load_bundle(mix_bundle[1], strict=True)
    meta = bundle.kernels[KERNEL]
    assert meta["spec"] == "measured configs only" and meta["threadgroup_param"] == "TG"
    assert {type(c["algo"]) for c in meta["configs"]} == {str}
    assert {type(c["ratio"]) for c in meta["configs"]} == {float}
    for device in DEVICES:
        answer = predicted_config(KERNEL, SHAPE, "float32", device=device)
        assert answer.evidence == "measured" and answer.config == mix_best(device, SHAPE)
        assert answer.threadgroup == answer.config["TG"]
    other = predicted_config(KERNEL, SHAPE, "float32", device="nvidia-h100-pcie")  # never measured: predicted
    assert other.evidence == "predicted" and other.config in CONFIGS
    assert all(c in CONFIGS for c in other.top(4))


def test_tune_says_an_imported_kernel_has_no_source_to_time(mix_bundle, tmp_path):
    from zmlx_pipeline.runtime import UnknownKernelError, tune

    load_bundle(mix_bundle[1], strict=True)
    with pytest.raises(UnknownKernelError) as info:
        tune(KERNEL, SHAPE, "float32", device="nvidia-h200", cache_path=str(tmp_path / "c.json"),
             measure=lambda *a: ("ok", 1.0))
    assert "is in the bundle from imported measurements, with no source here" in str(info.value)
    assert "predicted_config" in str(info.value) and not (tmp_path / "c.json").exists()


def test_the_lookup_command_answers_such_a_kernel(mix_bundle):
    from zmlx_pipeline.pipeline.cli import cli

    result = CliRunner().invoke(cli, ["lookup", KERNEL, "--shape", "rows=4096,cols=4096", "--dtype", "float32", "--device",
                                      "nvidia-h200", "--bundle", str(mix_bundle[1]), "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    assert answer["config"] == mix_best("nvidia-h200", SHAPE) and answer["evidence"] == "measured"


def _resign(bundle: Path, text: str) -> None:
    """Write the bundle's kernels.json and make its manifest entry match again (hashes right, content malformed)."""
    import hashlib

    blob = text.encode()
    (bundle / "kernels.json").write_bytes(blob)
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["files"]["kernels.json"] = {"sha256": hashlib.sha256(blob).hexdigest(), "bytes": len(blob)}
    (bundle / "manifest.json").write_text(json.dumps(manifest))


def _resigned(src: Path, dest: Path, change) -> Path:
    """A copy of a plain bundle whose kernels.json is changed by `change(kernels)`."""
    import shutil

    shutil.copytree(src, dest)
    data = json.loads((dest / "kernels.json").read_text())
    change(data["kernels"])
    _resign(dest, json.dumps(data))
    return dest


def _set(config_index: int, param: str, value):
    return lambda kernels: kernels[KERNEL]["configs"][config_index].__setitem__(param, value)


def _registered(kernels: dict) -> None:
    kernels[KERNEL]["spec"] = "registered"


@pytest.mark.parametrize("change, problem", [
    # a kernel the bundle names as built in (a registered spec) launches whole numbers only
    (_registered, r"\.configs\[0\]\[algo\] must be a whole number from -2147483647 to 2147483647 "
                  r"\(a built-in kernel's parameter\), not str 'fast'"),
    # lookups take the threadgroup's log2, the tuner its bit length
    (_set(0, "TG", "64"), r"\.configs\[0\]\[TG\] must be a whole number from -2147483647 to "
                          r"2147483647 \(the threadgroup size\), not str '64'"),
    (_set(0, "TG", None), r"\.configs\[0\]\[TG\] must be a whole number .* not NoneType None"),
    # what lookups cannot hash, compare or print on one line
    (_set(0, "algo", ["fast"]), r"\.configs\[0\]\[algo\] must be a whole number from -2\*\*63 to 2\*\*63-1, a finite "
                                r"number, a boolean, null or printable text of at most 256 characters, not list"),
    (_set(0, "algo", "fast\x1b[31m"), r"\.configs\[0\]\[algo\] must be .* printable text"),
    (_set(0, "algo", "f" * 257), r"\.configs\[0\]\[algo\] must be .* at most 256 characters"),
    (_set(0, "ratio", 2**63), r"\.configs\[0\]\[ratio\] must be a whole number from -2\*\*63"),
    # a constraint over text would raise TypeError and be skipped, letting every config pass it
    (lambda k: k[KERNEL].__setitem__("constraints", ["algo * 2 <= TG"]),
     r"\.constraints\[0\] 'algo \* 2 <= TG' reads algo, whose values are not all numbers"),
], ids=["built-in text", "threadgroup text", "threadgroup null", "list", "escape", "long text", "past int64",
        "constraint over text"])
def test_a_config_value_the_runtime_cannot_use_is_refused_in_one_line(mix_bundle, tmp_path, change, problem):
    bad = _resigned(latest_dir(mix_bundle[1]), tmp_path / "bad", change)
    with pytest.raises(BundleError, match=r"malformed index files: kernels.json: kernels\[kt_mix\]" + problem) as info:
        load_bundle(bad, strict=True)
    assert "\n" not in str(info.value)


def test_a_fraction_past_any_float_is_refused(mix_bundle, tmp_path):
    bad = _resigned(latest_dir(mix_bundle[1]), tmp_path / "bad", _set(0, "ratio", 0.25))
    _resign(bad, (bad / "kernels.json").read_text().replace('"ratio": 0.25', '"ratio": 1e400', 1))  # parsed as inf
    with pytest.raises(BundleError, match=r"\.configs\[0\]\[ratio\] must be .* a finite number.*not float inf"):
        load_bundle(bad, strict=True)


def test_null_and_booleans_are_config_values_too(mix_bundle, tmp_path):
    def change(kernels):
        for config in kernels[KERNEL]["configs"]:
            config["ratio"] = None if config["ratio"] == 0.5 else True

    ok = _resigned(latest_dir(mix_bundle[1]), tmp_path / "ok", change)
    load_bundle(ok, strict=True)
    answer = predicted_config(KERNEL, SHAPE, "float32", device="nvidia-h200")
    assert answer.config["ratio"] in (None, True) and answer.evidence == "measured"


def test_an_imported_kernels_shape_is_given_by_name_as_its_dims_have_no_order(mix_bundle):
    """Its dims are listed alphabetically (cols before rows): values in order would be read against the wrong dims."""
    from zmlx_pipeline.pipeline.cli import cli
    from zmlx_pipeline.runtime import BadLookup

    load_bundle(mix_bundle[1], strict=True)
    says = (f"kernel {KERNEL!r} was imported (no registered spec), so its dims (cols, rows) have no order to read 2 "
            "values in: name each, such as cols=N,rows=N")
    with pytest.raises(BadLookup) as exc:
        predicted_config(KERNEL, (4096, 1024), "float32", device="nvidia-h200")
    assert str(exc.value) == says
    result = CliRunner().invoke(cli, ["lookup", KERNEL, "--shape", "4096,1024", "--dtype", "float32", "--device",
                                      "nvidia-h200", "--bundle", str(mix_bundle[1])])
    assert result.exit_code == 2 and f"Invalid value for --shape: {says} (" in result.output
    result = CliRunner().invoke(cli, ["lookup", KERNEL, "--shape", "rows=4096,cols=1024", "--dtype", "float32",
                                      "--device", "nvidia-h200", "--bundle", str(mix_bundle[1]), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["config"] == mix_best("nvidia-h200", {"rows": 4096, "cols": 1024})
