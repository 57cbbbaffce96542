"""The runtime API given what a caller should not pass: the runtime's own error with a one-line message, and no
file under the home (bundle cache, autotune cache) changed; no answer breaks its kernel's constraints."""

from __future__ import annotations

import hashlib
import json
import math
import shutil
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from zmlx_pipeline import runtime as rt
from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR
from zmlx_pipeline.runtime.lookup import lookup

S = {"rows": 4096, "cols": 4096}


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _positional_cfg(x, w, cfg, /):
    return cfg


def _profile():
    return rt.get_device_profile("M3", "Max")


def _autotuned(**kwargs):
    return rt.autotune(kwargs.pop("kernel", "rmsnorm"), **kwargs)(lambda x, config=None: x)


def _tune(**kwargs):
    return rt.tune(kwargs.pop("kernel", "rmsnorm"), S, "float16", **{"device": "nvidia-h200", **kwargs})


def _launch(fn=lambda config=None: 1, candidates=({"TG": 256},), **kwargs):
    return rt.launch_ranked(fn, candidates, **{"kernel": "rmsnorm", "device": "nvidia-h200", **kwargs})


def _on(device):
    return lambda: rt.predicted_config("rmsnorm", S, "float16", device=device)


CASES = [  # (what, call, the runtime's error class)
    ("kernel None", lambda: rt.predicted_config(None, S, "float16"), rt.BadArgumentType),
    ("kernel int", lambda: rt.predicted_config(123, S, "float16"), rt.BadArgumentType),
    ("kernel list", lambda: rt.predicted_config(["rmsnorm"], S, "float16"), rt.BadArgumentType),
    ("kernel misspelt", lambda: rt.predicted_config("rmsnrom", S, "float16"), rt.UnknownKernelError),
    ("kernel empty", lambda: rt.predicted_config("", S, "float16"), rt.UnknownKernelError),
    ("shape None", lambda: rt.predicted_config("rmsnorm", None, "float16"), rt.BadArgumentType),
    ("shape int", lambda: rt.predicted_config("rmsnorm", 4096, "float16"), rt.BadArgumentType),
    ("shape str", lambda: rt.predicted_config("rmsnorm", "4096,4096", "float16"), rt.BadArgumentType),
    ("dim inf", lambda: rt.predicted_config("rmsnorm", {"rows": math.inf, "cols": 4096}, "float16"), rt.BadArgument),
    ("dim nan", lambda: rt.predicted_config("rmsnorm", {"rows": math.nan, "cols": 4096}, "float16"), rt.BadArgument),
    ("dim negative", lambda: rt.predicted_config("rmsnorm", {"rows": -1, "cols": 4096}, "float16"), rt.BadArgument),
    ("dim zero", lambda: rt.predicted_config("rmsnorm", {"rows": 0, "cols": 4096}, "float16"), rt.BadArgument),
    ("dim 1e99", lambda: rt.predicted_config("rmsnorm", {"rows": 1e99, "cols": 4096}, "float16"), rt.BadArgument),
    ("dim 2**40", lambda: rt.predicted_config("rmsnorm", {"rows": 2**40, "cols": 4096}, "float16"), rt.BadArgument),
    ("dim fraction", lambda: rt.predicted_config("rmsnorm", {"rows": 4096.5, "cols": 4096}, "float16"), rt.BadArgument),
    ("dim str", lambda: rt.predicted_config("rmsnorm", {"rows": "4096", "cols": 4096}, "float16"), rt.BadArgumentType),
    ("dim None", lambda: rt.predicted_config("rmsnorm", {"rows": None, "cols": 4096}, "float16"), rt.BadArgumentType),
    ("dim bool", lambda: rt.predicted_config("rmsnorm", {"rows": True, "cols": 4096}, "float16"), rt.BadArgumentType),
    ("dim list", lambda: rt.predicted_config("rmsnorm", {"rows": [4096], "cols": 4096}, "float16"), rt.BadArgumentType),
    ("dim missing", lambda: rt.predicted_config("rmsnorm", {"cols": 4096}, "float16"), rt.BadArgument),
    ("dim extra", lambda: rt.predicted_config("rmsnorm", {**S, "depth": 2}, "float16"), rt.BadArgument),
    ("dims too few", lambda: rt.predicted_config("rmsnorm", [4096], "float16"), rt.BadArgument),
    ("dtype None", lambda: rt.predicted_config("rmsnorm", S, None), rt.BadArgumentType),
    ("dtype float64", lambda: rt.predicted_config("rmsnorm", S, "float64"), rt.UnknownDtypeError),
    ("dtype list", lambda: rt.predicted_config("rmsnorm", S, ["float16"]), rt.BadArgumentType),
    ("dtype dict", lambda: rt.predicted_config("rmsnorm", S, {"float16": 1}), rt.BadArgumentType),
    ("device int", lambda: rt.predicted_config("rmsnorm", S, "float16", device=123), rt.BadArgumentType),
    ("device list", lambda: rt.predicted_config("rmsnorm", S, "float16", device=["nvidia-h200"]), rt.BadArgumentType),
    ("device empty", lambda: rt.predicted_config("rmsnorm", S, "float16", device=""), rt.BadArgument),
    ("device blank", lambda: rt.candidates("rmsnorm", S, "float16", device="  "), rt.BadArgument),
    ("candidates k 0", lambda: rt.candidates("rmsnorm", S, "float16", k=0), rt.BadArgument),
    ("candidates k -1", lambda: rt.candidates("rmsnorm", S, "float16", k=-1), rt.BadArgument),
    ("candidates k inf", lambda: rt.candidates("rmsnorm", S, "float16", k=math.inf), rt.BadArgumentType),
    ("candidates k str", lambda: rt.candidates("rmsnorm", S, "float16", k="3"), rt.BadArgumentType),
    ("candidates kernel misspelt", lambda: rt.candidates("sofmax", S, "float16"), rt.UnknownKernelError),
    ("load_bundle None", lambda: rt.load_bundle(None), rt.BadArgumentType),
    ("load_bundle int", lambda: rt.load_bundle(123), rt.BadArgumentType),
    ("load_bundle nan", lambda: rt.load_bundle(math.nan), rt.BadArgumentType),
    ("load_bundle list", lambda: rt.load_bundle(["bundles"]), rt.BadArgumentType),
    ("load_bundle dict", lambda: rt.load_bundle({"path": "bundles"}), rt.BadArgumentType),
    ("load_bundle empty", lambda: rt.load_bundle(""), rt.BadArgument),
    ("load_bundle missing strict", lambda: rt.load_bundle("/no/such/bundle", strict=True), rt.BundleError),
    ("get_device_profile None", lambda: rt.get_device_profile(None), rt.BadArgumentType),
    ("get_device_profile int", lambda: rt.get_device_profile(3), rt.BadArgumentType),
    ("get_device_profile variant int", lambda: rt.get_device_profile("M3", 5), rt.BadArgumentType),
    ("get_device_profile list", lambda: rt.get_device_profile(["M3"]), rt.BadArgumentType),
    ("candidates_for_shape profile None", lambda: rt.get_threadgroup_candidates_for_shape(None, 4096), rt.BadArgumentType),
    ("candidates_for_shape profile dict", lambda: rt.get_threadgroup_candidates_for_shape({"family": "M3"}, 4096),
     rt.BadArgumentType),
    ("candidates_for_shape dim negative", lambda: rt.get_threadgroup_candidates_for_shape(_profile(), -1), rt.BadArgument),
    # a float is a dim_size as it is a shape dimension: inf and nan are no whole number, as 2.5 is not
    ("candidates_for_shape dim inf", lambda: rt.get_threadgroup_candidates_for_shape(_profile(), math.inf),
     rt.BadArgument),
    ("candidates_for_shape dim nan", lambda: rt.get_threadgroup_candidates_for_shape(_profile(), math.nan),
     rt.BadArgument),
    ("candidates_for_shape dim str", lambda: rt.get_threadgroup_candidates_for_shape(_profile(), "4096"),
     rt.BadArgumentType),
    ("candidates_for_shape type None", lambda: rt.get_threadgroup_candidates_for_shape(_profile(), 4096, None),
     rt.BadArgumentType),
    ("autotune warmup -1", lambda: _autotuned(warmup=-1), rt.BadArgument),
    ("autotune iters 0", lambda: _autotuned(iters=0), rt.BadArgument),
    ("autotune iters float", lambda: _autotuned(iters=2.5), rt.BadArgumentType),
    ("autotune k 0", lambda: _autotuned(k=0), rt.BadArgument),
    ("autotune kernel int", lambda: _autotuned(kernel=123), rt.BadArgumentType),
    ("autotune kernel misspelt", lambda: _autotuned(kernel="rmsnrom")(1), rt.UnknownKernelError),
    ("tune kernel misspelt", lambda: rt.tune("rmsnrom", S, "float16"), rt.UnknownKernelError),
    ("tune kernel None", lambda: rt.tune(None, S, "float16"), rt.BadArgumentType),
    ("tune shape None", lambda: rt.tune("rmsnorm", None, "float16"), rt.BadArgumentType),
    ("tune dim missing", lambda: rt.tune("rmsnorm", {"rows": 8}, "float16"), rt.BadArgument),
    ("tune dim nan", lambda: rt.tune("rmsnorm", {"rows": math.nan, "cols": 8}, "float16"), rt.BadArgument),
    ("tune dtype float64", lambda: rt.tune("rmsnorm", S, "float64"), rt.UnknownDtypeError),
    ("device core limit 0", _on("nvidia-h200@0sm"), rt.BadArgument),
    ("device core limit negative", _on("nvidia-h200@-5sm"), rt.BadArgument),
    ("device core limit above the chip's", _on("nvidia-h200@999999sm"), rt.UnknownDeviceError),
    ("device core limit not a number", _on("nvidia-h200@abc"), rt.BadArgument),
    ("device core limit empty", _on("nvidia-h200@"), rt.BadArgument),
    ("device two core limits", _on("nvidia-h200@32sm@66sm"), rt.BadArgument),
    ("device core limit then garbage", _on("nvidia-h100-sxm@32sm@abc"), rt.BadArgument),
    ("device with a NUL", _on("nvidia\x00h200"), rt.BadArgument),
    ("lookup device core limit 0", lambda: lookup("rmsnorm", S, "float16", device="nvidia-h200@0sm"), rt.BadArgument),
    ("bucket_of 0", lambda: rt.bucket_of([0]), rt.BadArgument),
    ("bucket_of negative", lambda: rt.bucket_of([-1]), rt.BadArgument),
    ("bucket_of None", lambda: rt.bucket_of(None), rt.BadArgumentType),
    ("bucket_of str value", lambda: rt.bucket_of(["a"]), rt.BadArgumentType),
    ("bucket_of inf", lambda: rt.bucket_of([math.inf]), rt.BadArgument),
    ("bucket_of nan", lambda: rt.bucket_of([math.nan]), rt.BadArgument),
    ("tune k str", lambda: _tune(k="3"), rt.BadArgumentType),
    ("tune k 0", lambda: _tune(k=0), rt.BadArgument),
    ("tune k negative", lambda: _tune(k=-5), rt.BadArgument),
    ("tune iters 0", lambda: _tune(iters=0), rt.BadArgument),
    ("tune iters str", lambda: _tune(iters="x"), rt.BadArgumentType),
    ("tune warmup negative", lambda: _tune(warmup=-1), rt.BadArgument),
    # past the digits Python writes out: the message says how long, never ValueError from str()
    ("tune warmup of 5000 digits", lambda: _tune(warmup=-10**5000), rt.BadArgument),
    ("autotune iters of 5000 digits", lambda: _autotuned(iters=-10**5000), rt.BadArgument),
    ("tune threadgroup of 5000 digits", lambda: _tune(threadgroups=[-10**5000]), rt.BadArgument),
    # a count no GPU would finish: past the bound (10,000 each), however long it is
    ("tune iters past the bound", lambda: _tune(iters=10_001), rt.BadArgument),
    ("tune iters of 5000 digits past the bound", lambda: _tune(iters=10**5000), rt.BadArgument),
    ("tune warmup past the bound", lambda: _tune(warmup=10_001), rt.BadArgument),
    ("autotune iters of 5000 digits past the bound", lambda: _autotuned(iters=10**5000), rt.BadArgument),
    ("autotune warmup past the bound", lambda: _autotuned(warmup=10_001), rt.BadArgument),
    ("lookup dim name with a newline", lambda: rt.predicted_config("rmsnorm", {"rows\n": 8, "cols": 8}), rt.BadLookup),
    ("tune dim name with an escape", lambda: rt.tune("rmsnorm", {"rows\x1b[2J": 8, "cols": 8}, "float16"),
     rt.BadLookup),
    ("tune timer unknown", lambda: _tune(timer="wall"), rt.BadArgument),
    ("tune threadgroups str item", lambda: _tune(threadgroups=["abc"]), rt.BadArgumentType),
    ("tune threadgroups int", lambda: _tune(threadgroups=5), rt.BadArgumentType),
    ("tune threadgroups None item", lambda: _tune(threadgroups=[None]), rt.BadArgumentType),
    ("tune configs ints", lambda: _tune(configs=[1, 2]), rt.BadArgumentType),
    ("tune configs int", lambda: _tune(configs=5), rt.BadArgumentType),
    ("tune configs list value", lambda: _tune(configs=[{"TG": [1], "VEC": 4, "ROWS": 1}]), rt.BadArgumentType),
    ("tune device int", lambda: _tune(device=123), rt.BadArgumentType),
    ("tune device list", lambda: _tune(device=["x"]), rt.BadArgumentType),
    ("tune cache_path int", lambda: _tune(cache_path=123), rt.BadArgumentType),
    ("tune kernel colon", lambda: _tune(kernel=":"), rt.UnknownKernelError),
    ("tune kernel sys:exit", lambda: _tune(kernel="sys:exit"), rt.UnknownKernelError),
    ("tune kernel os:abort", lambda: _tune(kernel="os:abort"), rt.UnknownKernelError),
    ("tune kernel a class", lambda: _tune(kernel="zmlx_pipeline.kernels.spec:KernelSpec"), rt.UnknownKernelError),
    ("tune kernel module that fails", lambda: _tune(kernel="no_such_module_here:SPEC"), rt.UnknownKernelError),
    ("launch_ranked candidates None", lambda: _launch(candidates=None), rt.BadArgumentType),
    ("launch_ranked candidates ints", lambda: _launch(candidates=[1]), rt.BadArgumentType),
    ("launch_ranked fn int", lambda: _launch(fn=5), rt.BadArgumentType),
    ("launch_ranked refusals int", lambda: _launch(refusals=5), rt.BadArgumentType),
    ("launch_ranked device int", lambda: _launch(device=5), rt.BadArgumentType),
    ("autotune refusals int", lambda: rt.autotune("rmsnorm", refusals=5), rt.BadArgumentType),
    ("autotune device int", lambda: rt.autotune("rmsnorm", device=5), rt.BadArgumentType),
    ("autotune config_arg int", lambda: rt.autotune("rmsnorm", config_arg=5), rt.BadArgumentType),
    ("autotune config_arg empty", lambda: rt.autotune("rmsnorm", config_arg=""), rt.BadArgumentType),
    ("load_bundle strict text", lambda: rt.load_bundle(str(DEFAULT_BUNDLE_DIR), strict="yes"), rt.BadArgumentType),
    ("load_bundle strict int", lambda: rt.load_bundle(str(DEFAULT_BUNDLE_DIR), strict=0), rt.BadArgumentType),
    ("autotune config_arg not a name", lambda: rt.autotune("rmsnorm", config_arg="my config"), rt.BadArgumentType),
    ("autotune config_arg a keyword", lambda: rt.autotune("rmsnorm", config_arg="lambda"), rt.BadArgumentType),
    ("autotune config_arg the function lacks",
     lambda: rt.autotune("rmsnorm", config_arg="cfg")(lambda x, w, config=None: config), rt.AutotuneError),
    ("autotune config_arg only positional",
     lambda: rt.autotune("rmsnorm", config_arg="cfg")(_positional_cfg), rt.AutotuneError),
    ("autotune shape int", lambda: rt.autotune("rmsnorm", shape=5), rt.BadArgumentType),
    ("autotune threadgroups str", lambda: rt.autotune("rmsnorm", threadgroups="ab"), rt.BadArgumentType),
    ("autotune decorating an int", lambda: rt.autotune("rmsnorm")(5), rt.BadArgumentType),
    ("autotune shape function returns int", lambda: _autotuned(shape=lambda *a, **k: 5)(1), rt.BadArgumentType),
    ("shape a set", lambda: rt.predicted_config("rmsnorm", {4096, 4095}, "float16", "nvidia-h200"), rt.BadArgumentType),
    ("shape a frozenset", lambda: rt.candidates("rmsnorm", frozenset({8, 4096}), "float16"), rt.BadArgumentType),
    ("shape a 0-d array", lambda: rt.predicted_config("rmsnorm", _array(4096), "float16"), rt.BadArgumentType),
    ("bucket_of a set", lambda: rt.bucket_of({4096, 8}), rt.BadArgumentType),
    ("tune use_cache str", lambda: _tune(use_cache="no"), rt.BadArgumentType),
    ("tune use_cache None", lambda: _tune(use_cache=None), rt.BadArgumentType),
    ("tune device_aware None", lambda: _tune(device_aware=None), rt.BadArgumentType),
    ("tune device_aware int", lambda: _tune(device_aware=1), rt.BadArgumentType),
    ("autotune device_aware None", lambda: rt.autotune("rmsnorm", device_aware=None), rt.BadArgumentType),
    ("tune kernel only looks like a spec", lambda: _tune(kernel=_LooksLikeASpec()), rt.BadArgumentType),
    ("autotune kernel only looks like a spec", lambda: _autotuned(kernel=_LooksLikeASpec())(1), rt.BadArgumentType),
    ("dim an array of one value", lambda: rt.predicted_config("rmsnorm", {"rows": _array([4096]), "cols": 4096},
                                                              "float16"), rt.BadArgumentType),
    ("dim an array of two values", lambda: rt.predicted_config("rmsnorm", {"rows": _array([4096, 2]), "cols": 4096},
                                                               "float16"), rt.BadArgumentType),
    ("autotune an argument whose shape is None", lambda: _autotuned(device="nvidia-h200")(_Shaped(None)),
     rt.AutotuneError),
    ("autotune an argument whose shape holds None", lambda: _autotuned(device="nvidia-h200")(_Shaped((None, 8))),
     rt.BadArgumentType),
    ("autotune an argument whose shape is text", lambda: _autotuned(device="nvidia-h200")(_Shaped("ab")),
     rt.BadArgumentType),
    ("bare autotune an argument whose shape holds text", lambda: rt.autotune(lambda x, threadgroup=None: x)(
        _Shaped((8, "x"))), rt.BadArgumentType),
]


