"""A kernel described in another package is found by module:attr and by entry point, and used like a built-in."""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from zmlx_pipeline.kernels.registry import UnknownKernel, get_kernel, registered_names
from zmlx_pipeline.pipeline.cli import cli

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture
def ext_package(tmp_path, monkeypatch):
    """An installed-looking package `ext_kernels` (the README's example) with an entry point `row_scale`."""
    pkg = tmp_path / "site" / "ext_kernels"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text((EXAMPLES / "row_scale.py").read_text())
    dist = tmp_path / "site" / "ext_kernels-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ext-kernels\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[zmlx_pipeline.kernels]\nrow_scale = ext_kernels:SPEC\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    yield "ext_kernels"
    sys.modules.pop("ext_kernels", None)


def test_module_path_loads_the_spec(ext_package):
    spec = get_kernel("ext_kernels:SPEC")
    assert spec.name == "row_scale"
    assert spec.legal_configs({"rows": 16, "cols": 4096}, "float32", spec_limits()) != []


def spec_limits():
    from zmlx_pipeline.kernels.spec import Limits

    return Limits()


def test_entry_point_registers_by_name(ext_package):
    assert "row_scale" in registered_names()
    assert get_kernel("row_scale").name == "row_scale"


def test_kernels_cli_lists_the_external_kernel(ext_package):
    result = CliRunner().invoke(cli, ["kernels", "-k", "ext_kernels:SPEC", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["name"] == "row_scale" and row["backends"] == ["metal", "cuda"]
    assert row["parameters"] == {"TG": [64, 128, 256, 512], "VEC": [1, 2, 4]}


def test_collect_and_summary_treat_it_like_a_builtin(ext_package, store):
    from zmlx_pipeline.data.detect import detect_device
    from zmlx_pipeline.kernels.harness import Outcome
    from zmlx_pipeline.kernels.timing import Timing
    from zmlx_pipeline.pipeline.collect import collect

    device = detect_device({"device_name": "NVIDIA H100 80GB HBM3"}, backend="cuda", gpu_cores=132)
    res = collect(store, device, [get_kernel("row_scale")], dtypes=["float16"],
                  measurer=lambda t: Outcome("ok", timing=Timing(3.0, 2.9, 3.2, 3, 1)))
    assert res.done == res.planned > 0
    (row,) = store.summary(kernel="row_scale")
    assert row["shapes"] == row["shapes_ok"] == 2 and row["device"] == "nvidia-h100-sxm"


def test_unknown_kernel_message_lists_known_ones():
    with pytest.raises(UnknownKernel, match="known kernels: rmsnorm"):
        get_kernel("no_such_kernel")


def test_readme_shows_the_example_verbatim():
    assert (EXAMPLES / "row_scale.py").read_text().strip() in README.read_text()
