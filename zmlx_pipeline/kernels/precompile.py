"""Worker entry point: compile (by launching once) a list of kernel configs to fill MLX's on-disk JIT cache.

Run by collect as `python -m zmlx_pipeline.kernels.precompile FILE.json`; each item names a kernel
(registry name or module:attr), a dtype, a shape and a config. Errors are ignored here: the
measuring pass records them.
"""

from __future__ import annotations

import json
import sys


def main(path: str) -> int:
    import mlx.core as mx

    from zmlx_pipeline.data.detect import detect_backend
    from zmlx_pipeline.kernels.harness import Launcher, mx_dtype
    from zmlx_pipeline.kernels.registry import get_kernel

    backend = detect_backend()
    with open(path) as fh:
        items = json.load(fh)
    launchers: dict[str, Launcher] = {}
    compiled = 0
    for item in items:
        try:
            if item["ref"] not in launchers:
                launchers[item["ref"]] = Launcher(get_kernel(item["ref"]), backend)
            launcher = launchers[item["ref"]]
            inputs = launcher.spec.make_inputs(item["shape"], mx_dtype(item["dtype"]), mx.random.key(0))
            mx.eval(launcher(inputs, item["config"], item["shape"], item["dtype"]))
            compiled += 1
        except Exception:  # noqa: BLE001 - recorded by the measuring pass
            continue
    print(compiled)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
