"""Which library errors the CLI turns into one-line messages (exit 1), found without importing their modules.

An error class can only have been raised if its module was imported, so a command checks only the
classes of modules already loaded: `lookup` never imports the store (duckdb) or the models
(scikit-learn) just to name their errors.
"""

from __future__ import annotations

import sys

#: (module, class) of every error a command reports as one line instead of a traceback
EXPECTED = (
    ("zmlx_pipeline.data.store", "StoreError"),
    ("zmlx_pipeline.data.catalog", "UnknownDevice"),
    ("zmlx_pipeline.kernels.registry", "UnknownKernel"),
    ("zmlx_pipeline.kernels.spec", "KernelSpecError"),
    ("zmlx_pipeline.pipeline.collect", "CollectError"),
    ("zmlx_pipeline.runtime.errors", "RuntimeAPIError"),
    ("zmlx_pipeline.models.rankers.base", "ModelError"),
    ("zmlx_pipeline.publish.models", "ModelSourceError"),
    ("zmlx_pipeline.publish.writer", "PublishError"),
)


def expected_errors(pairs=EXPECTED) -> tuple[type[BaseException], ...]:
    """The expected error classes of the modules imported so far."""
    return tuple(getattr(sys.modules[m], name) for m, name in pairs if m in sys.modules)
