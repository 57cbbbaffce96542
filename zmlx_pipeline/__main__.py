"""`python -m zmlx_pipeline` runs the CLI (for machines where the console script is not on PATH)."""

from zmlx_pipeline.pipeline.cli import main

main()
