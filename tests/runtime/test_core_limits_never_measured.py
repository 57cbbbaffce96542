"""A core limit (`nvidia-h200@20sm`) the bundle holds nothing of is answered from the nearest limit it does hold, by
lookups and profiles alike: with the limit's own core count, evidence `predicted` at most and the device it came
from named; never as the whole chip with `measured` evidence, and never with the catalog default while a limit of
the chip is held."""

import json

import pytest
from bundle_fixtures import latest_dir
from click.testing import CliRunner

from zmlx_pipeline.pipeline.cli import cli
from zmlx_pipeline.runtime import get_current_device_profile, get_device_profile, load_bundle, predicted_config
from zmlx_pipeline.runtime.device import forget_current_device
from zmlx_pipeline.runtime.profiles import profile_table

SHAPE = {"rows": 4096, "cols": 4096}


@pytest.mark.parametrize("device, cores", [("nvidia-h200@1sm", 1), ("nvidia-h200@20sm", 20)])
def test_a_profile_of_a_limit_never_measured_is_its_nearest_measured_limits_with_its_own_core_count(device, cores):
    p = get_device_profile(device)  # the default bundle: the H200 whole, at 32 and at 66 SMs
    source = predicted_config("rmsnorm", SHAPE, "float16", device=device).device  # where a lookup answers from
    assert source == "nvidia-h200@32sm"
    assert (p.device_id, p.gpu_cores, p.evidence, p.answered_from) == (device, cores, "predicted", source)
    assert p.default_threadgroup == get_device_profile(source).default_threadgroup
    assert f"[{cores} SM" in p.name
    assert all(c["evidence"] != "measured" for c in p.learned["classes"].values())
    assert get_device_profile("nvidia-h200@32sm").evidence == "measured"  # a held limit is its own
    assert get_device_profile("nvidia-h200@32sm").answered_from is None


def test_the_profiles_command_shows_a_limit_never_measured_with_its_core_count_and_source():
    result = CliRunner().invoke(cli, ["profiles", "--device", "nvidia-h200@20sm"])
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "nvidia-h200@20sm" in line)
    assert " 20 " in row and "predicted" in row and "132" not in row and "measured" not in row
    result = CliRunner().invoke(cli, ["profiles", "--device", "nvidia-h200@20sm", "--json"])
    (out,) = json.loads(result.output)
    assert (out["device_id"], out["gpu_cores"], out["evidence"], out["answered_from"]) == (
        "nvidia-h200@20sm", 20, "predicted", "nvidia-h200@32sm")
    assert "nvidia-h200@32sm" in out["note"]


def test_the_current_device_profile_of_a_limit_never_measured(monkeypatch):
    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", "nvidia-h200@20sm")
    forget_current_device()
    get_current_device_profile.cache_clear()
    p = get_current_device_profile()
    assert (p.device_id, p.gpu_cores, p.evidence, p.answered_from) == (
        "nvidia-h200@20sm", 20, "predicted", "nvidia-h200@32sm")


@pytest.fixture(scope="module")
def limits_only(real_bundle, tmp_path_factory):
    """rmsnorm published from the real store for the M3 Max alone: tables of the measured H100 at 32 SMs and of
    the M3 Max, none of the whole H100."""
    from zmlx_pipeline.data.store import Store
    from zmlx_pipeline.publish import publish

    out = tmp_path_factory.mktemp("limits-only") / "bundles"
    with Store(real_bundle[0]) as store:
        publish(store, out, kernels=["rmsnorm"], devices=["apple-m3-max-40c"])
    tables = json.loads((latest_dir(out) / "tables.json").read_text())["devices"]
    assert "nvidia-h100-sxm@32sm" in tables and "nvidia-h100-sxm" not in tables
    return out


def test_a_limit_is_answered_from_the_nearest_held_limit_when_the_whole_chip_has_no_table(limits_only):
    load_bundle(limits_only, strict=True)
    pred = predicted_config("rmsnorm", SHAPE, "float16", device="nvidia-h100-sxm@20sm")
    assert (pred.device, pred.evidence) == ("nvidia-h100-sxm@32sm", "predicted")
    assert pred.predicted_us is None and pred.expected_regret is None and pred.config is not None
    assert "answering for nvidia-h100-sxm@32sm" in pred.note and "catalog" not in pred.note
    result = CliRunner().invoke(cli, ["lookup", "rmsnorm", "--shape", "4096,4096", "--device", "nvidia-h100-sxm@20sm",
                                      "--bundle", str(limits_only), "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert (out["device"], out["evidence"], out["config"]) == ("nvidia-h100-sxm@32sm", "predicted", pred.config)


@pytest.mark.parametrize("device", ["nvidia-h100-sxm@20sm", "nvidia-h100-sxm@66sm", "nvidia-h100-sxm@80sm",
                                    "nvidia-h100-sxm@100sm", "nvidia-h100-sxm@131sm"])
def test_a_limit_nearer_the_whole_chip_than_any_table_is_answered_by_profiles_as_by_lookups(limits_only, device):
    """The whole H100 has a profile (every catalog chip has one) but no table, only catalog defaults: a profile of a
    limit nearer it in core count than to the measured @32sm comes from @32sm, as the lookup's answer does."""
    load_bundle(limits_only, strict=True)
    pred = predicted_config("rmsnorm", SHAPE, "float16", device=device)
    prof = get_device_profile(device)
    assert pred.device == "nvidia-h100-sxm@32sm"
    assert (prof.answered_from, prof.evidence) == ("nvidia-h100-sxm@32sm", "predicted")
    assert prof.default_threadgroup == get_device_profile("nvidia-h100-sxm@32sm").default_threadgroup
    result = CliRunner().invoke(cli, ["profiles", "--device", device, "--bundle", str(limits_only), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["answered_from"] == "nvidia-h100-sxm@32sm"


@pytest.mark.parametrize("device", ["amd-mi250x", "AMD Instinct MI250X", "amd-mi300x", "AMD Instinct MI300X"])
def test_a_chip_the_bundle_has_no_table_of_is_answered_within_its_own_limits_by_id_or_by_name(limits_only, device):
    """No table of an AMD chip: the default answer is one of the kernel's legal configs on that chip (64-lane SIMD
    groups: TG // ROWS a multiple of 64), named by its id or as people write it; a name used to be checked against
    Apple's limits (32-lane groups) and was answered with configs the chip cannot run."""
    from zmlx_pipeline.kernels.registry import get_kernel
    from zmlx_pipeline.kernels.spec import Limits
    from zmlx_pipeline.runtime.device import catalog_row

    load_bundle(limits_only, strict=True)
    limits = Limits.from_device_row(catalog_row(device))
    assert limits.simd_width == 64
    spec = get_kernel("rmsnorm")
    p = predicted_config("rmsnorm", SHAPE, "float16", device=device)
    assert p.evidence == "default" and p.config is not None
    assert all(spec.violations(config, SHAPE, "float16", limits) == [] for config in p.candidates)
    narrow = {"rows": 4096, "cols": 32}  # 32 columns: one 32-lane group of VEC 1 on Apple, nothing on 64 lanes
    assert not spec.legal_configs(narrow, "float16", limits)
    q = predicted_config("rmsnorm", narrow, "float16", device=device)
    assert (q.config, q.evidence) == (None, "none") and "(TG // ROWS) % simd_width == 0" in q.note
