"""Current-device detection from explicit device_info dicts (no GPU needed)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from zmlx_pipeline.data import detect
from zmlx_pipeline.data.detect import (
    apple_gpu_core_count,
    cuda_sm_count,
    detect_backend,
    detect_device,
    parse_ioreg,
    parse_sysctl_brand,
    slug,
)

# What real Macs reported, each with where it was published (see the file's comments).
MACS = tomllib.loads((Path(__file__).parent / "fixtures" / "apple_macs.toml").read_text(encoding="utf-8"))["mac"]


def test_h200_on_cuda_is_the_catalog_row():
    found = detect_device({"device_name": "NVIDIA H200", "architecture": "sm_90"}, backend="cuda", gpu_cores=132)
    assert found.device_id == "nvidia-h200" and found.known and not found.core_limited
    assert found.spec.memory_bandwidth_gbps == 4800 and found.gpu_cores == 132
    assert found.row["id"] == "nvidia-h200" and found.row["in_catalog"] is True and found.row["flagged_unknown"] is False


def test_mps_limited_run_is_recorded_as_its_own_device():
    found = detect_device({"device_name": "NVIDIA H100 80GB HBM3", "architecture": "sm_90"}, backend="cuda", gpu_cores=66)
    assert found.core_limited and found.known
    assert found.device_id == "nvidia-h100-sxm@66sm"
    assert found.spec.name == "NVIDIA H100 80GB HBM3 [66 SMs]"
    assert found.row["gpu_cores"] == 66 and found.row["core_limited_from"] == "nvidia-h100-sxm"


@pytest.mark.parametrize("cores, device_id, bandwidth", [(30, "apple-m3-max-30c", 300), (40, "apple-m3-max-40c", 400)])
def test_m3_max_binned_variant_from_core_count(cores, device_id, bandwidth):
    info = {"device_name": "Apple M3 Max", "architecture": "applegpu_g15s"}
    found = detect_device(info, backend="metal", gpu_cores=cores)
    assert found.device_id == device_id and found.spec.memory_bandwidth_gbps == bandwidth
    assert found.architecture == "applegpu_g15s" and found.info == info and not found.core_limited


def test_plain_m3_is_not_mistaken_for_a_bigger_chip():
    found = detect_device({"device_name": "Apple M3", "architecture": "applegpu_g15g"}, backend="metal", gpu_cores=10)
    assert found.device_id == "apple-m3-10c" and found.spec.memory_bandwidth_gbps == 100


def test_impossible_apple_core_count_is_unknown_not_a_neighbour():
    found = detect_device({"device_name": "Apple M3 Max", "architecture": "applegpu_g15s"}, backend="metal", gpu_cores=36)
    assert not found.known and found.spec is None and found.device_id == "unknown-apple-m3-max"


def test_kernel_tuner_style_name_on_cuda():
    found = detect_device({"device_name": "A100-PCIE-40GB", "architecture": "sm_80"}, backend="cuda", gpu_cores=108)
    assert found.device_id == "nvidia-a100-pcie-40gb" and not found.core_limited


@pytest.mark.parametrize("cores, device_id", [(132, "nvidia-h800-sxm"), (114, "nvidia-h800-pcie")])
def test_a_name_of_two_chips_is_told_apart_by_the_full_sm_count(cores, device_id):
    """The driver names the H800 SXM5 "NVIDIA H800"; as an alias it would fit the PCIe card too."""
    found = detect_device({"device_name": "NVIDIA H800", "architecture": "sm_90"}, backend="cuda", gpu_cores=cores)
    assert found.known and found.device_id == device_id and not found.core_limited


@pytest.mark.parametrize("name, cores", [("NVIDIA H800", 66), ("NVIDIA H800", None), ("NVIDIA A100", 108)])
def test_a_name_of_two_chips_stays_unknown_when_the_sm_count_does_not_tell(name, cores):
    """66 SMs is an MPS limit of either H800; every A100 has 108 SMs."""
    found = detect_device({"device_name": name, "architecture": "sm_90"}, backend="cuda", gpu_cores=cores)
    assert not found.known and found.spec is None and found.device_id.startswith("unknown-")


@pytest.mark.parametrize("name, cores, device_id", [
    ("NVIDIA GeForce GTX 1050", 5, "nvidia-gtx-1050"),
    ("NVIDIA GeForce GTX 1050", 6, "nvidia-gtx-1050-3gb"),  # the driver leaves out the 3GB board's memory
    ("NVIDIA GeForce GTX 1060", 9, "nvidia-gtx-1060-3gb"),
    ("NVIDIA GeForce GTX 1060", 10, "nvidia-gtx-1060-6gb"),
])
def test_a_board_named_without_its_memory_is_told_by_its_sm_count(name, cores, device_id):
    found = detect_device({"device_name": name, "architecture": "sm_61"}, backend="cuda", gpu_cores=cores)
    assert (found.device_id, found.known, found.core_limited) == (device_id, True, False)


def test_more_sms_than_the_named_chip_has_is_no_match_to_it():
    """A count above the one row's full chip is another chip: never filed as that row (a count below is a limit)."""
    found = detect_device({"device_name": "NVIDIA H200", "architecture": "sm_90"}, backend="cuda", gpu_cores=140)
    assert (found.known, found.spec) == (False, None)


