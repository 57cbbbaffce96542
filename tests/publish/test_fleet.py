"""Fleet publishing end to end: each machine's store -> export -> ingest -> train -> publish -> HTTP -> runtime.

Each committed shard in data/ (one per GPU: the H100 and the H200) stands for one machine's store.
Should data/ ever hold a single device, a second machine is made from it with times rescaled per
threadgroup (a test double for a second GPU), so that there are always two. A runtime in another
process loads the published bundle over HTTP from a local server and must answer each machine's
measured shapes with that machine's measured best; after a file of the served bundle is altered,
a fresh fetch is refused and the verified cached copy keeps answering.
"""

import functools
import json
import subprocess
import sys
import textwrap
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

import polars as pl
import pytest
from threadpoolctl import threadpool_limits

from bundle_fixtures import REPO, add_device, latest_dir
from zmlx_pipeline.data.records import Measurement
from zmlx_pipeline.data.shards import ingest_shards
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models.train import train_models
from zmlx_pipeline.publish import publish

RUNTIME = textwrap.dedent("""
    import json, sys, warnings
    from zmlx_pipeline.runtime import BundleError, load_bundle, predicted_config
    url, strict, cases = sys.argv[1], sys.argv[2] == "strict", json.loads(sys.argv[3])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            bundle = load_bundle(url, strict=strict)
        except BundleError as exc:
            print(json.dumps({"error": str(exc)}))
            sys.exit(3)
    answers = [predicted_config("rmsnorm", c["shape"], c["dtype"], device=c["device"]).as_dict() for c in cases]
    print(json.dumps({"bundle": bundle.bundle_id, "source": bundle.source,
                      "warnings": [str(w.message) for w in caught], "answers": answers}))
""")


def _machine_b(a_path, b_path) -> None:
    """A second 'H100' store: A's rmsnorm cases, times rescaled by threadgroup (so the winners move)."""
    with Store(a_path, read_only=True) as a:
        rows = a.measurements(kernel="rmsnorm", status="ok")
    with Store(b_path) as b:
        add_device(b, "nvidia-h100-sxm")
        run = b.start_run("nvidia-h100-sxm", host="h100-box", backend="cuda", mlx_version="0.32.4",
                          pipeline_version="0.1.0", settings={}, status="running")
        b.record([Measurement(run_id=run, device_id="nvidia-h100-sxm", kernel=r["kernel"],
                              kernel_version=r["kernel_version"], dtype=r["dtype"], shape=r["shape"],
                              config=r["config"], status="ok", samples=10,
                              median_us=r["median_us"] * (r["config"]["TG"] / 64) ** 0.5)
                  for r in rows])
        b.finish_run(run, "finished")


def _machines(tmp_path) -> dict[str, object]:
    """One store per committed shard (per device); a derived second machine when data/ has only one."""
    stores = {}
    for shard in sorted((REPO / "data").glob("*.parquet")):
        devices = pl.read_parquet(shard, columns=["device_id"])["device_id"].unique().to_list()
        path = tmp_path / f"machine-{shard.stem}.duckdb"
        with Store(path) as store:
            ingest_shards(store, [shard])
        for device in devices:
            stores.setdefault(device, path)
    if len(stores) < 2:
        first = next(iter(stores.values()))
        _machine_b(first, tmp_path / "machine-h100.duckdb")
        stores["nvidia-h100-sxm"] = tmp_path / "machine-h100.duckdb"
    return stores


def _measured_bests(store) -> list[dict]:
    """The measured best of every rmsnorm case the model learns from (its newest kernel version)."""
    from zmlx_pipeline.models.evaluate import kernel_features_of

    frame = kernel_features_of(store, ["rmsnorm"])["rmsnorm"].frame
    best = frame.sort(["median_us", "config_key"]).group_by(["device_id", "dtype", "shape_key"], maintain_order=True).first()
    return [{"device": r["device_id"], "dtype": r["dtype"], "shape": json.loads(r["shape"]),
             "config": json.loads(r["config"])} for r in best.sort(["device_id", "dtype", "shape_key"]).iter_rows(named=True)]


