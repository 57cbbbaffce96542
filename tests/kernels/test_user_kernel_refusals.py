"""A malformed user kernel (examples/row_scale.py changed one way) is refused in one line naming what is wrong:
string or bool parameter values when the spec is made, a launch() that returns no Launch at the first config of a
tune or collect (before anything is timed), a module attribute that is not a KernelSpec when it is loaded."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.kernels.registry import UnknownKernel, get_kernel
from zmlx_pipeline.kernels.spec import KernelSpecError, Launch, Limits
from zmlx_pipeline.pipeline.cli import cli

EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "row_scale.py").read_text()
SHAPE = {"rows": 64, "cols": 4096}


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """write(name, text) puts a module `name` on sys.path; each is forgotten afterwards."""
    made = []

    def write(name: str, text: str) -> str:
        (tmp_path / f"{name}.py").write_text(text)
        made.append(name)
        importlib.invalidate_caches()
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    yield write
    for name in made:
        sys.modules.pop(name, None)


def _variant(old: str, new: str) -> str:
    """The example renamed row_scale2 (not the built-in-looking name of the README's), with one change."""
    assert old in EXAMPLE
    return EXAMPLE.replace(old, new, 1).replace('name="row_scale"', 'name="row_scale2"')


BAD_LAUNCH = _variant("def launch(config, shape):\n", "def launch(config, shape):\n    return \"not a launch\"\n")


# -- parameters: integer template arguments --------------------------------------------------------------------

@pytest.mark.parametrize("params, says", [
    ({"TG": (64, 128), "VEC": ("a", "b")}, "parameter 'VEC' value 'a' is str, not int"),
    ({"TG": (64, 128), "VEC": (1, True)}, "parameter 'VEC' value 'True' is bool, not int"),
    ({"TG": (64, 128), "VEC": (1.0, 2.0)}, "parameter 'VEC' value '1.0' is float, not int"),
    ({"TG": (64, 128), "VEC": "124"}, "parameter 'VEC' is str, not a list or tuple of whole numbers"),
    ({"TG": (64, 128), "VEC": 4}, "parameter 'VEC' is int, not a list or tuple of whole numbers"),
    ({"TG": (64, 128), "VEC": ()}, "parameter 'VEC' has no values"),
    ({"TG": (64, 128), "1VEC": (1, 2)}, "parameter name '1VEC' is not an identifier"),
    ({"TG": (64, 64, 128), "VEC": (1,)}, "parameter 'TG' lists a value twice"),
    ({"TG": (64,), "VEC": (2**70,)}, f"parameter 'VEC' value {2**70} does not fit a template argument"),
])
def test_a_parameter_that_is_not_a_list_of_ints_is_refused_naming_it(params, says):
    spec = get_kernel("rmsnorm")
    with pytest.raises(KernelSpecError, match="^kernel 'rmsnorm': " + says.replace("(", r"\(")) as info:
        spec.replace(params=params, constraints=(), features={}, tiles=None)
    assert "\n" not in str(info.value)


def test_numpy_style_integers_are_parameters_too():
    import numpy as np

    spec = get_kernel("rmsnorm").replace(params={"TG": (np.int64(64), 128), "VEC": (1,), "ROWS": (1,)})
    assert [c["TG"] for c in spec.configs()] == [64, 128]
    assert all(type(c["TG"]) is int for c in spec.configs())  # as the launch and the runtime take them


def test_a_launch_giving_a_threadgroup_below_one_is_one_kernel_spec_error():
    spec = get_kernel("rmsnorm")
    bad = spec.replace(launch=lambda config, shape: Launch(grid=(64, 1, 1), threadgroup=(0, 1, 1),
                                                           output_shapes=((1, 1),)))
    with pytest.raises(KernelSpecError, match=r"launch\(\) of config .* gives threadgroup \(0, 1, 1\), not three whole"):
        bad.launch(bad.configs()[0], {"rows": 64, "cols": 4096})


def test_kernels_lists_no_kernel_with_string_parameters(user_module):
    user_module("strparams", _variant('"VEC": (1, 2, 4)', '"VEC": ("a", "b")'))
    result = CliRunner().invoke(cli, ["kernels", "-k", "strparams:SPEC"])
    assert result.exit_code == 1, result.output
    assert result.output.splitlines() == [
        "Error: cannot import 'strparams' for kernel 'strparams:SPEC': KernelSpecError: kernel 'row_scale2': "
        "parameter 'VEC' value 'a' is str, not int: parameters are integer template arguments of the kernel"]


# -- launch(): must return a Launch ----------------------------------------------------------------------------

def test_a_launch_that_returns_no_launch_is_one_kernel_spec_error(user_module):
    spec = get_kernel(user_module("badlaunch", BAD_LAUNCH) + ":SPEC")
    with pytest.raises(KernelSpecError) as info:
        spec.launch({"TG": 64, "VEC": 1}, SHAPE)
    assert str(info.value).startswith("kernel 'row_scale2': launch() returned str, not Launch")
    assert "\n" not in str(info.value)


def test_legal_configs_refuses_a_bad_launch_before_anything_is_timed(user_module):
    spec = get_kernel(user_module("badlaunch", BAD_LAUNCH) + ":SPEC")
    with pytest.raises(KernelSpecError, match=r"launch\(\) returned str, not Launch"):
        spec.legal_configs(SHAPE, "float16", Limits())


def test_tune_fails_at_the_first_config_not_after_timing(user_module, tmp_path):
    from zmlx_pipeline.runtime import tune

    path = user_module("badlaunch", BAD_LAUNCH) + ":SPEC"
    timed = []

    def measure(spec, config, shape, dtype):
        timed.append(config)
        return "ok", 10.0

    cache = tmp_path / "c.json"
    with pytest.raises(KernelSpecError, match=r"kernel 'row_scale2': launch\(\) returned str, not Launch"):
        tune(get_kernel(path), SHAPE, "float16", device="nvidia-h200", cache_path=str(cache), measure=measure)
    assert timed == [] and not cache.exists()


def test_collect_fails_at_planning_and_stores_nothing(user_module, store):
    from zmlx_pipeline.data.detect import detect_device
    from zmlx_pipeline.pipeline.collect import collect

    spec = get_kernel(user_module("badlaunch", BAD_LAUNCH) + ":SPEC")
    device = detect_device({"device_name": "NVIDIA H100 80GB HBM3"}, backend="cuda", gpu_cores=132)
    measured = []
    with pytest.raises(KernelSpecError, match=r"launch\(\) returned str, not Launch"):
        collect(store, device, [spec], dtypes=["float16"], measurer=lambda task: measured.append(task))
    assert measured == [] and store.measurements() == []


def test_a_launch_that_raises_is_still_left_to_its_measurement(user_module):
    """Only a wrong return type is refused up front: a launch that raises stays that config's launch error."""
    spec = get_kernel(user_module("raising", _variant("def launch(config, shape):\n",
                                                      "def launch(config, shape):\n    1 / 0\n")) + ":SPEC")
    assert spec.legal_configs(SHAPE, "float16", Limits())
    with pytest.raises(ZeroDivisionError):
        spec.launch({"TG": 64, "VEC": 1}, SHAPE)


def test_a_good_launch_is_returned_as_it_was_and_the_spec_compares_as_before():
    spec = get_kernel("rmsnorm")
    launch = spec.launch({"TG": 256, "VEC": 4, "ROWS": 1}, {"rows": 4096, "cols": 4096})
    assert isinstance(launch, Launch) and launch.threadgroup == (256, 1, 1)
    same = spec.replace()
    assert same == spec and same.launch == spec.launch
    renamed = spec.replace(name="rmsnorm_copy", launch=lambda c, s: None)
    with pytest.raises(KernelSpecError, match="^kernel 'rmsnorm_copy': launch"):
        renamed.launch({"TG": 256, "VEC": 4, "ROWS": 1}, {"rows": 4096, "cols": 4096})


# -- a module attribute that is not a KernelSpec ---------------------------------------------------------------

def test_a_factory_is_called_and_what_it_returns_is_named(user_module):
    """registry._from_path calls a function of the module to make the spec (documented): a factory returning 1 is
    named as such, without "a int"."""
    user_module("wrongtype", 'SPEC = {"name": "x"}\nNUM = 5\n\ndef SPECF():\n    return 1\n')
    with pytest.raises(UnknownKernel) as info:
        get_kernel("wrongtype:SPECF")
    assert str(info.value) == ("'wrongtype:SPECF' is a function that returned int, not a KernelSpec: make it return "
                               "the KernelSpec, or name the spec itself")
    result = CliRunner().invoke(cli, ["kernels", "-k", "wrongtype:NUM"])
    assert result.exit_code == 1
    assert result.output.splitlines() == ["Error: 'wrongtype:NUM' is int, not a KernelSpec (or a function of "
                                          "'wrongtype' that returns one)"]


def test_a_factory_that_returns_a_spec_still_loads(user_module):
    user_module("factory", EXAMPLE.replace("SPEC = KernelSpec(", "def make():\n    return KernelSpec(", 1)
                .replace('name="row_scale"', 'name="row_scale3"'))
    result = CliRunner().invoke(cli, ["kernels", "-k", "factory:make", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["parameters"] == {"TG": [64, 128, 256, 512], "VEC": [1, 2, 4]}
