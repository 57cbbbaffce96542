"""A config the chip refuses at launch: fall back through the ranked configs, warn once, never launch it again.

The kernel function is a test double that raises as MLX does for some configs; the cache file is a
real one in tmp_path, and "a new process" is a real child Python.
"""

import json
import subprocess
import sys
import textwrap
import warnings

import pytest

from zmlx_pipeline.runtime import LaunchRefused, RefusedConfigWarning, autotune, cache, launch_ranked, load_bundle
from zmlx_pipeline.runtime.tuner import forget_refusals

H200 = "nvidia-h200"
#: MLX's words for a threadgroup over a compiled Metal pipeline's limit (mlx/backend/metal/custom_kernel.cpp)
OVER_LIMIT = "Thread group size ({}) is greater than  the maximum allowed threads per threadgroup (896)."


class Kernel:
    """A kernel function double: refuses threadgroups over 896 as MLX does on Metal, records every launch."""

    def __init__(self, refuse=lambda config: config["TG"] > 896):
        self.calls = []
        self.refuse = refuse

    def __call__(self, x, config=None):
        self.calls.append(dict(config))
        if self.refuse(config):
            raise ValueError(OVER_LIMIT.format(config["TG"]))
        return ("ran", config["TG"])


RANKED = [{"TG": 1024}, {"TG": 960}, {"TG": 512}, {"TG": 256}]


def test_a_refused_config_falls_back_warns_once_and_is_never_launched_again(tmp_path):
    path = str(tmp_path / "autotune_v3.json")
    kernel = Kernel()
    with pytest.warns(RefusedConfigWarning) as caught:
        out = launch_ranked(kernel, RANKED, "x", kernel="my_norm", device=H200, cache_path=path)
    assert out == ("ran", 512)
    assert kernel.calls == [{"TG": 1024}, {"TG": 960}, {"TG": 512}]  # in rank order, stopping at the first that ran
    assert len(caught) == 2 and "limit of 896" in str(caught[0].message) and "{'TG': 1024}" in str(caught[0].message)

    kernel.calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert launch_ranked(kernel, RANKED, "x", kernel="my_norm", device=H200, cache_path=path) == ("ran", 512)
    assert kernel.calls == [{"TG": 512}]

    dkey = cache.device_key(H200, _mlx_version())
    refused = cache.load_refusals(dkey, path)
    assert [(r["kernel"], r["config"]) for r in refused] == [("my_norm", {"TG": 1024}), ("my_norm", {"TG": 960})]
    assert refused[0]["error"].startswith("threadgroup of 1024 threads over this pipeline's limit of 896")
    # another kernel on the same device, and the same kernel elsewhere, are not affected
    other = Kernel()
    with pytest.warns(RefusedConfigWarning):
        launch_ranked(other, RANKED, "x", kernel="other_norm", device=H200, cache_path=path)
    assert other.calls[0] == {"TG": 1024}


def _mlx_version():
    from zmlx_pipeline.runtime.tuner import _device_and_mlx

    return _device_and_mlx(H200)[1]