@pytest.fixture
def server(tmp_path):
    root = tmp_path / "www"
    root.mkdir()
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a, **k: None
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield root, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _runtime(url, cases, env, strict=False):
    out = subprocess.run([sys.executable, "-c", RUNTIME, url, "strict" if strict else "lenient", json.dumps(cases)],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout, out.stderr
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def test_two_machines_to_a_runtime_over_http(tmp_path, server, subprocess_env):
    central_path = tmp_path / "central.duckdb"
    machines = _machines(tmp_path)
    shards = tmp_path / "shards"
    for device, path in machines.items():
        with Store(path, read_only=True) as store:
            assert store.export_shard(shards / f"{device}.parquet", device=device) > 0
    www, url = server
    with Store(central_path) as central:
        totals = ingest_shards(central, [shards])
        assert totals["files"] == len(machines) >= 2 and totals["added"] == totals["rows"]
        with threadpool_limits(limits=1):
            # held-out scoring is the train tests' business: skipped here to keep this test quick
            (model,) = train_models(central, kernels=["rmsnorm"], models_dir=tmp_path / "models", heldout=False)
        result = publish(central, www / "bundles", kernels=["rmsnorm"], devices=["apple-m3-max-40c"], evaluate=False)
        assert result["model_id"] == model["model_id"]
        assert set(machines) <= set(result["measured_devices"])
        bests = _measured_bests(central)
    winners = {(b["device"], b["dtype"], json.dumps(b["shape"], sort_keys=True)): b["config"] for b in bests}
    a, b = sorted(machines)[:2]
    # the machines disagree somewhere, so a lookup that answered every device alike would fail below
    assert any(winners[(a, d, s)] != winners[(b, d, s)] for (dev, d, s) in winners if dev == b and (a, d, s) in winners)
    cases = [{k: b[k] for k in ("device", "dtype", "shape")} for b in bests]
    cases.append({"device": "apple-m3-max-40c", "dtype": "float16", "shape": {"rows": 4096, "cols": 4096}})
    env = {**subprocess_env, "XDG_CACHE_HOME": str(tmp_path / "client-cache")}

    code, got = _runtime(url + "/bundles", cases, env, strict=True)
    assert code == 0 and got["bundle"] == result["bundle_id"] and got["warnings"] == []
    for case, best, answer in zip(cases, bests, got["answers"]):
        assert answer["evidence"] == "measured" and answer["config"] == best["config"], (case, answer)
    assert got["answers"][-1]["evidence"] == "extrapolated"  # measured on NVIDIA chips only
    assert "never measured" in got["answers"][-1]["note"]
    assert (tmp_path / "client-cache" / "zmlx-pipeline" / "bundles").is_dir()

    # tamper with a served file: the fetch is refused, the verified cached copy keeps answering
    kernels = latest_dir(www / "bundles") / "kernels.json"
    kernels.write_text(kernels.read_text().replace('"TG":256', '"TG":255', 1))
    code, bad = _runtime(url + "/bundles", cases[:2], env, strict=True)
    assert code == 3 and "sha256 of kernels.json does not match" in bad["error"]
    code, kept = _runtime(url + "/bundles", cases[:2], env)
    assert code == 0 and kept["bundle"] == result["bundle_id"] and "(cached copy)" in kept["source"]
    assert any("sha256 of kernels.json does not match" in w and "cached copy" in w for w in kept["warnings"])
    assert [a["config"] for a in kept["answers"]] == [b["config"] for b in bests[:2]]
    # a client that never fetched it has nothing verified to fall back on: the default bundle stays in use
    fresh = {**subprocess_env, "XDG_CACHE_HOME": str(tmp_path / "fresh-cache")}
    code, refused = _runtime(url + "/bundles", cases[:1], fresh)
    assert code == 0 and refused["source"] == "default bundle"
    assert any("bundle refused" in w and "sha256" in w for w in refused["warnings"])