class _Shaped:
    """An array-like of a given `.shape` (and no dtype)."""

    dtype = None

    def __init__(self, shape):
        self.shape = shape


def _array(values):
    import numpy as np

    return np.array(values)


class _LooksLikeASpec:
    """A name and legal configs, but none of what the tuner reads besides."""

    name = "rmsnorm"

    def legal_configs(self, shape, dtype, limits):
        return [{"TG": 256, "VEC": 4, "ROWS": 1}]


@pytest.mark.parametrize("call, error", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_argument_raises_the_runtimes_error_in_one_line(tmp_path, call, error):
    before = digest(tmp_path)
    with pytest.raises(error) as info:
        call()
    assert isinstance(info.value, rt.RuntimeAPIError)
    message = str(info.value)
    assert message and "\n" not in message and len(message) < 400
    assert digest(tmp_path) == before


def test_a_core_limit_the_bundle_holds_still_answers():
    p = rt.predicted_config("rmsnorm", S, "float16", device="nvidia-h200@32sm")
    assert p.device == "nvidia-h200@32sm" and p.config and p.evidence in ("measured", "predicted")
    assert lookup("rmsnorm", S, "float16", device="nvidia-h100-sxm@32sm")["device"] == "nvidia-h100-sxm@32sm"


@pytest.mark.parametrize("value", [True, Decimal(1), Fraction(1)])
def test_a_remembered_answer_is_never_given_for_a_value_that_is_not_a_dimension(value):
    good = rt.predicted_config("rmsnorm", {"rows": 1, "cols": 4096}, "float16", device="nvidia-h200")
    for _ in range(2):
        with pytest.raises(rt.BadArgumentType):
            rt.predicted_config("rmsnorm", {"rows": value, "cols": 4096}, "float16", device="nvidia-h200")
        with pytest.raises(rt.BadArgumentType):
            rt.predicted_config("rmsnorm", [value, 4096], "float16", device="nvidia-h200")
    assert rt.predicted_config("rmsnorm", {"rows": 1, "cols": 4096}, "float16", device="nvidia-h200") is good
    assert rt.predicted_config("rmsnorm", {"rows": 1.0, "cols": 4096}, "float16", device="nvidia-h200") is good


def test_the_device_the_environment_names_is_checked_as_a_given_one(monkeypatch):
    from zmlx_pipeline.runtime.device import forget_current_device

    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", "garbage-gpu")
    forget_current_device()
    with pytest.raises(rt.UnknownName, match="ZMLX_PIPELINE_DEVICE"):
        lookup("rmsnorm", S, "float16")
    with pytest.raises(rt.UnknownName):
        lookup("rmsnorm", S, "float16", device="garbage-gpu")
    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", "nvidia-h200@0sm")
    forget_current_device()
    with pytest.raises(rt.BadArgument, match="ZMLX_PIPELINE_DEVICE"):
        rt.predicted_config("rmsnorm", S, "float16")
    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", "nvidia-h200")
    forget_current_device()
    assert lookup("rmsnorm", S, "float16")["evidence"] == "measured"


def test_a_kernel_path_to_a_spec_is_tuned_and_nothing_else_found_there_is_called():
    def measure(spec, config, shape, dtype):
        return "ok", float(config["TG"])

    result = rt.tune("zmlx_pipeline.kernels.builtin.rmsnorm:SPEC", S, "float16", device="nvidia-h200",
                     measure=measure, use_cache=False, k=2)
    assert result.kernel == "rmsnorm" and result.source == "timed" and len(result.timed) == 2


@pytest.mark.parametrize("body", ["raise SystemExit(0)", "import sys; sys.exit(3)", "raise RuntimeError('boom')"])
def test_a_kernel_module_that_exits_or_fails_on_import_is_refused_with_the_runtimes_error(tmp_path, monkeypatch, body):
    (tmp_path / "exits_on_import.py").write_text(body + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(rt.UnknownKernelError, match="cannot import 'exits_on_import'"):
        _tune(kernel="exits_on_import:SPEC")


def _bad_bundle(tmp_path: Path, how: str) -> Path:
    b = tmp_path / how
    shutil.copytree(DEFAULT_BUNDLE_DIR, b)
    if how == "tampered":
        p = b / "profiles.json" if (b / "profiles.json").exists() else b / "profiles.json.gz"  # a compact bundle
        data = bytearray(p.read_bytes())
        data[len(data) // 2] ^= 0xFF  # one byte changed, the size kept
        p.write_bytes(bytes(data))
    elif how == "no-manifest":
        (b / "manifest.json").unlink()
    elif how == "latest-not-utf8":  # a publish root whose pointer holds bytes that are no text
        b = tmp_path / "root"
        b.mkdir()
        (b / "latest").write_bytes(b"\xff\xfe")
    elif how == "unknown-schema":
        m = json.loads((b / "manifest.json").read_text())
        m["schema_version"] = 99
        (b / "manifest.json").write_text(json.dumps(m))
    return b


@pytest.mark.parametrize("how", ["tampered", "no-manifest", "unknown-schema", "latest-not-utf8"])
def test_a_bad_bundle_is_refused_strictly_and_leaves_the_one_in_use(tmp_path, how):
    bundle = _bad_bundle(tmp_path, how)
    in_use = rt.load_bundle(DEFAULT_BUNDLE_DIR, strict=True)
    before = digest(tmp_path)
    with pytest.raises(rt.BundleError) as info:
        rt.load_bundle(bundle, strict=True)
    assert "\n" not in str(info.value)
    with pytest.warns(rt.BundleWarning) as caught:
        kept = rt.load_bundle(bundle)
    assert len(caught) == 1 and kept.bundle_id == in_use.bundle_id
    assert rt.predicted_config("rmsnorm", S, "float16", device="nvidia-h200").evidence in ("measured", "predicted")
    assert digest(tmp_path) == before


@pytest.mark.parametrize("url", ["http://a b/x", "http://x\ny/", "http://127.0.0.1:abc/x"])
def test_a_malformed_bundle_url_is_the_runtimes_error(url):
    with pytest.raises(rt.BundleError, match="cannot fetch"):
        rt.load_bundle(url, strict=True)


def test_garbage_in_the_bundle_variable_warns_once_and_the_shipped_bundle_answers(tmp_path, monkeypatch):
    (tmp_path / "garbage.txt").write_text("not a bundle\n")
    monkeypatch.setenv("ZMLX_PIPELINE_BUNDLE", str(tmp_path / "garbage.txt"))
    before = digest(tmp_path)
    with pytest.warns(rt.BundleWarning, match="ZMLX_PIPELINE_BUNDLE") as caught:
        p = rt.predicted_config("rmsnorm", S, "float16", device="nvidia-h200")
        rt.predicted_config("rmsnorm", {"rows": 8, "cols": 4096}, "float16", device="nvidia-h200")
    assert len(caught) == 1
    assert p.config and p.evidence in ("measured", "predicted")
    assert digest(tmp_path) == before


def test_a_refused_bundle_variable_warns_at_the_callers_line_and_the_answer_says_the_default_answered(tmp_path,
                                                                                                   monkeypatch):
    (tmp_path / "garbage.txt").write_text("not a bundle\n")
    monkeypatch.setenv("ZMLX_PIPELINE_BUNDLE", str(tmp_path / "garbage.txt"))
    for call in (lambda: rt.predicted_config("rmsnorm", S, "float16", device="nvidia-h200"),
                 lambda: rt.get_device_profile("M3", "Max"), lambda: rt.candidates("rmsnorm", S, "float16", k=2)):
        rt.bundle.reset()
        with pytest.warns(rt.BundleWarning, match="ZMLX_PIPELINE_BUNDLE") as caught:
            call()
        assert [(w.filename, w.lineno) for w in caught] == [(__file__, call.__code__.co_firstlineno)]
    p = rt.predicted_config("rmsnorm", S, "float16", device="nvidia-h200")
    assert p.evidence == "measured" and p.bundle_id == rt.bundle.default_bundle().bundle_id
    assert p.note.startswith("answered from the default bundle: $ZMLX_PIPELINE_BUNDLE was refused (")
    assert "garbage.txt" in p.note and "\n" not in p.note
    unknown = rt.predicted_config("rmsnorm", S, "float16", device="nvidia-h100-pcie@20sm")
    assert unknown.note.startswith("answered from the default bundle: $ZMLX_PIPELINE_BUNDLE was refused (")
    rt.load_bundle(DEFAULT_BUNDLE_DIR)  # the default bundle asked for by name: its answers say nothing of the variable
    assert rt.predicted_config("rmsnorm", S, "float16", device="nvidia-h200").note == ""


ODD = [{"rows": 1, "cols": 8}, {"rows": 3, "cols": 4100}, {"rows": 7, "cols": 96}, {"rows": 4096, "cols": 33},
       {"rows": 100000, "cols": 12288}, {"rows": 2, "cols": 2**20}]


@pytest.mark.parametrize("device", ["nvidia-h200", "nvidia-h100-pcie", "apple-m3-max-40c", "amd-mi300x"])
@pytest.mark.parametrize("kernel", ["rmsnorm", "softmax", "layernorm"])
def test_no_answer_breaks_the_kernels_constraints(kernel, device):
    from zmlx_pipeline.data.catalog import UnknownDevice, get_device
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.spec import Limits

    spec = get_kernel(kernel)
    try:
        limits = Limits.from_device_row(get_device(device).as_row())
    except UnknownDevice:
        limits = Limits.from_device_row(None)
    for shape in ODD:
        for dtype in ("float16", "float32"):
            p = rt.predicted_config(kernel, shape, dtype, device=device)
            legal = spec.legal_configs(shape, dtype, limits)
            if p.config is None:
                assert not legal and p.evidence == "none", (shape, dtype)
                continue
            for config in [p.config, *p.candidates]:
                assert spec.violations(config, shape, dtype, limits) == [], (shape, dtype, config)


#: a user no system has, so that `~user` names no home
NO_SUCH_USER = "zmlx-pipeline-no-such-user"


def test_a_path_in_the_home_of_an_unknown_user_is_a_bad_argument_and_nothing_is_written(tmp_path, monkeypatch):
    from zmlx_pipeline.runtime import cache
    from zmlx_pipeline.runtime.bundle import read_bundle

    monkeypatch.chdir(tmp_path)
    where = f"~{NO_SUCH_USER}/b"
    for call in (lambda: rt.load_bundle(where), lambda: rt.load_bundle(where, strict=True),
                 lambda: read_bundle(where), lambda: lookup("rmsnorm", S, "float16", "nvidia-h200", bundle=where),
                 lambda: _tune(cache_path=f"~{NO_SUCH_USER}/c.json", measure=lambda *a: ("ok", 1.0)),
                 lambda: rt.autotune("rmsnorm", cache_path=f"~{NO_SUCH_USER}/c.json"),
                 lambda: cache.read_cache(f"~{NO_SUCH_USER}/c.json")):
        with pytest.raises(rt.BadArgument, match=f"no home directory is known \\(no user '{NO_SUCH_USER}'") as info:
            call()
        assert "\n" not in str(info.value)
    assert not (tmp_path / f"~{NO_SUCH_USER}").exists()  # never taken as a folder named ~user
    rt.bundle.reset()
    monkeypatch.setenv("ZMLX_PIPELINE_BUNDLE", where)
    with pytest.warns(rt.BundleWarning, match=r"no home directory is known.*using the default bundle") as caught:
        p = rt.predicted_config("rmsnorm", S, "float16", device="nvidia-h200")
    assert len(caught) == 1 and p.evidence == "measured"


def test_a_path_in_the_home_is_expanded_alike_for_bundles_and_for_the_autotune_cache(isolated_home):
    shutil.copytree(DEFAULT_BUNDLE_DIR, isolated_home / "b")
    assert rt.load_bundle("~/b", strict=True).root == isolated_home / "b"
    measure = lambda spec, config, shape, dtype: ("ok", float(config["TG"]))  # noqa: E731
    first = _tune(cache_path="~/tuned/autotune_v3.json", measure=measure, k=2)
    assert first.source == "timed" and (isolated_home / "tuned" / "autotune_v3.json").is_file()
    assert _tune(cache_path="~/tuned/autotune_v3.json", measure=measure, k=2).source == "cache"


def test_an_unknown_kernel_type_is_refused_where_zmlx_answers_general_undocumented(zmlx):
    """ZMLX documents only general, reduction and simd, and answers any other name as general; a typo would get
    pooled candidates silently, so ours refuses it (test_unknown_chip_names_and_kernel_types.py)."""
    from zmlx_pipeline.runtime import UnknownKernelType

    ours, theirs = _profile(), zmlx.device_profile.get_device_profile("M3", "Max")
    for kind in ("nope", ""):
        with pytest.raises(UnknownKernelType, match="known types are"):
            rt.get_threadgroup_candidates_for_shape(ours, 4096, kind)
        assert zmlx.device_profile.get_threadgroup_candidates_for_shape(theirs, 4096, kind) == \
            zmlx.device_profile.get_threadgroup_candidates_for_shape(theirs, 4096, "general")


def test_a_kernel_path_tune_cannot_use_says_why_in_one_line(monkeypatch):
    """What the import raised, and what the path names (a factory is named as such: the runtime calls nothing)."""
    import sys
    import types

    module = types.ModuleType("zp_fake_kernels")
    module.SPEC, module.X = (lambda: 1), 1
    monkeypatch.setitem(sys.modules, "zp_fake_kernels", module)
    for kernel, says in [("zp_fake_kernels:SPEC", "names a function, not a KernelSpec"),
                         ("zp_fake_kernels:X", "names int, not a KernelSpec"),
                         ("zp_no_such_module_zz:SPEC", "(ModuleNotFoundError: No module named 'zp_no_such_module_zz')")]:
        with pytest.raises(rt.UnknownKernelError) as info:
            _tune(kernel=kernel)
        assert says in str(info.value) and "\n" not in str(info.value), str(info.value)


@pytest.mark.parametrize("fn", [lambda x, w, cfg=None: cfg, lambda x, w, *, cfg=None: cfg, lambda x, w, **kw: kw])
def test_a_config_arg_the_function_takes_by_keyword_is_accepted(fn):
    tuned = rt.autotune("rmsnorm", config_arg="cfg")(fn)
    assert tuned.config_arg == "cfg"


def test_numpy_integers_are_counts_where_python_ints_are():
    np = pytest.importorskip("numpy")
    calls = []

    def measure(spec, config, shape, dtype):
        calls.append(config)
        return "ok", float(config["TG"])

    result = rt.tune("rmsnorm", S, "float16", device="nvidia-h200", measure=measure, use_cache=False,
                     k=np.int64(2), warmup=np.int32(0), iters=np.uint8(1))
    assert result.source == "timed" and len(result.timed) == len(calls) == 2
    assert rt.candidates("rmsnorm", S, "float16", k=np.int16(3), device="nvidia-h200") == \
        rt.candidates("rmsnorm", S, "float16", k=3, device="nvidia-h200")
    assert len(lookup("rmsnorm", S, "float16", device="nvidia-h200", k=np.int64(1))["candidates"]) == 1
    for bad in (np.float64(2.0), np.bool_(True), np.array([2, 3])):
        with pytest.raises(rt.BadArgumentType, match="whole number"):
            rt.candidates("rmsnorm", S, "float16", k=bad, device="nvidia-h200")
        with pytest.raises(rt.BadArgumentType, match="whole number"):
            _tune(iters=bad, measure=measure, use_cache=False)
    with pytest.raises(rt.BadArgument, match="iters must be >= 1"):
        _tune(iters=np.int64(0), measure=measure, use_cache=False)


def test_a_config_given_twice_is_timed_once():
    calls = []

    def measure(spec, config, shape, dtype):
        calls.append(dict(config))
        return "ok", float(config["TG"])

    one, other = rt.candidates("rmsnorm", S, "float16", k=2, device="nvidia-h200")
    result = _tune(configs=[one, dict(one), other, one], measure=measure, use_cache=False)
    assert calls == [one, other] and [t["config"] for t in result.timed] == [one, other]


def test_a_url_for_a_cache_or_a_bundle_is_refused_as_typed_and_nothing_is_made(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(rt.BadArgument, match=r"^cache_path 's3://b/c\.json' is a URL \(s3:\), not a local path"):
        _tune(cache_path="s3://b/c.json", measure=lambda spec, config, shape, dtype: ("ok", 1.0))
    with pytest.raises(rt.BundleError, match=r"^bundle location 's3://b/bundle' is a URL \(s3:\), not a local path.*"
                                             r"\(a bundle is read from a local directory or an http\(s\) URL\)$"):
        rt.load_bundle("s3://b/bundle", strict=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_tune_with_no_legal_config_names_the_rule_as_the_lookup_does():
    shape = {"rows": 8, "cols": 8}
    with pytest.raises(rt.AutotuneError) as exc:
        rt.tune("rmsnorm", shape, "float16", device="nvidia-h200", use_cache=False,
                measure=lambda spec, config, shape, dtype: ("ok", 1.0))
    rule = "(every config breaks: (TG // ROWS) * VEC <= cols)"
    assert str(exc.value) == f"rmsnorm: no legal config for {shape} float16 on nvidia-h200 {rule}"
    assert rt.predicted_config("rmsnorm", shape, "float16", device="nvidia-h200").note.endswith(rule)
    with pytest.raises(rt.AutotuneError, match=r"no legal config for .* \(of threadgroup 48\)$"):
        _tune(threadgroups=[48], measure=lambda spec, config, shape, dtype: ("ok", 1.0), use_cache=False)


def test_a_dim_name_or_count_a_caller_gives_is_written_plainly():
    with pytest.raises(rt.BadLookup) as info:
        rt.predicted_config("rmsnorm", {"rows\n": 8, "cols": 8}, "float16", device="nvidia-h200")
    assert str(info.value) == "kernel 'rmsnorm' has dims rows, cols; got rows\\n, cols"
    with pytest.raises(rt.BadLookup) as info:
        rt.predicted_config("rmsnorm", {"rows\n": -1, "cols": 8}, "float16", device="nvidia-h200")
    assert str(info.value) == "shape dimension rows\\n=-1 must be a positive integer"
    with pytest.raises(rt.BadArgument) as info:
        _tune(iters=-10**5000)
    assert str(info.value) == "iters must be >= 1 (got a negative integer of about 5000 digits)"


def test_a_count_past_its_bound_is_refused_saying_the_bound_and_the_bound_itself_is_taken():
    calls = []

    def measure(spec, config, shape, dtype):
        calls.append(config)
        return "ok", float(config["TG"])

    for name in ("warmup", "iters"):
        with pytest.raises(rt.BadArgument) as info:
            _tune(**{name: 10**5000}, measure=measure, use_cache=False)
        assert str(info.value) == (f"{name} must be at most 10000 (got an integer of about 5000 digits): "
                                   "more would keep the GPU busy for no better pick")
        with pytest.raises(rt.BadArgument, match=rf"^{name} must be at most 10000 \(got 10001\)"):
            rt.autotune("rmsnorm", **{name: 10_001})
    assert calls == []
    result = _tune(warmup=10_000, iters=10_000, k=2, measure=measure, use_cache=False)
    assert result.source == "timed" and len(calls) == 2
    assert rt.autotune("rmsnorm", warmup=10_000, iters=10_000)(lambda x, config=None: x) is not None


@pytest.mark.parametrize("name", ["warmup", "iters"])
def test_a_count_too_long_to_show_whole_is_named_by_its_size_never_cut_to_another_number(name, tmp_path):
    path = tmp_path / "autotune_v3.json"
    with pytest.raises(rt.BadArgument) as info:
        rt.tune("rmsnorm", {"rows": 64, "cols": 4096}, "float16", device="nvidia-h200", cache_path=str(path),
             measure=lambda spec, config, shape, dtype: ("ok", 1.0), **{name: 10 ** 400})
    assert str(info.value) == (f"{name} must be at most 10000 (got an integer of about 400 digits): more would keep "
                               "the GPU busy for no better pick")
    assert not path.exists()
