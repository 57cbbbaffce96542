"""`lookup` and `profiles` name a device registered in the store (`devices add`) as the catalog's chips are named:
by its id, name or alias (answered under its id); an unknown name, and a core limit of a registered device (which
`import` refuses too), exit 1 with one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).parent))

from bundle_fixtures import build_registered  # noqa: E402
from device_records import record  # noqa: E402
from zmlx_pipeline.pipeline.cli import cli  # noqa: E402


@pytest.fixture(scope="module")
def publish_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("registered")
    return build_registered(root, record(root / "acme.json"))[1]


pytestmark = pytest.mark.usefixtures("fresh_runtime")  # tests/pipeline/conftest.py


def _lookup(publish_dir: Path, device: str):
    return CliRunner().invoke(cli, ["lookup", "toy_scale", "--shape", "rows=64,cols=4096", "--dtype", "float16",
                                    "--device", device, "--bundle", str(publish_dir), "--json"])


def _one_error_line(result) -> str:
    assert result.exit_code == 1 and result.stdout == "" and "Traceback" not in result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: ")
    return line[len("Error: "):]


@pytest.mark.parametrize("name", ["Acme X1", "NVIDIA Acme X1 Accelerator", "acme-x1"])
def test_lookup_answers_a_registered_device_by_its_name_under_its_id(publish_dir, name):
    result = _lookup(publish_dir, name)
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["device"] == "acme-x1" and answer["config"] is not None
    if name != "acme-x1":
        assert answer["note"].startswith(f"device {name!r} read as acme-x1. ")
    profiles = CliRunner().invoke(cli, ["profiles", "--device", name, "--bundle", str(publish_dir), "--json"])
    assert profiles.exit_code == 0, profiles.output
    (row,) = json.loads(profiles.stdout)
    assert row["device_id"] == "acme-x1"


def test_lookup_of_an_unknown_name_exits_1_in_one_line(publish_dir):
    assert _one_error_line(_lookup(publish_dir, "Acme X2")).startswith("unknown device 'Acme X2': neither a catalog id")


@pytest.mark.parametrize("device", ["acme-x1@10sm", "Acme X1@10sm"])
def test_lookup_of_a_core_limit_of_a_registered_device_exits_1_in_one_line(publish_dir, device):
    assert _one_error_line(_lookup(publish_dir, device)) == (
        f"device {device!r} limits acme-x1, a device registered in the store; a core limit (@<N>sm) is only of a "
        "catalog chip (give acme-x1)")
    assert _lookup(publish_dir, "nvidia-h200@66sm").exit_code == 0  # a catalog chip's limit is answered
