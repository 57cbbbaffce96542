"""The ranker classes (base interface, baseline, pipeline, prior, alignment rule); models/variants.py names their configurations."""
