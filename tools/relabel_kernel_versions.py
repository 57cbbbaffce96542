"""Relabel CUDA timings in shards to the current kernel version where only the Metal program changed.

    python tools/relabel_kernel_versions.py --from-rev REV [--check] [--json] SHARD...

A kernel's version hashes the code of both backends and the prelude version, so a Metal-only change
gives every kernel a new version and leaves every committed CUDA timing at an old one. For each
built-in kernel this reads its version and its CUDA program at git revision REV (the package extracted
with `git archive` and imported in a child process) and in this checkout. Where the CUDA program is the
same and only the version differs, the shards' rows of CUDA devices (`device_backend = 'cuda'`) at REV's
version are rewritten to the current version, their repeated timings (the `repeats` column) with them;
every other column, the row order, the schema, zstd compression and the Parquet key-value metadata are
kept, and each file is replaced atomically. A row whose key the shard also holds at the current version
(timed again since) stays at the old version, so no key is held twice. Kernels whose CUDA program
changed are listed and left alone; Metal rows are never relabelled. A second run finds nothing to do.

The CUDA program compared (one record per kernel, `PROBE` below) is what the harness hands MLX:
`spec.header("cuda")` and `spec.source("cuda")` (text for every dtype: the dtype and the config reach
the program only as template arguments, `T` then the parameters in `spec.params` order, also
compared), input and output names, the text of `harness.Launcher` (kernel name pattern, template,
row-contiguity, shared-memory request) and `KernelSpec.shared_memory_bytes`, and the text of the
kernel's module and of the built-in modules it imports (launch geometry, shared memory size and output
shapes are Python there). The compiled kernel's name embeds the version (`zp_<kernel>_<hash>`), so it
differs by construction; it names the symbol, not the code.

--check prints the plan and writes nothing: exit 1 when rows would be relabelled, 0 when none would.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
#: a measurement's key in the store (data/store.py), which a shard holds at most once
KEY = ("device_id", "kernel", "kernel_version", "dtype", "shape_key", "config_key")
#: how a rewritten shard is compressed: zstd, as `export` writes shards; level 9 keeps a rewritten shard
#: within a quarter of the size DuckDB wrote (pyarrow's default level 1: half as large again)
ZSTD = {"compression": "zstd", "compression_level": 9}

#: run in a child Python whose working directory holds the package to read; prints one JSON object
PROBE = r"""
import ast, hashlib, importlib, inspect, json, os, sys
from pathlib import Path

import zmlx_pipeline
if not Path(zmlx_pipeline.__file__).resolve().is_relative_to(Path.cwd().resolve()):
    sys.exit(f"imported zmlx_pipeline from {zmlx_pipeline.__file__}, not from {os.getcwd()}")
from zmlx_pipeline.kernels import harness, spec as spec_module
from zmlx_pipeline.kernels.registry import builtin_kernels

BUILTIN = "zmlx_pipeline.kernels.builtin."


def module_texts(name, seen):
    # the kernel's module and every built-in module it imports from, by file text
    if name in seen:
        return
    text = Path(importlib.import_module(name).__file__).read_text()
    seen[name] = text
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(BUILTIN):
            module_texts(node.module, seen)


out = {}
for spec in builtin_kernels():
    modules = {}
    module_texts(BUILTIN + spec.name, modules)
    metal = spec.header("metal") + spec.source("metal")
    out[spec.name] = {
        "version": spec.version,
        "metal_sha256": hashlib.sha256(metal.encode()).hexdigest(),
        "cuda": {
            "header": spec.header("cuda"),
            "source": spec.source("cuda"),
            "inputs": list(spec.inputs),
            "outputs": list(spec.outputs),
            "template": ["T"] + list(spec.params),
            "params": {k: list(v) for k, v in spec.params.items()},
            "dtypes": list(spec_module.DTYPE_BYTES),
            "launcher": inspect.getsource(harness.Launcher),
            "shared_memory_bytes": inspect.getsource(spec_module.KernelSpec.shared_memory_bytes),
            "modules": modules,
        },
    }
