"""A path or URL the user gave is shown escaped in the runtime's messages when it holds a control character (a newline,
an ANSI escape), as the CLI's messages show it: every message stays one line and sends no control character to a
terminal. An ordinary path is shown as it is."""

import json
import warnings

import pytest

import zmlx_pipeline.runtime as rt
from zmlx_pipeline.core.files import printable
from zmlx_pipeline.runtime.errors import plain


def _one_printable_line(text: str) -> str:
    assert text.isprintable(), repr(text)  # no newline, no ESC, no other control character
    return text


def test_plain_escapes_only_the_control_characters_of_a_text_as_the_cli_does():
    assert plain("r3/x\nY") == "r3/x\\nY"
    assert plain("r3/esc\x1b[2Jdir") == "r3/esc\\x1b[2Jdir"
    assert plain("bundles/2026 v1/é") == "bundles/2026 v1/é"
    assert plain(plain("a\tb")) == plain("a\tb")  # escaping twice changes nothing
    assert plain("x\u202ey\u2028z") == printable("x\u202ey\u2028z") == "x\\u202ey\\u2028z"


@pytest.mark.parametrize("path, shown", [("r3/x\nY", "r3/x\\nY"), ("r3/esc\x1b[2Jdir", "r3/esc\\x1b[2Jdir"),
                                         ("no/such/dir", "no/such/dir")])
def test_a_missing_bundle_directory_is_named_on_one_line(path, shown):
    with pytest.raises(rt.BundleError) as info:
        rt.read_bundle(path)
    assert _one_printable_line(str(info.value)) == f"{shown}: no such bundle directory"
    with pytest.raises(rt.BundleError) as info:
        rt.load_bundle(path, strict=True)
    assert _one_printable_line(str(info.value)) == f"{shown}: no such bundle directory"


def test_a_refused_bundle_warns_in_one_line():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rt.load_bundle("r3/x\nY")
    (message,) = [str(w.message) for w in caught if issubclass(w.category, rt.BundleWarning)]
    assert _one_printable_line(message).startswith(
        "zmlx-pipeline: bundle refused: r3/x\\nY: no such bundle directory;")


def test_a_directory_with_a_control_character_that_holds_no_bundle_is_named_escaped(tmp_path):
    empty = tmp_path / "nl\ndir"
    empty.mkdir()
    with pytest.raises(rt.BundleError) as info:
        rt.read_bundle(str(empty))
    assert _one_printable_line(str(info.value)) == (
        f"{printable(str(empty))}: no manifest.json and no latest pointer (not a bundle or a publish directory)")
    bad = tmp_path / "esc\x1b[2Jdir"
    bad.mkdir()
    (bad / "manifest.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(rt.BundleError) as info:
        rt.read_bundle(str(bad))
    assert _one_printable_line(str(info.value)) == f"{printable(str(bad))}: not a zmlx-pipeline bundle manifest (schema 'other')"
    plain_dir = tmp_path / "ordinary dir"
    plain_dir.mkdir()
    (plain_dir / "manifest.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(rt.BundleError) as info:
        rt.read_bundle(str(plain_dir))
    assert str(info.value) == f"{plain_dir}: not a zmlx-pipeline bundle manifest (schema 'other')"


def test_an_unusable_autotune_cache_is_named_escaped_when_moved_aside(tmp_path):
    from zmlx_pipeline.runtime import cache

    path = tmp_path / "esc\x1b[2J" / "autotune.json"
    path.parent.mkdir()
    path.write_text("not json")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cache.save_entries("M3_Max_0.1", {"k": {"tg": 256}}, path=path)
    (message,) = [str(w.message) for w in caught if "moved aside" in str(w.message)]
    assert _one_printable_line(message).startswith(
        f"zmlx-pipeline: {printable(str(path))} could not be used as the autotune cache")
