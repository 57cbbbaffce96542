"""Standard-library pieces that kernels/, runtime/ and the pipeline share, so none of them imports another for them.

`errors` (the one base error), `constraints` (the constraint grammar and device `Limits`), `keys`
(canonical identities), `dtypes` (element sizes), `files` (atomic writes), `chips` (which devices may share a
name), `providers` (how the runtime reaches kernel specs and the measuring harness that kernels/ registers).
Standard library only.
"""
