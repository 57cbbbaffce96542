"""Our autotune cache beside ZMLX's, in one file: real ZMLX load/save code, only its chip detection faked.

ZMLX (the `zmlx` package of the test extra) keeps its tuned launches in the same
`~/.cache/zmlx/autotune_v3.json`: its save rewrites its device's section from what it holds in
memory (trimming values to `tg` and `template`), its load reads that section only. Both orders
are driven here in one process, with HOME in tmp_path (the `isolated_home` fixture).
"""

import json
import math

import mlx.core as mx
import pytest

from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.runtime import cache, tune
from zmlx_pipeline.runtime.tuner import forget_refusals

M3_MAX = "apple-m3-max-40c"
SHAPE = {"rows": 3000, "cols": 2048}


class FakeMeasure:
    """Times from a formula (best: TG 256, VEC 4, ROWS 1), recording what it was asked to time."""

    def __init__(self):
        self.calls = []

    def __call__(self, spec, config, shape, dtype):
        self.calls.append(dict(config))
        return "ok", 10 * (1 + abs(math.log2(config["TG"]) - 8) + 0.3 * abs(math.log2(config["VEC"]) - 2)
                           + 0.1 * config["ROWS"])


def pretend_chip(monkeypatch, zmlx, family: str, variant: str, cores: int) -> None:
    """Make ZMLX's detection report an Apple chip (everything else in ZMLX runs as shipped)."""
    zdev, zdp = zmlx.device, zmlx.device_profile
    profile = zdev.DeviceProfile(family=family, variant=variant, gpu_cores=cores, max_threadgroup_size=1024,
                                 simd_width=32, has_ray_tracing=family in ("M3", "M4"), memory_gb=64)
    monkeypatch.setattr(zdev, "detect_device", lambda: profile)
    zdp.get_current_device_profile.cache_clear()


@pytest.fixture
def zmlx_on_m3_max(monkeypatch, isolated_home, zmlx):
    """(ZMLX's autotune module, the cache path both use) with ZMLX on a pretended M3 Max and nothing in memory."""
    monkeypatch.delenv("ZMLX_CACHE_DIR", raising=False)
    pretend_chip(monkeypatch, zmlx, "M3", "Max", 40)
    zmlx.autotune.GLOBAL_AUTOTUNE_CACHE.clear()
    zmlx.autotune._FAST_CACHE.clear()
    return zmlx.autotune, isolated_home / ".cache" / "zmlx" / "autotune_v3.json"


def our_tune(shape=SHAPE, measure=None):
    return tune("rmsnorm", shape, "float16", device=M3_MAX, measure=measure or FakeMeasure())


def zmlx_entry(zat) -> tuple:
    """One launch ZMLX tuned itself, with ZMLX's own key and config types."""
    key = zat.AutotuneKey(kernel_name="zmlx_softmax", input_shapes=((8, 4096),), input_dtypes=("mlx.core.float16",),
                          grid=(256, 8, 1), template_params=(("tuning", "templates"),))
    return key, zat.AutotuneConfig(threadgroup=(256, 1, 1), template=(("N_READS", 4),))


def test_on_apple_chips_our_section_is_zmlxs_section(zmlx_on_m3_max, monkeypatch, zmlx):
    zat, _ = zmlx_on_m3_max
    assert cache.device_key(M3_MAX, mx.__version__) == zat._device_cache_key() == f"M3_Max_{mx.__version__}"
    for device_id, (family, variant) in {"apple-m3-max-30c": ("M3", "Max"), "apple-m2-8c": ("M2", ""),
                                         "apple-m1-ultra-64c": ("M1", "Ultra"), "apple-m4-pro-20c": ("M4", "Pro")}.items():
        pretend_chip(monkeypatch, zmlx, family, variant, 8)
        assert cache.device_key(device_id, "0.30.0").replace("0.30.0", mx.__version__) == zat._device_cache_key()
    assert cache.device_key("nvidia-h200", "0.32.4") == "nvidia-h200_0.32.4"  # ZMLX has no name for it