def test_unknown_gpu_is_flagged_and_not_mapped():
    found = detect_device({"device_name": "NVIDIA Future GPU 9000", "architecture": "sm_120"}, backend="cuda", gpu_cores=200)
    assert not found.known and found.spec is None
    assert found.device_id == "unknown-nvidia-future-gpu-9000"
    assert found.row == {
        "device_id": "unknown-nvidia-future-gpu-9000",
        "reported_name": "NVIDIA Future GPU 9000",
        "reported": {"device_name": "NVIDIA Future GPU 9000", "architecture": "sm_120"},
        "id": "unknown-nvidia-future-gpu-9000",
        "name": "NVIDIA Future GPU 9000",
        "backend": "cuda",
        "architecture": "sm_120",
        "gpu_cores": 200,
        "in_catalog": False,
        "flagged_unknown": True,
    }


def test_cpu_backend_is_the_cpu():
    found = detect_device({"device_name": "Intel(R) Xeon(R) Processor", "architecture": "x86_64"}, backend="cpu")
    assert found.device_id == "cpu-intel-r-xeon-r-processor"
    assert found.backend == "cpu" and not found.known and found.spec is None and found.gpu_cores is None


def test_gpu_cores_default_comes_from_the_backend_probe(monkeypatch):
    monkeypatch.setattr(detect, "cuda_sm_count", lambda: 100)
    found = detect_device({"device_name": "NVIDIA A100-SXM4-80GB"}, backend="cuda")
    assert found.core_limited and found.device_id == "nvidia-a100-sxm4-80gb@100sm"
    monkeypatch.setattr(detect, "apple_gpu_core_count", lambda: 32)
    assert detect_device({"device_name": "Apple M4 Max"}, backend="metal").device_id == "apple-m4-max-32c"


def test_metal_without_a_core_count_picks_the_full_chip(monkeypatch):
    monkeypatch.setattr(detect, "apple_gpu_core_count", lambda: None)
    assert detect_device({"device_name": "Apple M4 Max"}, backend="metal").device_id == "apple-m4-max-40c"


def test_probes_fail_softly_here():
    if sys.platform != "darwin":
        assert apple_gpu_core_count() is None
    count = cuda_sm_count()
    assert count is None or count > 0


def test_detect_backend_and_default_info_on_this_machine():
    backend = detect_backend()
    assert backend in ("metal", "cuda", "cpu")
    found = detect_device()
    assert found.backend == backend and "device_name" in found.info


def test_ioreg_output_is_parsed(monkeypatch):
    monkeypatch.setattr(detect.sys, "platform", "darwin")
    sample = '+-o AGXAcceleratorG15X  <class AGXAccelerator>\n    "gpu-core-count" = 30\n'
    monkeypatch.setattr(detect.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, sample, ""))
    assert apple_gpu_core_count() == 30
    monkeypatch.setattr(detect.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "nothing", ""))
    assert apple_gpu_core_count() is None


def test_slug():
    assert slug("NVIDIA Future GPU 9000") == "nvidia-future-gpu-9000"
    assert slug("  ") == "unnamed"


def test_importing_detect_does_not_import_mlx(subprocess_env):
    code = "import sys, zmlx_pipeline.data.detect; print('mlx.core' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("mac", MACS, ids=[m["label"] for m in MACS])
