"""models part of zmlx-pipeline (see DESIGN.md)."""
