"""Evidence `measured` needs the device among those the bundle measured (its kernel's trained_devices): a re-hashed
table marking every entry of a never-measured device `measured` is answered as what it is, a prediction that
travelled from a measured chip, with no time and no expected regret, never as measured with regret 1.0."""

import json

import pytest
from click.testing import CliRunner
from rehashed_bundles import every_entry, rehashed

from zmlx_pipeline.pipeline.cli import cli
from zmlx_pipeline.runtime import load_bundle, predicted_config

SHAPE = {"rows": 4096, "cols": 4096}
MEASURED = "nvidia-h100-sxm@32sm"  # the real bundle's one measured device


def _all_marked_measured(table):
    for *_, entry in every_entry(table):
        entry["evidence"] = "measured"
        entry["expected_regret"] = 1.0


@pytest.mark.parametrize("device, travelled", [("nvidia-h200", "predicted"), ("apple-m3-max-40c", "extrapolated")])
def test_a_table_claiming_measurements_of_a_device_never_measured_is_answered_as_what_it_is(
        real_bundle, tmp_path, device, travelled):
    load_bundle(real_bundle[1], strict=True)
    before = predicted_config("rmsnorm", SHAPE, "float16", device=device)
    assert before.evidence == travelled
    root = rehashed(real_bundle[1], tmp_path / "b", {f"device:{device}": _all_marked_measured})
    load_bundle(root, strict=True)
    pred = predicted_config("rmsnorm", SHAPE, "float16", device=device)
    assert pred.evidence == travelled and pred.device == device
    assert pred.expected_regret is None and pred.predicted_us is None
    assert f"measured no rmsnorm on {device}" in pred.note and "\n" not in pred.note
    assert pred.config == before.config  # its ranking is still the answer

    result = CliRunner().invoke(cli, ["lookup", "rmsnorm", "--shape", "4096,4096", "--device", device,
                                      "--bundle", str(root), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["evidence"], out["expected_regret"], out["predicted_us"]) == (travelled, None, None)


def test_a_measured_device_keeps_its_measured_answers(real_bundle):
    load_bundle(real_bundle[1], strict=True)
    pred = predicted_config("rmsnorm", {"rows": 4096, "cols": 1024}, "float16", device=MEASURED)
    assert (pred.evidence, pred.expected_regret) == ("measured", 1.0) and pred.predicted_us is not None
