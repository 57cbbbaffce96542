"""A served file longer than its manifest says is a bundle that fails verification (as a wrong hash is), not an
unreachable server: a strict load refuses it in one line instead of answering from the stale cached copy; a lenient
one warns once and keeps to what it does with any bad bundle (the verified cached copy)."""

import functools
import shutil
import threading
import warnings
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from bundle_fixtures import latest_dir
from zmlx_pipeline.runtime import BundleError, BundleWarning, FetchError, load_bundle
from zmlx_pipeline.runtime.bundle import cache_root


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # not into the output a test reads
        pass


@pytest.fixture
def served(toy_bundle, tmp_path):
    """(URL of a copy of the toy bundle served over HTTP, its directory)."""
    www = tmp_path / "www"
    shutil.copytree(latest_dir(toy_bundle[1]), www / "b")
    handler = functools.partial(_Quiet, directory=str(www))
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/b", www / "b"
    finally:
        httpd.shutdown()
        httpd.server_close()


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _lengthen(bundle) -> str:
    """Four bytes appended to a served device table; its name."""
    import json

    name = next(iter(json.loads((bundle / "tables.json").read_text())["devices"].values()))
    with open(bundle / name, "ab") as fh:
        fh.write(b"abcd")
    return name


def test_a_strict_load_refuses_a_longer_file_instead_of_the_cached_copy(served):
    url, bundle = served
    fetched = load_bundle(url, strict=True)  # cached now
    cached = _tree(cache_root())
    name = _lengthen(bundle)
    size = (bundle / name).stat().st_size
    with pytest.raises(BundleError) as refused:
        load_bundle(url, strict=True)
    assert not isinstance(refused.value, FetchError)
    assert str(refused.value) == f"{url}/{name}: the server announces {size} bytes, more than the {size - 4} this " \
                                 "file may have"
    assert _tree(cache_root()) == cached
    with pytest.warns(BundleWarning) as caught:
        kept = load_bundle(url)
    (warning,) = caught
    assert str(warning.message) == f"zmlx-pipeline: {url}/{name}: the server announces {size} bytes, more than the " \
                                   f"{size - 4} this file may have; using the cached copy {fetched.bundle_id}"
    assert kept.bundle_id == fetched.bundle_id and "(cached copy)" in kept.source


def test_the_lookup_command_exits_1_in_one_line(served):
    from zmlx_pipeline.pipeline.cli import cli

    url, bundle = served
    args = ["lookup", "toy_scale", "--shape", "rows=4096,cols=4096", "--device", "nvidia-h200", "--bundle", url]
    assert CliRunner().invoke(cli, args).exit_code == 0  # cached now
    name = _lengthen(bundle)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and caught == []
    assert result.output.splitlines() == [f"Error: {url}/{name}: the server announces "
                                          f"{(bundle / name).stat().st_size} bytes, more than the "
                                          f"{(bundle / name).stat().st_size - 4} this file may have"]
