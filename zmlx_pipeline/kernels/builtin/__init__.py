"""The built-in instrumented kernels: one module each, each exposing `SPEC`."""

#: module names under this package, in the order listings show them
BUILTIN = (
    "rmsnorm",
    "add_rmsnorm",
    "layernorm",
    "softmax",
    "swiglu",
    "topk_gating",
    "moe_combine",
    "matmul",
)
