"""Lookups while another thread loads a different bundle: every answer comes wholly from one bundle, and the
answers after the last load are that bundle's."""

import random
import threading
import time
import warnings

from bundle_fixtures import latest_dir

import zmlx_pipeline.runtime.lookup as lookup
from zmlx_pipeline.runtime import get_current_device_profile, load_bundle, predicted_config
import zmlx_pipeline.runtime.profiles as profiles
from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR, _activate, read_bundle

DEVICES = ("nvidia-h200", "nvidia-h100-sxm", "nvidia-h200@66sm", "apple-m3-max-40c")


def _cases(n: int) -> list[tuple]:
    r = random.Random(1)
    return [("rmsnorm", {"rows": 2 ** r.randint(0, 14), "cols": 2 ** r.randint(4, 14)},
             r.choice(["float16", "float32"]), r.choice(DEVICES)) for _ in range(n)]


def _answer(case: tuple) -> tuple:
    p = predicted_config(*case[:3], device=case[3])
    return p.bundle_id, p.config, p.evidence, p.predicted_us, p.expected_regret, p.note


def _reference(paths: list[str], cases: list[tuple]) -> dict:
    """(bundle id, case index) -> the answer of that bundle, each bundle asked alone."""
    ref = {}
    for path in paths:
        load_bundle(path, strict=True)
        for i, case in enumerate(cases):
            a = _answer(case)
            ref[(a[0], i)] = a
    return ref


def test_lookups_in_threads_answer_from_one_whole_bundle_while_another_thread_switches_bundles(real_bundle):
    warnings.simplefilter("ignore")
    paths = [str(DEFAULT_BUNDLE_DIR), str(latest_dir(real_bundle[1]))]
    cases = _cases(200)
    ref = _reference(paths, cases)
    assert len({bundle for bundle, _ in ref}) == 2
    wrong, raised, stop = [], [], threading.Event()

    def ask(seed: int) -> None:
        rr = random.Random(seed)
        while not stop.is_set():
            i = rr.randrange(len(cases))
            try:
                a = _answer(cases[i])
            except Exception as exc:  # noqa: BLE001 (any exception is the failure looked for)
                raised.append(repr(exc))
            else:
                if ref.get((a[0], i)) != a:
                    wrong.append((cases[i], a))

    threads = [threading.Thread(target=ask, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    try:
        for n in range(6):
            time.sleep(0.05)
            load_bundle(paths[n % 2], strict=True)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not raised, raised[:3]
    assert not wrong, wrong[:2]
    last = paths[1]
    for i, case in enumerate(cases):  # one thread, after the last load: that bundle's answers alone
        a = _answer(case)
        assert ref[(a[0], i)] == a and a == ref[(a[0], i)]
    assert {_answer(case)[0] for case in cases} == {load_bundle(last, strict=True).bundle_id}


def test_a_lookup_under_way_when_another_bundle_is_loaded_leaves_nothing_of_its_bundle_behind(real_bundle,
                                                                                             monkeypatch):
    # the race made deterministic: a bundle is loaded in the middle of resolving an answer from another
    warnings.simplefilter("ignore")
    paths = [str(DEFAULT_BUNDLE_DIR), str(latest_dir(real_bundle[1]))]
    cases = [("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", "nvidia-h200"),
             ("rmsnorm", {"rows": 64, "cols": 1024}, "float16", "nvidia-h200")]
    ref = _reference(paths, cases)
    old = load_bundle(paths[0], strict=True)
    first = _answer(cases[0])
    assert first[0] == old.bundle_id
    new = read_bundle(paths[1])
    check = lookup._check_known_device
    switched = []

    def check_and_switch(*args, **kwargs):
        check(*args, **kwargs)
        if not switched:  # after the kernel is read, before the device's tables are: load_bundle's last step
            switched.append(True)
            _activate(new)

    monkeypatch.setattr(lookup, "_check_known_device", check_and_switch)
    during = _answer(cases[1])
    assert switched and during == ref[(old.bundle_id, 1)]  # begun under the old bundle: wholly its answer
    assert lookup.active_bundle() is new
    for i, case in enumerate(cases):  # every later answer is the new bundle's, none remembered from the old one
        assert _answer(case) == ref[(new.bundle_id, i)]


def test_a_device_profile_worked_out_from_one_bundle_is_not_kept_once_another_is_loaded(real_bundle, monkeypatch):
    monkeypatch.setenv("ZMLX_PIPELINE_DEVICE", "nvidia-h200")
    real, default = read_bundle(latest_dir(real_bundle[1])), read_bundle(DEFAULT_BUNDLE_DIR)
    _activate(default)
    of_default = profiles.profile_for_device("nvidia-h200")
    _activate(real)
    of_real = profiles.profile_for_device("nvidia-h200")
    assert of_real != of_default
    work_out = profiles.profile_for_device

    def then_switch(device):  # another thread loads the default bundle as this profile is worked out
        profile = work_out(device)
        _activate(default)
        return profile

    monkeypatch.setattr(profiles, "profile_for_device", then_switch)
    assert get_current_device_profile() == of_real
    monkeypatch.setattr(profiles, "profile_for_device", work_out)
    assert get_current_device_profile() == of_default
