"""A served publish directory's `latest` longer than a pointer may be (MAX_POINTER_BYTES) is refused in one line
naming that pointer, as a local one is, whether the server announces its length or not; never reported as the
directory's missing manifest.json. A padded pointer within the limit is read, as a local one is."""

import functools
import shutil
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import pytest

from bundle_fixtures import latest_dir
from zmlx_pipeline.runtime import BundleError, load_bundle
from zmlx_pipeline.runtime.bundle import MAX_POINTER_BYTES


class _Served(SimpleHTTPRequestHandler):
    """Files of `directory`; `latest` sent without a Content-Length when the server's `unannounced` is set."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.endswith("/latest") and getattr(self.server, "unannounced", False):
            body = (self.server.www / self.path.lstrip("/")).read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.end_headers()
            self.wfile.write(body)
            return
        super().do_GET()


@pytest.fixture(params=[False, True], ids=["announced", "unannounced"])
def served(toy_bundle, tmp_path, request):
    """(URL of a publish directory served over HTTP, the directory, the name of its one version)."""
    www = tmp_path / "www"
    version = latest_dir(toy_bundle[1])
    shutil.copytree(version, www / "pub" / version.name)
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Served, directory=str(www)))
    httpd.www, httpd.unannounced = www, request.param
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/pub", www / "pub", version.name
    finally:
        httpd.shutdown()
        httpd.server_close()


def _tree(root):
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_padded_pointer_within_the_limit_is_read(served):
    url, root, name = served
    (root / "latest").write_text(name + "\n" + " " * (MAX_POINTER_BYTES - len(name) - 1))
    assert load_bundle(url, strict=True).bundle_id


def test_a_pointer_past_the_limit_is_refused_naming_it(served, request):
    url, root, name = served
    (root / "latest").write_text(name + "\n" + " " * (MAX_POINTER_BYTES - len(name)))
    before = _tree(root)
    with pytest.raises(BundleError) as refused:
        load_bundle(url, strict=True)
    if "unannounced" in request.node.name:
        assert str(refused.value) == (f"{url}/latest is over {MAX_POINTER_BYTES} bytes, longer than a latest pointer "
                                      "(one version directory's name) is: publish again, or point it at a bundle "
                                      "version")
    else:
        assert str(refused.value) == (f"{url}/latest: the server announces {MAX_POINTER_BYTES + 1} bytes, more than "
                                      f"the {MAX_POINTER_BYTES} this file may have")
    assert _tree(root) == before
