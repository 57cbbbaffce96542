"""Rebuild the bundle shipped with the package (zmlx_pipeline/runtime/default_bundle/) from the shards in data/.

The bundle is published as JSON, then rewritten in its compact form (every file gzip-compressed, schema 5).

    python tools/build_default_bundle.py [--data data] [--out zmlx_pipeline/runtime/default_bundle]

Run it whenever data/ changes (tests/publish/test_default_bundle.py fails until you do).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from zmlx_pipeline.publish.default import build_default_bundle  # noqa: E402
from zmlx_pipeline.publish.writer import rewrite_bundle  # noqa: E402
from zmlx_pipeline.runtime.bundle import DEFAULT_BUNDLE_DIR  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT / "data", help="directory of committed shards")
    parser.add_argument("--out", type=Path, default=DEFAULT_BUNDLE_DIR, help="where the default bundle lives")
    args = parser.parse_args()
    start = time.perf_counter()
    result = build_default_bundle(args.data, args.out, progress=lambda m: print(m, file=sys.stderr, flush=True))
    manifest, _ = rewrite_bundle(args.out, args.out, compact=True)
    result.update(bundle_id=manifest["bundle_id"], schema_version=manifest["schema_version"],
                  stored_bytes=sum(entry["bytes"] for entry in manifest["files"].values()))
    result["seconds"] = round(time.perf_counter() - start, 1)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