print(json.dumps(out))
"""


class RelabelError(Exception):
    """An expected mistake (unknown revision, a file that is not a shard): one line, exit 2."""


def kernel_programs(rev: str | None, repo: Path = REPO) -> dict[str, dict]:
    """Each built-in kernel's version and CUDA program record at git revision `rev` (None: this checkout)."""
    if rev is None:
        return _probe(repo)
    with tempfile.TemporaryDirectory(prefix="relabel-") as tmp:
        try:
            archive = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", rev, "--", "zmlx_pipeline"],
                                     capture_output=True, check=True).stdout
        except FileNotFoundError:
            raise RelabelError("git is not installed; it reads the kernels at --from-rev") from None
        except subprocess.CalledProcessError as exc:
            why = exc.stderr.decode(errors="replace").strip().splitlines()
            raise RelabelError(f"cannot read revision {rev!r} from {repo}: {why[-1] if why else 'git archive failed'}") from None
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(tmp, filter="data")
            else:  # Python before 3.11.4; the archive is our own repository's
                tar.extractall(tmp)  # noqa: S202
        return _probe(Path(tmp), rev)


def _probe(root: Path, rev: str | None = None) -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH")) if p),
           "PYTHONDONTWRITEBYTECODE": "1"}
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=root, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RelabelError(f"cannot read the kernels {f'at {rev}' if rev else 'of this checkout'}: {last}")
    return json.loads(done.stdout)


@dataclass
class KernelPlan:
    """What happens to one kernel's rows: `relabel` (CUDA program identical, version changed), `same_version`,
    `cuda_changed` (left alone; `differs` names the parts), `only_at_rev` or `only_now`."""

    kernel: str
    action: str
    from_version: str | None
    to_version: str | None
    differs: list[str] = field(default_factory=list)
    metal_changed: bool | None = None


def plan(old: dict[str, dict], new: dict[str, dict]) -> list[KernelPlan]:
    """Compare the kernels at the old revision with the current ones."""
    out = []
    for name in sorted(old.keys() | new.keys()):
        o, n = old.get(name), new.get(name)
        if o is None or n is None:
            out.append(KernelPlan(name, "only_now" if o is None else "only_at_rev",
                                  o and o["version"], n and n["version"]))
            continue
        metal_changed = o.get("metal_sha256") != n.get("metal_sha256")
        if o["version"] == n["version"]:
            out.append(KernelPlan(name, "same_version", o["version"], n["version"], metal_changed=metal_changed))
            continue
        differs = sorted(k for k in o["cuda"].keys() | n["cuda"].keys() if o["cuda"].get(k) != n["cuda"].get(k))
        out.append(KernelPlan(name, "cuda_changed" if differs else "relabel", o["version"], n["version"],
                              differs, metal_changed))
    return out


def relabel_shard(path: Path, mapping: dict[tuple[str, str], str], write: bool) -> dict:
    """Relabel one shard's CUDA rows whose (kernel, kernel_version) is in `mapping` (to the mapped version);
    returns {'path', 'rows', 'relabelled', 'already_at_new_version', 'written'}. Writes a temporary file
    next to it, checks that it reads back equal but for those versions, with the same schema and metadata,
    then replaces the shard."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    table = read_shard(path)
    kernels = table.column("kernel").to_pylist()
    versions = table.column("kernel_version").to_pylist()
    backends = table.column("device_backend").to_pylist()
    relabelled = [mapping.get((k, v)) if b == "cuda" else None for k, v, b in zip(kernels, versions, backends)]
    # a key the shard already holds at the new version (timed again since) keeps that timing: its old row
    # stays at the old version, so the shard never holds one key twice
    keys = list(zip(*(table.column(c).to_pylist() for c in KEY)))
    present = set(keys)
    version_at = KEY.index("kernel_version")
    kept = 0
    for i, to in enumerate(relabelled):
        if to is not None and (*keys[i][:version_at], to, *keys[i][version_at + 1:]) in present:
            relabelled[i], kept = None, kept + 1
    count = sum(v is not None for v in relabelled)
    result = {"path": str(path), "rows": table.num_rows, "relabelled": count, "already_at_new_version": kept,
              "written": False}
    if not count or not write:
        return result
    new_versions = pa.array([r or v for r, v in zip(relabelled, versions)], type=table.schema.field("kernel_version").type)
    index = table.schema.get_field_index("kernel_version")
    out = table.set_column(index, table.schema.field(index), new_versions)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        write_parquet(out, tmp)
        back = pq.read_table(tmp)
        rest = [c for c in table.column_names if c != "kernel_version"]
        if (back.schema != table.schema or file_metadata(tmp) != file_metadata(path)
                or not back.select(rest).equals(table.select(rest))
                or pc.sum(pc.not_equal(back.column("kernel_version"), table.column("kernel_version"))).as_py() != count):
            raise RelabelError(f"{path}: the rewritten shard did not read back as written; left unchanged")
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    result["written"] = True
    return result


def write_parquet(table, path: Path) -> None:
    """Write a zstd Parquet file whose key-value metadata is the table's own (a shard's, as DuckDB wrote it)."""
    import pyarrow.parquet as pq

    if hasattr(pq.ParquetWriter, "add_key_value_metadata"):  # pyarrow 15+: no ARROW:schema key added
        with pq.ParquetWriter(path, table.schema, store_schema=False, **ZSTD) as writer:
            writer.write_table(table)
            writer.add_key_value_metadata(table.schema.metadata or {})
    else:  # pyarrow 14 writes the table's metadata only beside its ARROW:schema key
        pq.write_table(table, path, **ZSTD)


def file_metadata(path: Path) -> dict:
    """A Parquet file's key-value metadata, less the ARROW:schema key pyarrow may add."""
    import pyarrow.parquet as pq

    return {k: v for k, v in (pq.read_metadata(path).metadata or {}).items() if k != b"ARROW:schema"}


