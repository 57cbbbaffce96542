"""A served bundle whose manifest's bundle_id is "." or ".." (or begins with a dot) is cached in a folder of its own:
never the cache folder of its URL nor the one holding every URL's copies, which caching it used to remove."""

import functools
import json
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bundle_fixtures import latest_dir
from zmlx_pipeline.runtime import load_bundle
from zmlx_pipeline.runtime.bundle import cache_root, cached_copy


class _Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def serve(toy_bundle, tmp_path):
    """serve(bundle_id): the URL of the toy bundle's version served with that bundle_id in its manifest."""
    www = tmp_path / "www"
    shutil.copytree(latest_dir(toy_bundle[1]), www / "b")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(www)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    def url(bundle_id: str) -> str:
        manifest = www / "b" / "manifest.json"
        manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "bundle_id": bundle_id}))
        return f"http://127.0.0.1:{httpd.server_address[1]}/b"

    yield url
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize("bundle_id", ["..", ".", ".fetch-1"])
def test_a_bundle_id_of_dots_leaves_every_other_cached_copy_alone(serve, bundle_id):
    other = cache_root() / "0123456789abcdef" / "other-bundle" / "manifest.json"
    other.parent.mkdir(parents=True)
    other.write_text("another URL's cached copy")
    url = serve(bundle_id)
    assert load_bundle(url, strict=True).bundle_id == bundle_id
    assert other.read_text() == "another URL's cached copy"
    assert cached_copy(url).bundle_id == bundle_id