def test_ours_first_then_zmlx_loads_and_rewrites_and_we_still_find_our_winner(zmlx_on_m3_max):
    zat, path = zmlx_on_m3_max
    first = our_tune()
    assert first.source == "timed"
    dkey = zat._device_cache_key()
    (key,) = json.loads(path.read_text())["devices"][dkey]["entries"]

    # ZMLX's loader reads our winner: its threadgroup, and every config parameter as a template pair
    assert zat.load_autotune_cache() == 1
    ((zkey, zconfig),) = zat.GLOBAL_AUTOTUNE_CACHE.items()
    launch = get_kernel("rmsnorm").launch(first.config, SHAPE)
    assert zkey.kernel_name == "rmsnorm" and zkey.input_shapes == ((3000, 2048),)
    assert zconfig.threadgroup == tuple(launch.threadgroup)
    assert {k: v for k, v in zconfig.template if k != "T"} == first.config

    # ZMLX's save rewrites the section: same key text, the value trimmed to its own fields
    zat.save_autotune_cache()
    section = json.loads(path.read_text())["devices"][dkey]
    assert list(section["entries"]) == [key]
    assert set(section["entries"][key]) == {"tg", "template"}

    forget_refusals()
    again = FakeMeasure()
    hit = our_tune(measure=again)
    assert (hit.source, hit.config, again.calls) == ("cache", first.config, [])

    # with our own copy gone too, the config is recovered from what ZMLX kept
    data = json.loads(path.read_text())
    del data[cache.OWN_SECTION]
    path.write_text(json.dumps(data))
    again = FakeMeasure()
    hit = our_tune(measure=again)
    assert (hit.source, hit.config, hit.median_us, again.calls) == ("cache", first.config, None, [])


def test_zmlx_first_then_ours_keeps_zmlxs_entries_and_zmlx_reads_both(zmlx_on_m3_max):
    zat, path = zmlx_on_m3_max
    zkey, zconfig = zmlx_entry(zat)
    zat.GLOBAL_AUTOTUNE_CACHE[zkey] = zconfig
    zat.save_autotune_cache()
    before = json.loads(path.read_text())["devices"][zat._device_cache_key()]["entries"]

    ours = our_tune()
    after = json.loads(path.read_text())["devices"][zat._device_cache_key()]["entries"]
    assert len(after) == 2 and all(after[k] == v for k, v in before.items())  # ZMLX's entry, byte for byte

    zat.GLOBAL_AUTOTUNE_CACHE.clear()
    assert zat.load_autotune_cache() == 2
    assert zat.GLOBAL_AUTOTUNE_CACHE[zkey] == zconfig
    (mine,) = [c for k, c in zat.GLOBAL_AUTOTUNE_CACHE.items() if k.kernel_name == "rmsnorm"]
    assert mine.threadgroup[0] == ours.config["TG"]


def test_a_zmlx_save_that_never_loaded_our_entry_loses_nothing(zmlx_on_m3_max):
    """ZMLX loaded before our winner was written, then saved: its section lacks our entry, our copy does not;
    our next write puts the entry back, where ZMLX's next load reads it."""
    zat, path = zmlx_on_m3_max
    zkey, zconfig = zmlx_entry(zat)
    assert zat.load_autotune_cache() == 0
    zat.GLOBAL_AUTOTUNE_CACHE[zkey] = zconfig
    first = our_tune()
    zat.save_autotune_cache()
    dkey = zat._device_cache_key()
    assert [json.loads(k)["name"] for k in json.loads(path.read_text())["devices"][dkey]["entries"]] == ["zmlx_softmax"]

    again = FakeMeasure()
    assert our_tune(measure=again).config == first.config and again.calls == []
    our_tune(shape={"rows": 64, "cols": 4096})  # any later write of ours
    names = sorted(json.loads(k)["name"] for k in json.loads(path.read_text())["devices"][dkey]["entries"])
    assert names == ["rmsnorm", "rmsnorm", "zmlx_softmax"]
    zat.GLOBAL_AUTOTUNE_CACHE.clear()
    assert zat.load_autotune_cache() == 3


