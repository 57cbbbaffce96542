"""`zmlx_pipeline.runtime` as a drop-in for `zmlx.device_profile`: every name, field and method, checked
against the real `zmlx` package, and code written for ZMLX run unchanged on ours."""

import dataclasses
import importlib
import inspect
import textwrap

import pytest

import zmlx_pipeline.runtime as runtime
from zmlx_pipeline.runtime import profiles


def _compatible(theirs, ours) -> list[str]:
    """Why a call written against `theirs` could fail on `ours` (empty when it cannot)."""
    a, b = inspect.signature(theirs).parameters, inspect.signature(ours).parameters
    problems = []
    for i, (name, p) in enumerate(a.items()):
        q = b.get(name)
        if q is None:
            problems.append(f"no parameter {name}")
        elif list(b).index(name) != i or q.kind != p.kind:
            problems.append(f"{name} at another place or of another kind")
        elif q.default is inspect.Parameter.empty and p.default is not inspect.Parameter.empty:
            problems.append(f"{name} is optional there, required here")
    problems += [f"{n} is required here only" for n, q in b.items()
                 if n not in a and q.default is inspect.Parameter.empty
                 and q.kind not in (q.VAR_POSITIONAL, q.VAR_KEYWORD)]
    return problems


@pytest.mark.parametrize("module", [runtime, profiles], ids=["runtime", "runtime.profiles"])
def test_every_public_name_of_zmlx_device_profile_is_here_with_a_compatible_signature(module, zmlx):
    zdp = zmlx.device_profile
    for name in zdp.__all__:
        assert hasattr(module, name), name
        theirs, ours = getattr(zdp, name), getattr(module, name)
        if inspect.isfunction(inspect.unwrap(theirs)):
            assert not _compatible(theirs, ours), (name, _compatible(theirs, ours))
            # ZMLX's function attributes (get_current_device_profile.cache_clear, ...) too
            for attr in (a for a in dir(theirs) if not a.startswith("_")):
                assert hasattr(ours, attr), f"{name}.{attr}"
        elif isinstance(theirs, list):
            assert isinstance(ours, list) and len(ours) == len(theirs)


def test_the_profile_class_has_every_field_and_method_of_zmlxs(zmlx):
    theirs, ours = zmlx.device_profile.DeviceTuningProfile, runtime.DeviceTuningProfile
    assert dataclasses.is_dataclass(ours) and ours.__dataclass_params__.frozen
    their_fields = [f.name for f in dataclasses.fields(theirs)]
    assert [f.name for f in dataclasses.fields(ours)][: len(their_fields)] == their_fields  # same positional order
    assert not _compatible(theirs, ours)
    for attr in (a for a in dir(theirs) if not a.startswith("_")):
        assert hasattr(ours, attr), attr
        mine = inspect.getattr_static(ours, attr)
        theirs_attr = inspect.getattr_static(theirs, attr)
        assert type(mine) is type(theirs_attr) or not callable(theirs_attr), attr  # property stays a property
        if inspect.isfunction(theirs_attr):
            assert not _compatible(theirs_attr, mine), attr


SNIPPET = textwrap.dedent("""
    import dataclasses
    from {module} import (ALL_DEVICE_PROFILES, DeviceTuningProfile, get_current_device_profile,
                          get_device_profile, get_threadgroup_candidates_for_shape)

    profile = get_device_profile("M3", "Max")
    assert isinstance(profile, DeviceTuningProfile)
    summary = {{"chip": profile.chip_id, "name": profile.full_name, "high_end": profile.is_high_end(),
               "cores": profile.gpu_cores, "bandwidth": profile.memory_bandwidth_gbps}}
    tgs = {{kind: get_threadgroup_candidates_for_shape(profile, 4096, kind) for kind in ("general", "reduction", "simd")}}
    assert all(c % 32 == 0 for c in tgs["simd"])
    assert all(c <= 1024 for kind in tgs for c in tgs[kind]) and tgs["general"]
    tuned = dataclasses.replace(profile, default_threadgroup=512, threadgroup_candidates=(256, 512))
    assert tuned.default_threadgroup == 512 and tuned != profile
    try:
        profile.default_threadgroup = 64
        raise SystemExit("a profile must be read-only")
    except dataclasses.FrozenInstanceError:
        pass
    by_chip = {{p.chip_id: p for p in ALL_DEVICE_PROFILES}}
    assert len(by_chip) == 16 and by_chip["M3_Max"].gpu_cores == profile.gpu_cores
    base = get_device_profile("M2")
    assert base.chip_id == "M2" and not base.is_high_end()
    mine = DeviceTuningProfile(family="M9", variant="", gpu_cores=12, memory_bandwidth_gbps=200, default_threadgroup=256)
    assert mine.threadgroup_candidates == (128, 256) and get_threadgroup_candidates_for_shape(mine, 1024)
    current = get_current_device_profile()
    get_current_device_profile.cache_clear()
    assert get_current_device_profile() == current
    fields = dataclasses.asdict(profile)
    result = (summary, tgs, sorted(by_chip), fields["default_threadgroup"])
""")


@pytest.mark.parametrize("module", ["zmlx.device_profile", "zmlx_pipeline.runtime"])
def test_code_written_for_zmlx_runs_unchanged_on_ours(module, zmlx):
    scope: dict = {}
    exec(SNIPPET.format(module=module), scope)
    summary, tgs, chips, default_tg = scope["result"]
    assert summary["chip"] == "M3_Max" and summary["cores"] == 40 and summary["high_end"]
    assert chips == sorted(p.chip_id for p in zmlx.device_profile.ALL_DEVICE_PROFILES)


def test_all_device_profiles_follow_the_loaded_bundle(toy_bundle):
    before = runtime.ALL_DEVICE_PROFILES
    runtime.load_bundle(toy_bundle[1], strict=True)
    after = importlib.import_module("zmlx_pipeline.runtime").ALL_DEVICE_PROFILES
    assert [p.chip_id for p in before] == [p.chip_id for p in after]
    assert "ALL_DEVICE_PROFILES" not in vars(runtime)  # worked out on access, never frozen
    m3 = next(p for p in after if p.chip_id == "M3_Max")
    assert m3.learned["classes"].get("toy_scale")  # the toy bundle's learned tables answer
