"""The element dtypes kernels are measured and looked up in, and their sizes in bytes."""

from __future__ import annotations

#: bytes per element of every dtype the pipeline measures (the order is the CLI's default order)
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