def test_refused_launches_survive_a_zmlx_save(zmlx_on_m3_max):
    zat, _ = zmlx_on_m3_max
    dkey = zat._device_cache_key()
    cache.save_refusal(dkey, "rmsnorm", {"TG": 1024, "VEC": 4, "ROWS": 1}, "over the pipeline's limit of 896")
    zkey, zconfig = zmlx_entry(zat)
    zat.GLOBAL_AUTOTUNE_CACHE[zkey] = zconfig
    zat.save_autotune_cache()
    (refused,) = cache.load_refusals(dkey)
    assert refused["config"] == {"TG": 1024, "VEC": 4, "ROWS": 1} and "896" in refused["error"]


def test_config_of_reads_what_zmlx_keeps():
    value = cache.entry_value({"TG": 256, "VEC": 4, "ROWS": 1}, "float16", (256, 1, 1), median_us=3.0)
    trimmed = {"tg": value["tg"], "template": value["template"]}
    assert cache.config_of(trimmed, ("TG", "VEC", "ROWS")) == {"TG": 256, "VEC": 4, "ROWS": 1}
    assert cache.config_of(trimmed, ("TG", "VEC", "ROWS", "CACHE")) is None  # not this kernel's parameters
    assert cache.config_of({"tg": [64, 1, 1], "template": []}) is None


def test_with_zmlxs_own_detection_on_an_m3_max_both_share_its_section(monkeypatch, isolated_home, zmlx):
    """ZMLX's detection run as shipped, only the OS answers faked: for "Apple M3 Max" it reports the base M3
    (the first name of its table found in the brand string), so its section is `M3_<mlx>`; ours reach it too."""
    import platform

    monkeypatch.delenv("ZMLX_CACHE_DIR", raising=False)
    monkeypatch.setattr(platform, "system", lambda: "Darwin")
    monkeypatch.setattr(platform, "machine", lambda: "arm64")
    monkeypatch.setattr(zmlx.device, "_sysctl", lambda key: {"machdep.cpu.brand_string": "Apple M3 Max",
                                                             "hw.memsize": str(64 << 30)}.get(key, ""))
    zmlx.device.detect_device.cache_clear()
    zmlx.device_profile.get_current_device_profile.cache_clear()
    zat = zmlx.autotune
    zat.GLOBAL_AUTOTUNE_CACHE.clear()
    try:
        zkey = zat._device_cache_key()
        assert zkey == f"M3_{mx.__version__}"
        assert cache.device_keys(M3_MAX, mx.__version__) == (f"M3_Max_{mx.__version__}", zkey)

        first = our_tune()
        assert zat.load_autotune_cache() == 1
        ((_, zconfig),) = zat.GLOBAL_AUTOTUNE_CACHE.items()
        assert {k: v for k, v in zconfig.template if k != "T"} == first.config
        zat.save_autotune_cache()

        # only what ZMLX rewrote is left: its own section, trimmed to tg and template
        path = isolated_home / ".cache" / "zmlx" / "autotune_v3.json"
        data = json.loads(path.read_text())
        data = {"schema_version": "3.0", "devices": {zkey: data["devices"][zkey]}}
        path.write_text(json.dumps(data))
        again = FakeMeasure()
        hit = our_tune(measure=again)
        assert (hit.source, hit.config, again.calls) == ("cache", first.config, [])
    finally:
        zat.GLOBAL_AUTOTUNE_CACHE.clear()
        zmlx.device.detect_device.cache_clear()
        zmlx.device_profile.get_current_device_profile.cache_clear()
