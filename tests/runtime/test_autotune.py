"""The autotuner times only the pruned candidates, keeps the winner in the v3 cache, and never times twice.

Timing needs a GPU; here the measurer is a test double (a formula), passed the way the harness's is.
"""

import json
import math
from fractions import Fraction

import pytest

from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.spec import Limits
from zmlx_pipeline.runtime import autotune, load_bundle, predicted_config, tune

SHAPE = {"rows": 3000, "cols": 2048}  # not a measured shape
H200 = "nvidia-h200"


class FakeMeasure:
    """Times from a formula (best: TG 256, VEC 4, ROWS 1); one config 'fails its reference check'."""

    def __init__(self, wrong=None):
        self.calls = []
        self.wrong = wrong

    def __call__(self, spec, config, shape, dtype):
        self.calls.append(dict(config))
        if self.wrong is not None and dict(config) == self.wrong:
            return "wrong_result", None
        t = 10 * (1 + abs(math.log2(config["TG"]) - 8) + 0.3 * abs(math.log2(config["VEC"]) - 2) + 0.1 * config["ROWS"])
        return "ok", t


def _legal(shape=SHAPE, dtype="float16"):
    return get_kernel("rmsnorm").legal_configs(shape, dtype, Limits(max_threads=1024, simd_width=32, tg_mem_bytes=49152))


@pytest.fixture
def real(real_bundle):
    return load_bundle(real_bundle[1], strict=True)


