"""An http(s) bundle location with a query or fragment (manifest.json would be appended after it, and a server's
page read as the manifest), or with a user name and password (never sent; a lookup of the host failed with the
password in the message): refused as BadArgument in one line that shows no password, by the API and the CLI alike,
with nothing written to the bundle cache."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from bundle_fixtures import tree_digest
from zmlx_pipeline.pipeline.cli import cli
from zmlx_pipeline.runtime import BadArgument, RuntimeAPIError, load_bundle
from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR, cache_root

QUERY = ("has a query (?) or a fragment (#), which would come before manifest.json and each file's name in their "
         "URLs: give the URL without it")
USER = "carries a user name or password, which are never sent: give the URL without them"
CASES = [
    ("http://127.0.0.1:1/pub?token=abc", f"bundle location 'http://127.0.0.1:1/pub?token=abc' {QUERY}"),
    ("https://127.0.0.1:1/pub/#latest", f"bundle location 'https://127.0.0.1:1/pub/#latest' {QUERY}"),
    ("http://127.0.0.1:1/pub?", f"bundle location 'http://127.0.0.1:1/pub?' {QUERY}"),
    ("http://user:secret@127.0.0.1:1/pub", f"bundle location 'http://...@127.0.0.1:1/pub' {USER}"),
]


@pytest.mark.parametrize("url, says", CASES)
@pytest.mark.parametrize("strict", [False, True])
def test_the_api_refuses_the_location_in_one_line(url, says, strict):
    before = tree_digest(DEFAULT_BUNDLE_DIR)
    with pytest.raises(BadArgument) as exc:
        load_bundle(url, strict=strict)
    assert isinstance(exc.value, RuntimeAPIError) and str(exc.value) == says
    assert "secret" not in str(exc.value)
    assert not cache_root().exists() and tree_digest(DEFAULT_BUNDLE_DIR) == before


@pytest.mark.parametrize("url, says", CASES)
def test_lookup_refuses_it_as_a_usage_error(url, says):
    result = CliRunner().invoke(cli, ["lookup", "rmsnorm", "--shape", "4096,4096", "--device", "nvidia-h200",
                                      "--bundle", url])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip().splitlines() == [f"Error: Invalid value for --bundle: {says} (cli lookup --help)"]
    assert not cache_root().exists()


@pytest.mark.parametrize("url, says", CASES)
def test_the_environment_variable_is_refused_alike(url, says, monkeypatch):
    monkeypatch.setenv("ZMLX_PIPELINE_BUNDLE", url)
    result = CliRunner().invoke(cli, ["profiles"])
    assert result.exit_code == 1 and result.output.strip().splitlines() == [f"Error: {says}"]
