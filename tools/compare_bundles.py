"""Whether two bundles hold the same content, whatever their schema: every device's tables (entries read by name,
a positional entry of an older bundle named first), kernels.json, profiles.json and autotune_v3.json.

    python tools/compare_bundles.py BUNDLE_A BUNDLE_B

Each argument is a bundle directory or a publish root (its `latest`). Prints `identical` and exits 0, or lists
the first differences (file, key path) and exits 1. Publish's speed work is checked with it: the bundle of the
same store and models before and after must compare identical.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zmlx_pipeline.runtime.bundle import POSITIONAL_SCHEMAS, read_dir  # noqa: E402
from zmlx_pipeline.runtime.lookup import named_entry  # noqa: E402

#: fields that name the run or the code, not the content
VOLATILE = ("created", "pipeline_version")


def content(path: Path) -> dict:
    """A bundle's content keyed by what it means: the index files, and each device's tables by device id."""
    bundle = read_dir(path)
    positional = bundle.schema_version in POSITIONAL_SCHEMAS
    tables = {}
    for device, name in sorted(bundle.tables.items()):
        data = bundle.json(name)
        for per_dtype in data["kernels"].values():
            for table in per_dtype.values():
                for kind, entries in table.items():
                    table[kind] = {key: named_entry(e) if positional else e for key, e in entries.items()}
        tables[device] = data
    return {"kernels.json": bundle.json("kernels.json"), "profiles.json": bundle.json("profiles.json"),
            "autotune_v3.json": bundle.json("autotune_v3.json"), "tables": tables}


def differences(a, b, where: str = "", limit: int = 20) -> list[str]:
    """Key paths where `a` and `b` differ (at most `limit`); floats compare exactly."""
    out: list[str] = []
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key in VOLATILE:
                continue
            if key not in a or key not in b:
                out.append(f"{where}/{key}: only in {'B' if key not in a else 'A'}")
            else:
                out += differences(a[key], b[key], f"{where}/{key}", limit - len(out))
            if len(out) >= limit:
                break
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{where}[{i}]", limit - len(out))
            if len(out) >= limit:
                break
    elif a != b or type(a) is not type(b):
        out.append(f"{where}: {a!r} != {b!r}"[:300])
    return out[:limit]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("a", type=Path)
    parser.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    diff = differences(content(args.a), content(args.b))
    if not diff:
        print("identical")
        return 0
    print("\n".join(diff))
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