def test_a_miss_times_only_the_pruned_candidates_and_caches_the_winner(real, tmp_path):
    measure = FakeMeasure()
    path = tmp_path / "autotune_v3.json"
    result = tune("rmsnorm", SHAPE, "float16", device=H200, measure=measure, cache_path=str(path))
    legal = _legal()
    pred = predicted_config("rmsnorm", SHAPE, "float16", device=H200)
    assert result.source == "timed" and result.legal == len(legal)
    assert 1 <= len(measure.calls) <= max(1, len(legal) // 5)
    assert len(measure.calls) <= pred.prune_k
    assert measure.calls == [c for c in pred.candidates if c in legal][: len(measure.calls)]  # in the model's order
    assert result.config == min(measure.calls, key=lambda c: FakeMeasure()(None, c, SHAPE, "float16")[1])
    data = json.loads(path.read_text())
    (dkey,) = data["devices"]
    assert dkey.startswith(f"{H200}_") and data["schema_version"] == "3.0"
    assert data["devices"][dkey]["metadata"]["device_id"] == H200
    (key,) = data["devices"][dkey]["entries"]
    parsed = json.loads(key)
    assert list(parsed) == ["name", "shapes", "dtypes", "grid", "t_params"]  # ZMLX's key, in its order
    assert parsed["name"] == "rmsnorm" and ["kernel_version", get_kernel("rmsnorm").version] in parsed["t_params"]
    assert parsed["shapes"] == [[SHAPE["rows"], SHAPE["cols"]]] and parsed["dtypes"] == ["float16"]
    entry = data["devices"][dkey]["entries"][key]
    assert entry["config"] == result.config and entry["tg"][0] == result.config["TG"]
    assert entry["candidates_timed"] == len(measure.calls)
    # a second tuner (another process, say) reads the winner instead of timing again
    again = FakeMeasure()
    hit = tune("rmsnorm", SHAPE, "float16", device=H200, measure=again, cache_path=str(path))
    assert (hit.source, hit.config, again.calls) == ("cache", result.config, [])


def test_device_aware_false_times_every_legal_config(real, tmp_path):
    measure = FakeMeasure()
    result = tune("rmsnorm", SHAPE, "float16", device=H200, device_aware=False, measure=measure,
                  cache_path=str(tmp_path / "c.json"))
    assert len(measure.calls) == len(_legal()) == result.legal
    assert result.config == {"ROWS": 1, "TG": 256, "VEC": 4}


def test_a_candidate_that_fails_its_check_never_wins(real, tmp_path):
    first = predicted_config("rmsnorm", SHAPE, "float16", device=H200).candidates[0]
    measure = FakeMeasure(wrong=first)
    result = tune("rmsnorm", SHAPE, "float16", device=H200, k=2, measure=measure, cache_path=str(tmp_path / "c.json"))
    assert first in measure.calls and result.config != first
    assert {t["status"] for t in result.timed} == {"ok", "wrong_result"}


def test_a_device_the_bundle_lacks_times_the_lookups_default_ranking(real, tmp_path):
    other = "nvidia-a100-sxm4-80gb"  # in the catalog, not in the real bundle (H200 and H100 only)
    pred = predicted_config("rmsnorm", SHAPE, "float16", device=other)
    assert pred.evidence == "default"
    measure = FakeMeasure()
    result = tune("rmsnorm", SHAPE, "float16", device=other, k=3, measure=measure, cache_path=str(tmp_path / "c.json"))
    assert len(measure.calls) == 3 and "no model ranking" in result.note
    assert measure.calls[0] == pred.config  # the tuner starts where predicted_config points
    assert measure.calls == pred.candidates[:3]  # and follows the lookup's default ranking


def test_the_decorator_fills_the_config_keyword(real, tmp_path):
    measure = FakeMeasure()
    seen = []

    @autotune("rmsnorm", warmup=1, iters=2, device=H200, measure=measure, cache_path=str(tmp_path / "c.json"),
              shape=lambda x, config=None: {"rows": x[0], "cols": x[1]}, dtype=lambda x, config=None: "float16")
    def rmsnorm(x, config=None):
        seen.append(config)
        return config

    got = rmsnorm((3000, 2048))
    assert got == rmsnorm.last.config and rmsnorm.last.source == "timed"
    n = len(measure.calls)
    assert rmsnorm((3000, 2048)) == got and len(measure.calls) == n  # remembered in-process
    assert rmsnorm((3000, 2048), config={"TG": 32, "VEC": 1, "ROWS": 1}) == {"TG": 32, "VEC": 1, "ROWS": 1}
    assert rmsnorm.__name__ == "rmsnorm"


def test_without_a_gpu_nothing_is_timed_and_the_bundle_answers(real, tmp_path, gpu_backend):
    if gpu_backend != "cpu":
        pytest.skip("this machine has a GPU backend: it would time")
    path = tmp_path / "c.json"
    with pytest.warns(UserWarning, match="nothing timed") as caught:
        result = tune("rmsnorm", SHAPE, "float16", device=H200, cache_path=str(path))
    assert result.source == "predicted"
    assert result.config == predicted_config("rmsnorm", SHAPE, "float16", device=H200).config
    assert not path.exists()
    assert [w.filename for w in caught] == [__file__]  # the caller's line, not one inside the runtime

    @autotune("rmsnorm", cache_path=str(path), device=H200)
    def op(x, config=None):
        return config

    class Arr:
        shape = (3000, 2048)
        dtype = "float16"

    with pytest.warns(UserWarning, match="nothing timed") as caught:
        op(Arr())
    assert [w.filename for w in caught] == [__file__]  # through the wrapper too


def test_bare_autotune_passes_the_learned_threadgroup(monkeypatch):
    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", H200)
    from zmlx_pipeline.runtime import get_current_device_profile, get_threadgroup_candidates_for_shape

    class Arr:
        shape = (16, 4096)
        dtype = "float16"

    @autotune(warmup=3, iters=10, device_aware=True)
    def op(x, threadgroup=(128, 1, 1)):
        return threadgroup

    tg = op(Arr())
    expected = get_threadgroup_candidates_for_shape(get_current_device_profile(), 4096, "general")[0]
    assert tg == (expected, 1, 1)


def test_tune_times_with_inputs_rotated_over_twice_the_l2_as_collect_does(real, tmp_path, monkeypatch):
    """The bundle ranked configs by collect's timings (inputs rotated past the L2); a tuner timing
    inputs left in L2 would optimise something else on mid-size shapes."""
    import importlib

    from zmlx_pipeline.runtime.device import catalog_row

    module = importlib.import_module("zmlx_pipeline.runtime.tuner")
    asked = []

    def fake_harness_measure(warmup, iters, rotate_bytes=0, timer="chain"):
        asked.append((warmup, iters, rotate_bytes, timer))
        return FakeMeasure()

    monkeypatch.setattr(module, "harness_measure", fake_harness_measure)
    tune("rmsnorm", SHAPE, "float16", device=H200, cache_path=str(tmp_path / "c.json"), warmup=2, iters=7)
    # the timer is passed through: "auto" times by CUPTI kernel durations where torch can read them
    tune("rmsnorm", SHAPE, "float16", device=H200, cache_path=str(tmp_path / "c.json"), warmup=2, iters=7,
         use_cache=False, timer="auto")
    l2 = int(catalog_row(H200)["l2_bytes"])
    assert l2 > 0 and asked == [(2, 7, 2 * l2, "chain"), (2, 7, 2 * l2, "auto")]


def test_every_candidate_is_compiled_before_the_first_is_timed(real, tmp_path):
    events = []

    class Ordered(FakeMeasure):
        def precompile(self, spec, configs, shape, dtype):
            events.append(("compile", [dict(c) for c in configs]))

        def __call__(self, spec, config, shape, dtype):
            events.append(("time", dict(config)))
            return super().__call__(spec, config, shape, dtype)

    measure = Ordered()
    result = tune("rmsnorm", SHAPE, "float16", device=H200, measure=measure, cache_path=str(tmp_path / "c.json"))
    assert events[0][0] == "compile" and [e[0] for e in events[1:]] == ["time"] * len(measure.calls)
    assert events[0][1] == measure.calls and len(measure.calls) > 1
    assert result.source == "timed"


def test_an_explicit_precompile_runs_first_and_its_failure_times_anyway(real, tmp_path):
    events = []

    def precompile(spec, configs, shape, dtype):
        events.append(len(configs))
        raise RuntimeError("nvrtc missing")

    measure = FakeMeasure()
    result = tune("rmsnorm", SHAPE, "float16", device=H200, k=3, measure=measure, precompile=precompile,
                  cache_path=str(tmp_path / "c.json"))
    assert events == [len(measure.calls)] and result.source == "timed"


def _bad_cache_path(tmp_path, how):
    import os

    (tmp_path / "adir").mkdir()
    (tmp_path / "afile").write_text("")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    return {"a directory": str(tmp_path / "adir"), "a file as its parent": str(tmp_path / "afile" / "c.json"),
            "a symlink loop": str(tmp_path / "loop"), "empty": "", "under /proc": "/proc/no-such-dir/c.json",
            "a name too long": str(tmp_path / ("x" * 300)), "a NUL byte": str(tmp_path / "a\0b"),
            "a fifo": os.mkfifo(tmp_path / "fifo") or str(tmp_path / "fifo")}[how]


@pytest.mark.parametrize("how", ["a directory", "a file as its parent", "a symlink loop", "empty", "under /proc",
                                 "a name too long", "a NUL byte", "a fifo"])
def test_a_cache_path_no_file_can_be_written_at_is_refused_before_anything_is_timed(tmp_path, how):
    from zmlx_pipeline.runtime import BadArgument

    path = _bad_cache_path(tmp_path, how)
    measure = FakeMeasure()
    with pytest.raises(BadArgument) as info:
        tune("rmsnorm", SHAPE, "float16", device=H200, measure=measure, cache_path=path)
    assert "\n" not in str(info.value) and len(str(info.value)) < 400
    assert measure.calls == []
    if how != "under /proc":  # a folder that cannot be made shows only when a tune makes it
        with pytest.raises(BadArgument):
            autotune("rmsnorm", device=H200, measure=measure, cache_path=path)


@pytest.mark.parametrize("junk", [math.nan, math.inf, -1.0, 0.0, 0, pytest.param(10**400, id="int past any float"),
                                  pytest.param(Fraction(10**400, 3), id="fraction past any float")])
def test_a_measured_time_that_is_no_time_is_never_chosen_or_cached(real, tmp_path, junk):
    path = tmp_path / "autotune_v3.json"
    good, seen = FakeMeasure(), []

    def junk_first(spec, config, shape, dtype):
        seen.append(config)
        return ("ok", junk) if len(seen) == 1 else good(spec, config, shape, dtype)

    result = tune("rmsnorm", SHAPE, "float16", device=H200, k=3, measure=junk_first, cache_path=str(path))
    first = result.timed[0]
    assert first["status"] == "bad_time" and first["median_us"] is None
    assert result.source == "timed" and result.config != first["config"] and math.isfinite(result.median_us)
    entries = [e for s in json.loads(path.read_text())["devices"].values() for e in s["entries"].values()]
    assert entries and all(math.isfinite(e["median_us"]) and e["median_us"] > 0 for e in entries)

    only_junk = tmp_path / "junk.json"
    result = tune("rmsnorm", SHAPE, "float16", device=H200, k=3, measure=lambda *a: ("ok", junk),
                  cache_path=str(only_junk))
    assert result.source == "predicted" and result.median_us is None and "not cached" in result.note
    assert not only_junk.exists()


@pytest.mark.parametrize("returned", [None, ("ok",), ("ok", "fast"), ("ok", True), 12.5, "ok", (None, 12.5)])
def test_a_malformed_measure_result_is_the_autotuners_error_naming_it(real, tmp_path, returned):
    from zmlx_pipeline.runtime import AutotuneError

    path = tmp_path / "autotune_v3.json"
    with pytest.raises(AutotuneError, match=r"measure returned .* it must return \(status, median_us") as info:
        tune("rmsnorm", SHAPE, "float16", device=H200, measure=lambda *a: returned, cache_path=str(path))
    assert "\n" not in str(info.value) and repr(returned)[:20] in str(info.value)
    assert not path.exists()


#: MLX's refusal of a threadgroup over a pipeline's thread limit, which the tuner remembers as refused
OVER_LIMIT = ("[metal::Device] Unable to build pipeline: threadgroup size (1024) is greater than the maximum allowed "
              "threads per threadgroup (896)")


@pytest.mark.parametrize("status", ["OK", "passed", "bad_time", ""])
def test_a_status_the_tuner_does_not_know_is_the_autotuners_error_and_nothing_is_kept(real, tmp_path, status):
    from zmlx_pipeline.runtime import AutotuneError

    path = tmp_path / "autotune_v3.json"
    seen = []

    def measure(spec, config, shape, dtype):
        seen.append(dict(config))
        return ("launch_error", None, OVER_LIMIT) if len(seen) == 1 else (status, 5.0)

    with pytest.raises(AutotuneError, match=rf"^measure returned status '{status}' for config .*: a status is one of "
                                            "ok, wrong_result, launch_error, compile_error, timeout$") as info:
        tune("rmsnorm", SHAPE, "float16", device=H200, k=3, measure=measure, cache_path=str(path))
    assert "\n" not in str(info.value) and len(seen) == 2
    assert not path.exists()  # neither a winner nor the first config's refusal was kept
    again = FakeMeasure()
    tune("rmsnorm", SHAPE, "float16", device=H200, k=3, measure=again, cache_path=str(path))
    assert again.calls[0] == seen[0]  # nor was it remembered in this process


def test_a_dtype_in_another_form_than_an_mlx_dtype_prints_is_unknown_and_nothing_is_timed(real, tmp_path):
    from zmlx_pipeline.runtime import UnknownDtypeError

    measure = FakeMeasure()

    @autotune("rmsnorm", device=H200, measure=measure, cache_path=str(tmp_path / "c.json"),
              shape=lambda x, config=None: SHAPE, dtype=lambda x, config=None: "mlx.junk.float16")
    def rmsnorm(x, config=None):
        return config

    with pytest.raises(UnknownDtypeError, match="^unknown dtype 'mlx.junk.float16'"):
        rmsnorm(None)
    assert measure.calls == [] and not (tmp_path / "c.json").exists()
    rmsnorm.dtype_fn = lambda x, config=None: "mlx.core.float16"  # the form an mlx dtype prints as
    assert rmsnorm(None) and measure.calls


def test_the_tuner_knows_every_status_a_measurement_can_have():
    from zmlx_pipeline.data.records import STATUSES
    from zmlx_pipeline.runtime.tuner import MEASURE_STATUSES

    assert MEASURE_STATUSES == STATUSES


def test_a_given_config_is_tuned_as_the_kernels_own_ints(real, tmp_path):
    legal = _legal()[0]
    given = {k: float(v) for k, v in legal.items()}
    result = tune("rmsnorm", SHAPE, "float16", device=H200, configs=[given], measure=FakeMeasure(),
                  cache_path=str(tmp_path / "c.json"))
    assert result.config == legal and all(type(v) is int for v in result.config.values())
    assert all(type(v) is int for t in result.timed for v in t["config"].values())


def test_a_shape_function_giving_zero_dimensional_arrays_tunes_once_per_shape(real, tmp_path):
    np = pytest.importorskip("numpy")
    measure = FakeMeasure()

    @autotune("rmsnorm", warmup=1, iters=2, device=H200, measure=measure, cache_path=str(tmp_path / "c.json"),
              shape=lambda x, config=None: {"rows": np.array(x[0]), "cols": np.array(x[1])},
              dtype=lambda x, config=None: "float16")
    def rmsnorm(x, config=None):
        return config

    got = rmsnorm((3000, 2048))
    n = len(measure.calls)
    assert got and n and rmsnorm((3000, 2048)) == got and len(measure.calls) == n


class _NoShape:
    """An array-like whose shape and dtype are None."""

    shape = None
    dtype = None


def test_an_argument_whose_shape_is_none_is_the_autotuners_error(real, tmp_path):
    from zmlx_pipeline.runtime import AutotuneError

    measure = FakeMeasure()

    @autotune("rmsnorm", device=H200, measure=measure, cache_path=str(tmp_path / "c.json"))
    def rmsnorm(x, config=None):
        return config

    with pytest.raises(AutotuneError, match="cannot tell the rows/cols shape of this call") as info:
        rmsnorm(_NoShape())
    assert "\n" not in str(info.value) and measure.calls == []


def _cache_with(path, entries_by_shape):
    """A v3 cache file holding, in the H200's section, one raw entry per shape: {shape items: value}."""
    from zmlx_pipeline.runtime import cache
    from zmlx_pipeline.runtime.tuner import _device_and_mlx

    spec = get_kernel("rmsnorm")
    dkey = cache.device_keys(*_device_and_mlx(H200)[:2])[0]
    keys = {shape: cache.entry_key("rmsnorm", spec.version, dict(shape), spec.shape_grid.dims, "float16",
                                   list(spec.params)) for shape in entries_by_shape}
    path.write_text(json.dumps({"schema_version": "3.0", "devices": {dkey: {"entries": {
        keys[shape]: value for shape, value in entries_by_shape.items()}}}}))
    return dkey, keys


def _tuned_entry(path, dkey, key):
    return json.loads(path.read_text())["devices"][dkey]["entries"][key]


@pytest.mark.parametrize("median", [-5, "fast", math.nan, math.inf, 0, 0.0, True, pytest.param("1e400", id="1e400")])
def test_a_cached_entry_whose_time_is_no_time_is_tuned_again_and_replaced(real, tmp_path, median):
    path = tmp_path / "autotune_v3.json"
    cached = _legal()[0]
    shape = tuple(SHAPE.items())
    dkey, keys = _cache_with(path, {shape: {"config": cached, "median_us": median}})
    if median == "1e400":  # a number JSON holds but no float does
        path.write_text(path.read_text().replace('"1e400"', "1e400"))
    measure = FakeMeasure()
    with pytest.warns(UserWarning, match=r"autotune_v3.json: the cached entry of rmsnorm .* float16 on "
                                         r"nvidia-h200_\S+ is not used \(its median_us .* is no time\); timing it "
                                         "again, and the new winner replaces it") as caught:
        result = tune("rmsnorm", SHAPE, "float16", device=H200, measure=measure, cache_path=str(path))
    assert len([w for w in caught if "is not used" in str(w.message)]) == 1
    assert result.source == "timed" and measure.calls and result.median_us > 0 and math.isfinite(result.median_us)
    entry = _tuned_entry(path, dkey, keys[shape])
    assert entry["config"] == result.config and entry["median_us"] == result.median_us
    again = tune("rmsnorm", SHAPE, "float16", device=H200, measure=FakeMeasure(), cache_path=str(path))
    assert again.source == "cache" and again.median_us == result.median_us


@pytest.mark.parametrize("value, problem", [
    ({"config": {"TG": 4096, "VEC": 1, "ROWS": 1}, "median_us": 5.0}, "is not legal for this kernel and shape"),
    ({"config": {"TG": 256, "VEC": 4, "ROWS": 1.5}, "median_us": 5.0}, "is not legal for this kernel and shape"),
    ({"config": {"TG": 256, "VEC": 4}, "median_us": 5.0}, "does not set exactly the kernel's parameters ROWS, TG, VEC"),
    ({"config": {"TG": 256, "VEC": 4, "ROWS": 1, "X": 1}, "median_us": 5.0}, "does not set exactly the kernel's"),
    ({"tg": [256, 1, 1], "template": [["T", "float16"], ["TG", 256]]}, "holds no config with every parameter"),
    ("x", "holds no config with every parameter"),
])
def test_a_cached_entry_without_a_legal_config_is_tuned_again_and_replaced(real, tmp_path, value, problem):
    path = tmp_path / "autotune_v3.json"
    shape = tuple(SHAPE.items())
    dkey, keys = _cache_with(path, {shape: value})
    with pytest.warns(UserWarning, match=problem):
        result = tune("rmsnorm", SHAPE, "float16", device=H200, measure=FakeMeasure(), cache_path=str(path))
    assert result.source == "timed" and result.config in _legal()
    assert _tuned_entry(path, dkey, keys[shape])["config"] == result.config


def test_unusable_cached_entries_are_warned_about_once_per_file(real, tmp_path):
    import warnings

    other = {"rows": 1000, "cols": 4096}
    bad = {"config": _legal()[0], "median_us": -5}
    files = [tmp_path / "a.json", tmp_path / "b.json"]
    for path in files:
        _cache_with(path, {tuple(SHAPE.items()): bad, tuple(other.items()): {"config": {"TG": 1}, "median_us": 1.0}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for path in files:
            for shape in (SHAPE, other):
                assert tune("rmsnorm", shape, "float16", device=H200, measure=FakeMeasure(),
                            cache_path=str(path)).source == "timed"
    said = [str(w.message) for w in caught if "is not used" in str(w.message)]
    assert len(said) == 2 and [p.name for p in files] == [s.split(": the cached")[0].rsplit("/", 1)[1] for s in said]


def test_a_usable_cached_entry_is_answered_without_a_warning(real, tmp_path):
    import warnings

    path = tmp_path / "autotune_v3.json"
    good, zmlx_saved = _legal()[0], _legal()[1]
    other = {"rows": 1000, "cols": 4096}
    template = [["T", "float16"], *sorted(zmlx_saved.items())]
    _cache_with(path, {tuple(SHAPE.items()): {"config": good, "median_us": 12.5},
                       tuple(other.items()): {"tg": [zmlx_saved["TG"], 1, 1], "template": template}})
    measure = FakeMeasure()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = tune("rmsnorm", SHAPE, "float16", device=H200, measure=measure, cache_path=str(path))
        second = tune("rmsnorm", other, "float16", device=H200, measure=measure, cache_path=str(path))
    assert (first.source, first.config, first.median_us) == ("cache", good, 12.5)
    assert zmlx_saved in _legal(other)
    assert (second.source, second.config, second.median_us) == ("cache", zmlx_saved, None) and not measure.calls


def test_a_winner_the_full_disk_cannot_cache_is_launched_with_one_warning(real, tmp_path, monkeypatch):
    import errno
    import warnings

    import zmlx_pipeline.runtime.cache as cache

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(cache, "write_json_atomic", full)
    path = tmp_path / "c.json"
    measure = FakeMeasure()

    @autotune("rmsnorm", warmup=1, iters=2, device=H200, measure=measure, cache_path=str(path),
              shape=lambda x, config=None: {"rows": x[0], "cols": x[1]}, dtype=lambda x, config=None: "float16")
    def rmsnorm(x, config=None):
        return config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = rmsnorm((3000, 2048))
        assert got == rmsnorm.last.config and rmsnorm.last.source == "timed"
        assert rmsnorm.last.note == "not cached: No space left on device"
        assert rmsnorm((1000, 4096)) == rmsnorm.last.config  # another winner: launched, not warned about again
        result = tune("rmsnorm", {"rows": 500, "cols": 1024}, "float16", device=H200, measure=FakeMeasure(),
                      cache_path=str(path))
    assert result.source == "timed" and result.config in _legal({"rows": 500, "cols": 1024})
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and said[0].startswith(f"zmlx-pipeline autotune: {path}: the winner of rmsnorm ")
    assert "was not cached (No space left on device); it is used all the same" in said[0]
    assert not path.exists()


def test_with_nothing_timed_a_device_the_bundle_lacks_gets_the_default_and_says_so(real, tmp_path, monkeypatch):
    import zmlx_pipeline.runtime.tuner as tuner_module

    def no_gpu(*args, **kwargs):
        raise RuntimeError("no Metal or CUDA backend")

    monkeypatch.setattr(tuner_module, "harness_measure", no_gpu)
    other = "nvidia-a100-sxm4-80gb"  # in the catalog, not in the real bundle
    with pytest.warns(UserWarning, match="using the default config"):
        result = tune("rmsnorm", SHAPE, "float16", device=other, cache_path=str(tmp_path / "c.json"))
    assert result.source == "default" and result.config == predicted_config("rmsnorm", SHAPE, "float16",
                                                                             device=other).config
    with pytest.warns(UserWarning, match="using the predicted config"):
        assert tune("rmsnorm", SHAPE, "float16", device=H200, cache_path=str(tmp_path / "c.json")).source == "predicted"


def test_tune_reads_the_device_zmlx_pipeline_device_names_as_lookups_do(real, tmp_path, monkeypatch):
    """A process under an MPS core limit says so in $ZMLX_PIPELINE_DEVICE (the GPU does not report it): tune prunes
    and caches under that device, and refuses a name lookups refuse, before timing anything."""
    from zmlx_pipeline.runtime import UnknownDeviceError
    from zmlx_pipeline.runtime.device import forget_current_device

    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", "nvidia-h200@66sm")
    forget_current_device()
    measure, path = FakeMeasure(), tmp_path / "c.json"
    result = tune("rmsnorm", SHAPE, "float16", measure=measure, cache_path=str(path))
    assert result.source == "timed"
    (dkey,) = json.loads(path.read_text())["devices"]
    assert dkey.startswith("nvidia-h200@66sm_")
    assert measure.calls == [c for c in predicted_config("rmsnorm", SHAPE, "float16").candidates
                             if c in _legal()][: len(measure.calls)]  # the limit's own pruning
    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", "nvidia-h2000")
    forget_current_device()
    measure, other = FakeMeasure(), tmp_path / "d.json"
    with pytest.raises(UnknownDeviceError, match=r"\$ZMLX_PIPELINE_DEVICE 'nvidia-h2000'"):
        tune("rmsnorm", SHAPE, "float16", measure=measure, cache_path=str(other))
    assert measure.calls == [] and not other.exists()
    forget_current_device()