def test_a_new_process_skips_the_configs_refused_before(tmp_path, subprocess_env):
    path = str(tmp_path / "autotune_v3.json")
    with pytest.warns(RefusedConfigWarning):
        launch_ranked(Kernel(), RANKED, "x", kernel="my_norm", device=H200, cache_path=path)
    child = textwrap.dedent("""
        import json, sys, warnings
        from zmlx_pipeline.runtime import launch_ranked
        calls = []
        def kernel(x, config=None):
            calls.append(config["TG"])
            if config["TG"] > 896:
                raise ValueError("refused")
            return config["TG"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = launch_ranked(kernel, [{"TG": t} for t in (1024, 960, 512, 256)], "x", kernel="my_norm",
                                device="nvidia-h200", cache_path=sys.argv[1])
        print(json.dumps({"out": out, "calls": calls, "warnings": len(caught)}))
    """)
    done = subprocess.run([sys.executable, "-c", child, path], env=subprocess_env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == {"out": 512, "calls": [512], "warnings": 0}


def test_errors_that_are_not_refusals_propagate_and_are_not_remembered(tmp_path):
    path = str(tmp_path / "autotune_v3.json")

    def buggy(x, config=None):
        raise TypeError("a bug in the wrapper")

    with pytest.raises(TypeError, match="a bug"):
        launch_ranked(buggy, RANKED, "x", kernel="my_norm", device=H200, cache_path=path)
    assert cache.load_refusals(cache.device_key(H200, _mlx_version()), path) == []


def test_when_every_config_is_refused_the_error_says_so(tmp_path):
    path = str(tmp_path / "autotune_v3.json")
    with pytest.warns(RefusedConfigWarning), pytest.raises(LaunchRefused, match="no candidate config launched"):
        launch_ranked(Kernel(refuse=lambda c: True), RANKED[:2], "x", kernel="k", device=H200, cache_path=path)
    with pytest.raises(LaunchRefused, match="2 refused before"):  # MLX named the pipeline's limit: remembered
        launch_ranked(Kernel(), RANKED[:2], "x", kernel="k", device=H200, cache_path=path)


def test_an_error_every_config_raises_is_not_blamed_on_the_configs(tmp_path):
    path = str(tmp_path / "autotune_v3.json")

    def broken(x, config=None):
        raise RuntimeError("[metal::Device] Unable to allocate 68719476736 bytes")

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(LaunchRefused, match="4 tried") as raised:
            launch_ranked(broken, RANKED, "x", kernel="k", device=H200, cache_path=path)
    assert isinstance(raised.value.__cause__, RuntimeError)
    assert cache.load_refusals(cache.device_key(H200, _mlx_version()), path) == []
    kernel = Kernel()
    with pytest.warns(RefusedConfigWarning):
        assert launch_ranked(kernel, RANKED, "x", kernel="k", device=H200, cache_path=path) == ("ran", 512)
    assert kernel.calls[0] == {"TG": 1024}  # nothing was refused by the failures above


def test_a_config_that_ran_before_is_never_taken_as_refused(tmp_path):
    path = str(tmp_path / "autotune_v3.json")
    assert launch_ranked(Kernel(), RANKED[2:], "x", kernel="k", device=H200, cache_path=path) == ("ran", 512)
    with pytest.raises(ValueError, match="bad input"):
        launch_ranked(Kernel(refuse=lambda c: (_ for _ in ()).throw(ValueError("bad input"))), RANKED[2:], "x",
                      kernel="k", device=H200, cache_path=path)
    assert cache.load_refusals(cache.device_key(H200, _mlx_version()), path) == []


class FakeMeasure:
    """Timings that rank the rmsnorm configs by threadgroup, 512 first (what the tuner would time on a GPU)."""

    def __init__(self):
        self.calls = []

    def __call__(self, spec, config, shape, dtype):
        self.calls.append(dict(config))
        return "ok", 10.0 + abs(config["TG"] - 512) / 64 + config["VEC"] / 100 + config["ROWS"] / 1000


def test_the_decorator_falls_back_from_a_tuned_config_the_chip_refuses(real_bundle, tmp_path):
    load_bundle(real_bundle[1], strict=True)
    path = str(tmp_path / "autotune_v3.json")
    measure = FakeMeasure()
    launched = []

    @autotune("rmsnorm", device=H200, measure=measure, cache_path=path,
              shape=lambda x, config=None: {"rows": 3000, "cols": 2048}, dtype=lambda x, config=None: "float16")
    def rmsnorm(x, config=None):
        launched.append(dict(config))
        if config == rmsnorm.last.config:
            raise RuntimeError("the chip refused this launch")
        return config

    with pytest.warns(RefusedConfigWarning) as caught:
        got = rmsnorm("x")
    tuned = rmsnorm.last.config
    ok = sorted((t for t in rmsnorm.last.timed if t["status"] == "ok"), key=lambda t: t["median_us"])
    assert launched == [tuned, got] and got == ok[1]["config"]  # the next fastest config that was timed
    assert len(caught) == 1

    launched.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert rmsnorm("x") == got
    assert launched == [got]

    # a new tuner (no in-process memory; the cache file's winner is the refused one) times around it
    forget_refusals()
    data = json.loads((tmp_path / "autotune_v3.json").read_text())
    for section in data["devices"].values():
        section["entries"].clear()
    data[cache.OWN_SECTION]["entries"].clear()
    (tmp_path / "autotune_v3.json").write_text(json.dumps(data))
    measure.calls.clear()

    @autotune("rmsnorm", device=H200, measure=measure, cache_path=path,
              shape=lambda x, config=None: {"rows": 3000, "cols": 2048}, dtype=lambda x, config=None: "float16")
    def rmsnorm_again(x, config=None):
        return config

    assert rmsnorm_again("x") != tuned and tuned not in measure.calls and measure.calls


def test_the_plain_threadgroup_decorator_falls_back_too(monkeypatch, tmp_path):
    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", H200)
    from zmlx_pipeline.runtime import get_current_device_profile, get_threadgroup_candidates_for_shape

    class Arr:
        shape = (16, 4096)
        dtype = "float16"

    ranked = get_threadgroup_candidates_for_shape(get_current_device_profile(), 4096, "general")
    assert len(ranked) >= 2
    seen = []

    @autotune(warmup=3, iters=10, device_aware=True, cache_path=str(tmp_path / "c.json"))
    def op(x, threadgroup=(128, 1, 1)):
        seen.append(threadgroup)
        if threadgroup[0] == ranked[0]:
            raise ValueError(OVER_LIMIT.format(ranked[0]))
        return threadgroup

    with pytest.warns(RefusedConfigWarning, match="limit of 896"):
        assert op(Arr()) == (ranked[1], 1, 1)
    assert op(Arr()) == (ranked[1], 1, 1) and seen == [(ranked[0], 1, 1), (ranked[1], 1, 1), (ranked[1], 1, 1)]


def test_a_refusal_raised_when_mlx_evaluates_the_launch_falls_back_too(tmp_path, monkeypatch):
    """Metal checks a pipeline's thread limit when the launch is evaluated, not when it is queued: the first
    launch of each config is evaluated inside the fallback (mx.eval is the double here)."""
    mx = pytest.importorskip("mlx.core")
    real_eval = mx.eval
    evaluated = []

    def metal_like_eval(*arrays):
        evaluated.append(float(arrays[0][0].sum().item()))
        if evaluated[-1] > 896:
            raise ValueError(OVER_LIMIT.format(int(evaluated[-1])))
        return real_eval(*arrays)

    monkeypatch.setattr(mx, "eval", metal_like_eval)

    def kernel(x, config=None):
        return [mx.full((1,), float(config["TG"]))]  # queued, not run

    path = str(tmp_path / "c.json")
    with pytest.warns(RefusedConfigWarning, match="limit of 896"):
        out = launch_ranked(kernel, RANKED, "x", kernel="lazy", device=H200, cache_path=path)
    assert float(out[0].item()) == 512 and evaluated == [1024, 960, 512]
    launch_ranked(kernel, RANKED, "x", kernel="lazy", device=H200, cache_path=path)
    assert evaluated == [1024, 960, 512]  # a config that ran is not evaluated by the launcher again


def test_a_config_the_pipeline_refuses_while_tuning_is_never_timed_again(real_bundle, tmp_path):
    from zmlx_pipeline.runtime import tune

    load_bundle(real_bundle[1], strict=True)
    path = str(tmp_path / "autotune_v3.json")

    class Harnessish(FakeMeasure):
        """What harness_measure gives: a third field with the error text, here MLX's refusal over 896 threads
        as the harness words it."""

        def __call__(self, spec, config, shape, dtype):
            from zmlx_pipeline.kernels.harness import short_error

            status, median = super().__call__(spec, config, shape, dtype)
            if config["TG"] > 896:
                return "launch_error", None, short_error(ValueError(OVER_LIMIT.format(config["TG"])))
            return status, median, None

    first = Harnessish()
    tune("rmsnorm", {"rows": 3000, "cols": 2048}, "float16", device=H200, device_aware=False, measure=first,
         cache_path=path)
    over = [c for c in first.calls if c["TG"] > 896]
    assert over  # TG 1024 is legal on the H200: the legality model cannot know the pipeline's limit
    forget_refusals()  # a new process: only the cache file remembers
    again = Harnessish()
    tune("rmsnorm", {"rows": 64, "cols": 4096}, "float16", device=H200, device_aware=False, measure=again,
         cache_path=path)
    assert again.calls and not [c for c in again.calls if c in over]