def test_recorded_mac_maps_to_its_catalog_row(mac, monkeypatch):
    # nothing of the machine running the test may leak in: the record's texts are all there is
    monkeypatch.setattr(detect, "apple_gpu_core_count", lambda: pytest.fail("probed this machine's ioreg"))
    monkeypatch.setattr(detect, "apple_chip_name", lambda: pytest.fail("probed this machine's sysctl"))
    found = detect_device(dict(mac.get("device_info", {})), backend="metal", gpu_cores=mac.get("gpu_cores"),
                          ioreg=mac.get("ioreg", ""), chip_name=parse_sysctl_brand(mac.get("sysctl")))
    if mac["expect"] == "unknown":
        assert not found.known and found.spec is None and found.device_id.startswith("unknown-")
        assert found.row["flagged_unknown"] is True and found.row["in_catalog"] is False
    else:
        assert found.known and found.device_id == mac["expect"]
        assert found.spec.gpu_arch.startswith("applegpu_g")
        reported = mac.get("device_info", {}).get("architecture")
        if reported:  # the row's generation is the one the Mac reported
            assert found.spec.gpu_arch[:12] == reported[:12]


def test_the_fixtures_cover_every_apple_generation_and_binned_variants():
    expected = {m["expect"] for m in MACS}
    assert {f"m{g}" for g in range(1, 6)} <= {e.split("-")[1] for e in expected if e != "unknown"}
    assert {"apple-m3-pro-14c", "apple-m3-max-30c", "apple-m2-max-30c"} <= expected  # binned
    assert "unknown" in expected


def test_future_generation_gets_an_id_from_what_it_reported():
    found = detect_device({"architecture": "applegpu_g18s"}, backend="metal", gpu_cores=40, ioreg="")
    assert found.device_id == "unknown-applegpu-g18s" and found.architecture == "applegpu_g18s"
    named = detect_device({"device_name": "Apple M6 Max", "architecture": "applegpu_g18s"}, backend="metal",
                          gpu_cores=40, ioreg="")
    assert named.device_id == "unknown-apple-m6-max" and named.gpu_cores == 40


def test_ioreg_gives_name_and_cores_when_mlx_names_no_device():
    text = next(m["ioreg"] for m in MACS if m["label"].startswith("M3 Pro 14-core"))
    found = detect_device({"architecture": "applegpu_g15s"}, backend="metal", ioreg=text)
    assert found.device_id == "apple-m3-pro-14c" and found.reported_name == "Apple M3 Pro" and found.gpu_cores == 14


def test_parse_ioreg_reads_cores_and_model():
    text = next(m["ioreg"] for m in MACS if m["label"].startswith("M4 10-core"))
    assert parse_ioreg(text) == detect.IoregGpu(gpu_cores=10, model="Apple M4")
    assert parse_ioreg("") == detect.IoregGpu(gpu_cores=None, model=None)
    assert parse_ioreg(None).gpu_cores is None


@pytest.mark.parametrize("text, brand", [
    ("Apple M3 Max\n", "Apple M3 Max"),
    ("machdep.cpu.brand_string: Apple M1 Pro\n", "Apple M1 Pro"),
    ("machdep.cpu.core_count: 8\nmachdep.cpu.brand_string: Apple M1 \nmachdep.cpu.thread_count: 8\n", "Apple M1"),
    ("", None),
    (None, None),
])
def test_parse_sysctl_brand(text, brand):
    assert parse_sysctl_brand(text) == brand


def test_probes_run_the_commands_thinly(monkeypatch):
    calls = []

    def run(args, **kwargs):
        calls.append(args)
        out = '"model" = "Apple M4 Max"\n"gpu-core-count" = 32\n' if args[0] == "ioreg" else "Apple M4 Max\n"
        return subprocess.CompletedProcess(args, 0, out, "")

    monkeypatch.setattr(detect.sys, "platform", "darwin")
    monkeypatch.setattr(detect.subprocess, "run", run)
    assert detect.apple_gpu_core_count() == 32 and detect.apple_chip_name() == "Apple M4 Max"
    found = detect_device({"architecture": "applegpu_g16s"}, backend="metal")
    assert found.device_id == "apple-m4-max-32c" and found.reported_name == "Apple M4 Max"
    assert [c[0] for c in calls] == ["ioreg", "sysctl", "ioreg", "sysctl"]
    monkeypatch.setattr(detect.sys, "platform", "linux")
    assert detect.apple_chip_name() is None and detect.ioreg_text() is None
