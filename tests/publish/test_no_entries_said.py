"""Publish names each device left without entries of a kernel (no config of it is legal there) and why, in the words a
lookup there answers with: in its return value (`no_entries`), its --json and one table line per device. Two cases: a
device registered with 32 threads per threadgroup (every toy config is wider), and matmul on a T4 (its `cuda_arch`
constraint rules out every config). A publish where every device has entries says nothing of the kind
(tests/pipeline/test_cli_publish.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parents[1] / "runtime"))
sys.path.insert(0, str(Path(__file__).parents[1] / "pipeline"))

from bundle_fixtures import SMOKE_SHARD, fill_toy  # noqa: E402
from device_records import record  # noqa: E402
from zmlx_pipeline.data.registered import register_device  # noqa: E402
from zmlx_pipeline.data.store import Store  # noqa: E402
from zmlx_pipeline.pipeline.cli import cli  # noqa: E402
from zmlx_pipeline.publish import publish  # noqa: E402

NARROW = "every config breaks: TG <= max_threads"
PRE_AMPERE = "every config breaks: cuda_arch == 0 or cuda_arch >= 80"
#: (store fixture, publish arguments, the lookup checked, no_entries, the table's line)
CASES = {
    "narrow": ("narrow_store", {"devices": ["acme-x32", "nvidia-h200"]},
               ("toy_scale", {"rows": 64, "cols": 4096}, "float16", "acme-x32"),
               {"acme-x32": {"toy_scale": NARROW}}, f"acme-x32: no legal config of toy_scale ({NARROW})"),
    "t4": ("matmul_store", {"kernels": ["matmul"], "devices": ["nvidia-t4"]},
           ("matmul", {"M": 512, "N": 4096, "K": 4096}, "bfloat16", "nvidia-t4"),
           {"nvidia-t4": {"matmul": PRE_AMPERE}}, f"nvidia-t4: no legal config of matmul ({PRE_AMPERE})"),
}


@pytest.fixture(scope="module")
def narrow_store(tmp_path_factory) -> Path:
    """The toy kernel (TG 64 to 512) measured on an H100 and an H200, and a device registered at 32 threads."""
    root = tmp_path_factory.mktemp("narrow")
    with Store(root / "s.duckdb") as store:
        fill_toy(store)
        register_device(store, record(root / "acme.json", id="acme-x32", name="Acme X32", aliases=["Acme X32"],
                                      variant="acme-x32", max_threads_per_threadgroup=32, default_threadgroup=32))
    return root / "s.duckdb"


@pytest.fixture(scope="module")
def matmul_store(tmp_path_factory) -> Path:
    """The committed 32-SM H100 shard: matmul among its kernels."""
    from zmlx_pipeline.data.shards import ingest_shards

    root = tmp_path_factory.mktemp("matmul")
    with Store(root / "s.duckdb") as store:
        ingest_shards(store, [SMOKE_SHARD])
    return root / "s.duckdb"


def _run(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def _cli_args(db: Path, out: Path, kwargs: dict) -> list[str]:
    args = ["publish", "--db", str(db), "--to", str(out)]
    for device in kwargs["devices"]:
        args += ["--device", device]
    for kernel in kwargs.get("kernels", ()):
        args += ["--kernel", kernel]
    return args


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_library_names_the_device_and_the_reason_a_lookup_gives(case, request, tmp_path):
    from zmlx_pipeline.runtime import load_bundle, predicted_config

    store_fixture, kwargs, (kernel, shape, dtype, device), expected, _ = CASES[case]
    with Store(request.getfixturevalue(store_fixture), read_only=True) as store:
        result = publish(store, tmp_path / "out", record=False, jobs=1, **kwargs)
    assert result["no_entries"] == expected
    load_bundle(tmp_path / "out", strict=True)
    answer = predicted_config(kernel, shape, dtype, device=device)
    assert answer.evidence == "none" and answer.note.endswith(f"({expected[device][kernel]})")


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_cli_prints_one_line_per_device_and_the_whole_list_in_json(case, request, tmp_path):
    store_fixture, kwargs, _, expected, line = CASES[case]
    db = request.getfixturevalue(store_fixture)
    table = _run(*_cli_args(db, tmp_path / "out", kwargs))
    assert table.exit_code == 0, table.output
    assert [t for t in table.stdout.splitlines() if "no legal config" in t] == [line]
    data = _run(*_cli_args(db, tmp_path / "out", kwargs), "--json")
    assert data.exit_code == 0, data.output
    assert json.loads(data.stdout)["no_entries"] == expected


def test_kernels_of_one_reason_share_a_line_and_reasons_are_joined():
    from zmlx_pipeline.pipeline.cli_publish import no_entry_lines

    assert no_entry_lines({"nvidia-t4": {"matmul": PRE_AMPERE, "moe": PRE_AMPERE, "toy": NARROW}, "x": {}}) == [
        f"nvidia-t4: no legal config of matmul, moe ({PRE_AMPERE}); no legal config of toy ({NARROW})"]
