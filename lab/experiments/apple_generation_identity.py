"""The Apple GPU generation feature leaves the committed data's features alone: every kernel's feature
frame from data/ is compared, byte for byte, with the frame built when no family has a generation.

Usage: python lab/experiments/apple_generation_identity.py [DATA_DIR]
"""

import hashlib
import sys
import tempfile
from pathlib import Path

from zmlx_pipeline.data.shards import ingest_shards
from zmlx_pipeline.data.store import Store
from zmlx_pipeline.models import features


def digests(store) -> dict[str, tuple[tuple[str, ...], str]]:
    out = {}
    for kernel, f in sorted(features.store_features(store).items()):
        out[kernel] = (f.features, hashlib.sha256(f.frame.write_ipc(None).getvalue()).hexdigest()[:16])
    return out


def main() -> None:
    data = Path(sys.argv[1] if len(sys.argv) > 1 else "data")
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp) / "store.duckdb") as store:
        ingest_shards(store, [data])
        with_feature = digests(store)
        features.family_generations = lambda: {}  # as if no Apple row had a gpu_arch
        without = digests(store)
    for kernel, (cols, digest) in with_feature.items():
        same = (cols, digest) == without[kernel]
        print(f"{kernel:12s} {len(cols):3d} features  frame {digest}  "
              f"{'identical' if same else 'DIFFERENT'}  generation feature: {'dev_gpu_generation' in cols}")


if __name__ == "__main__":
    main()
