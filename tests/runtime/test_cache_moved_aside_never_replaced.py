"""An unusable autotune cache file is moved aside under a name no other file has: two moved aside in the same second
both stay, and a file already there under that name is never replaced; the warning names the file each went to."""

import pytest

from zmlx_pipeline.runtime import cache

NOW = 1795828927


def _aside(directory):
    return {p.name: p.read_text() for p in sorted(directory.iterdir()) if ".corrupt-" in p.name}


def test_two_unusable_files_moved_aside_in_one_second_both_stay(tmp_path, monkeypatch):
    monkeypatch.setattr(cache.time, "time", lambda: NOW + 0.5)  # both writes in the same second
    path = tmp_path / "c.json"
    names = []
    for text, key in (('{"A": ', "k1"), ('{"B": ', "k2")):
        path.write_text(text)
        with pytest.warns(UserWarning, match=r"could not be used as the autotune cache .*; moved aside to ") as caught:
            cache.save_entries("d", {key: {"tg": [1, 1, 1], "template": []}}, None, path)
        (warning,) = [str(w.message) for w in caught]
        names.append(warning.rsplit("moved aside to ", 1)[1])
    assert names == [f"c.json.corrupt-{NOW}", f"c.json.corrupt-{NOW}-2"]
    assert _aside(tmp_path) == {names[0]: '{"A": ', names[1]: '{"B": '}
    assert set(cache.load_entries("d", path)) == {"k2"}  # the second write started from an empty cache


def test_a_file_already_named_like_the_aside_is_not_replaced(tmp_path, monkeypatch):
    monkeypatch.setattr(cache.time, "time", lambda: float(NOW))
    (tmp_path / f"c.json.corrupt-{NOW}").write_text("mine")
    (tmp_path / "c.json").write_text("[1, 2")
    with pytest.warns(UserWarning, match=rf"moved aside to c\.json\.corrupt-{NOW}-2$"):
        cache.save_entries("d", {"k": {"tg": [1, 1, 1], "template": []}}, None, tmp_path / "c.json")
    assert _aside(tmp_path) == {f"c.json.corrupt-{NOW}": "mine", f"c.json.corrupt-{NOW}-2": "[1, 2"}
