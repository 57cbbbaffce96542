"""No answer is a config the kernel cannot run: a re-hashed bundle whose built-in kernel holds a config the kernel
lacks (TG=-64, or TG=96 outside rmsnorm's threadgroups) never has it returned by a lookup, and the autotuner, when
it times nothing or nothing passes, answers with one of the case's legal configs only."""

import json

import pytest
from click.testing import CliRunner
from rehashed_bundles import rehashed

from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.spec import Limits
from zmlx_pipeline.pipeline.cli import cli
from zmlx_pipeline.runtime import load_bundle, predicted_config, tune
from zmlx_pipeline.runtime import tuner as tuner_module

H200 = "nvidia-h200"
SHAPE = {"rows": 4096, "cols": 4096}
H200_LIMITS = Limits(max_threads=1024, simd_width=32, tg_mem_bytes=49152)


def _legal(shape=SHAPE, dtype="float16", threadgroups=None):
    legal = get_kernel("rmsnorm").legal_configs(shape, dtype, H200_LIMITS)
    return [c for c in legal if threadgroups is None or c["TG"] in threadgroups]


def _with_best_replaced(real_bundle, dest, tg):
    """The real bundle with the config the H200 is answered with at SHAPE replaced by one of threadgroup `tg`
    (ROWS 1, so every constraint of rmsnorm still holds for it), re-hashed."""
    load_bundle(real_bundle[1], strict=True)
    best = predicted_config("rmsnorm", SHAPE, "float16", device=H200).config
    bad = {"ROWS": 1, "TG": tg, "VEC": best["VEC"]}

    def edit(kernels):
        configs = kernels["kernels"]["rmsnorm"]["configs"]
        configs[configs.index(best)] = bad

    root = rehashed(real_bundle[1], dest, {"kernels.json": edit})
    load_bundle(root, strict=True)  # the contents checks pass: its dims, parameters and constraints are rmsnorm's
    return root, best, bad


@pytest.mark.parametrize("tg", [-64, 96])
def test_a_config_the_built_in_kernel_lacks_is_never_answered(real_bundle, tmp_path, tg):
    root, best, bad = _with_best_replaced(real_bundle, tmp_path / "b", tg)
    pred = predicted_config("rmsnorm", SHAPE, "float16", device=H200)
    assert pred.config != bad and pred.config in _legal()
    assert all(c in _legal() for c in pred.candidates)
    assert pred.threadgroup == pred.config["TG"] and pred.threadgroup != tg
    assert pred.evidence == "predicted" and pred.predicted_us is None  # the entry's time was the dropped config's
    assert "illegal for this exact shape dropped" in pred.note

    result = CliRunner().invoke(cli, ["lookup", "rmsnorm", "--shape", "4096,4096", "--device", H200,
                                      "--bundle", str(root), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["threadgroup"] != tg and out["config"] in _legal() and out["config"] != bad


def test_tune_with_nothing_timed_answers_a_legal_config_from_a_bundle_that_holds_an_illegal_one(
        real_bundle, tmp_path, monkeypatch):
    _with_best_replaced(real_bundle, tmp_path / "b", -64)

    def no_gpu(*args, **kwargs):
        raise RuntimeError("no Metal or CUDA backend")

    monkeypatch.setattr(tuner_module, "harness_measure", no_gpu)
    with pytest.warns(UserWarning, match="nothing timed"):
        result = tune("rmsnorm", SHAPE, "float16", device=H200, cache_path=str(tmp_path / "c.json"))
    assert result.source == "predicted" and result.config in _legal() and result.config["TG"] == abs(result.config["TG"])


def _other_threadgroup(pred_tg):
    return 64 if pred_tg != 64 else 128


@pytest.fixture
def real(real_bundle):
    return load_bundle(real_bundle[1], strict=True)


def test_tune_with_nothing_timed_answers_only_among_the_legal_configs_it_counts(real, tmp_path, monkeypatch):
    """`threadgroups` leaves configs the predicted one is not among: the answer is one of those left."""
    pred = predicted_config("rmsnorm", SHAPE, "float16", device=H200)
    tg = _other_threadgroup(pred.config["TG"])

    def no_gpu(*args, **kwargs):
        raise RuntimeError("no Metal or CUDA backend")

    monkeypatch.setattr(tuner_module, "harness_measure", no_gpu)
    with pytest.warns(UserWarning, match="nothing timed"):
        result = tune("rmsnorm", SHAPE, "float16", device=H200, threadgroups=[tg], cache_path=str(tmp_path / "c.json"))
    legal = _legal(threadgroups={tg})
    assert result.legal == len(legal) and result.config in legal
    ranked_legal = [c for c in pred.top(10_000) if c in legal]
    assert result.config == ranked_legal[0]  # the first legal one in the model's order


def test_tune_with_no_candidate_passing_answers_a_legal_config(real, tmp_path):
    pred = predicted_config("rmsnorm", SHAPE, "float16", device=H200)
    tg = _other_threadgroup(pred.config["TG"])
    calls = []

    def all_wrong(spec, config, shape, dtype):
        calls.append(config)
        return "wrong_result", None

    result = tune("rmsnorm", SHAPE, "float16", device=H200, threadgroups=[tg], measure=all_wrong,
                  cache_path=str(tmp_path / "c.json"))
    legal = _legal(threadgroups={tg})
    assert calls and result.source == "predicted" and result.median_us is None
    assert result.config in legal and "not cached" in result.note
    assert result.config == [c for c in pred.top(10_000) if c in legal][0]


def test_tune_keeps_the_predicted_config_when_it_is_legal(real, tmp_path):
    pred = predicted_config("rmsnorm", SHAPE, "float16", device=H200)
    result = tune("rmsnorm", SHAPE, "float16", device=H200, measure=lambda *a: ("wrong_result", None),
                  cache_path=str(tmp_path / "c.json"))
    assert result.config == pred.config and "the predicted config" in result.note
