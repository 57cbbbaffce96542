"""The `zmlx-pipeline` command and `python -m zmlx_pipeline`: the CLI, or one line naming the extra it needs.

The base install is the runtime alone (standard library and MLX); the CLI and the pipeline behind it
need the `pipeline` extra. Without it the command says so in one line and exits 1, no traceback.
"""

from __future__ import annotations

import sys

#: top-level modules that only the `pipeline` extra brings (directly or as a dependency of one it names)
PIPELINE_MODULES = frozenset({"click", "duckdb", "polars", "pyarrow", "sklearn", "skops", "matplotlib",
                              "numpy", "scipy", "threadpoolctl", "joblib"})
INSTALL_HINT = "pip install 'zmlx-pipeline[pipeline]'"


def missing_extra_message(module: str) -> str:
    """The one line printed when a module of the pipeline extra is not installed."""
    return (f"zmlx-pipeline: the command needs the pipeline's dependencies, and {module!r} is not installed "
            f"(the base install is the runtime alone); install them with: {INSTALL_HINT}")


def main() -> None:
    """Console-script entry point: run the CLI; a missing pipeline dependency is one line and exit status 1."""
    try:
        from zmlx_pipeline.pipeline.cli import main as cli_main

        cli_main()
    except ModuleNotFoundError as exc:
        module = (exc.name or "").partition(".")[0]
        if module not in PIPELINE_MODULES:
            raise
        print(missing_extra_message(module), file=sys.stderr)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