def read_shard(path: Path):
    """The shard as an Arrow table; RelabelError when the file is not a zmlx-pipeline shard."""
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:
        raise RelabelError(f"{path}: not a readable Parquet shard ({str(exc).splitlines()[0]})") from None
    metadata = table.schema.metadata or {}
    missing = [c for c in ("kernel", "kernel_version", "device_backend") if c not in table.column_names]
    if b"zmlx_pipeline_shard" not in metadata or missing:
        raise RelabelError(f"{path}: not a zmlx-pipeline shard (no zmlx_pipeline_shard metadata"
                           f"{' or column ' + ', '.join(missing) if missing else ''}); export one with "
                           "`zmlx-pipeline export`")
    return table


def run(rev: str, shards: list[Path], check: bool,
        lookup: Callable[[str | None], dict[str, dict]] = kernel_programs) -> dict:
    """Plan and (unless `check`) apply the relabel; every shard is read and checked before any is written."""
    for path in shards:
        read_shard(path)
    kernels = plan(lookup(rev), lookup(None))
    mapping = {(p.kernel, p.from_version): p.to_version for p in kernels if p.action == "relabel"}
    results = [relabel_shard(path, mapping, write=not check) for path in shards]
    return {"from_rev": rev, "check": check, "kernels": [asdict(p) for p in kernels], "shards": results}


def main(argv=None, lookup: Callable[[str | None], dict[str, dict]] = kernel_programs) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--from-rev", required=True, help="the git revision whose kernel versions the rows carry")
    ap.add_argument("--check", action="store_true", help="print what would change and write nothing (exit 1 if anything would)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("shards", nargs="+", type=Path)
    args = ap.parse_args(argv)
    try:
        report = run(args.from_rev, args.shards, args.check, lookup)
    except RelabelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{'kernel':12s} {'at ' + args.from_rev:20s} {'now':20s} action")
        for p in report["kernels"]:
            note = {"relabel": "relabel CUDA rows (CUDA program identical)", "same_version": "nothing to do",
                    "only_at_rev": "not a kernel now", "only_now": f"not a kernel at {args.from_rev}",
                    "cuda_changed": "left alone: CUDA program differs in " + ", ".join(p["differs"])}[p["action"]]
            if p["metal_changed"]:
                note += "; Metal program differs"
            print(f"{p['kernel']:12s} {p['from_version'] or '-':20s} {p['to_version'] or '-':20s} {note}")
        verb = "would relabel" if args.check else "relabelled"
        for s in report["shards"]:
            kept = f"; {s['already_at_new_version']} left: their key is timed at the new version" \
                if s["already_at_new_version"] else ""
            print(f"{s['path']}: {s['rows']} rows, {verb} {s['relabelled']}{kept}")
    pending = sum(s["relabelled"] for s in report["shards"])
    return 1 if args.check and pending else 0


if __name__ == "__main__":
    sys.exit(main())
