"""MoE combine: y[t, :] = sum_j w[t, j] * expert_out[t, j, :], accumulated in float32.

expert_out is [tokens, k, hidden] and w is [tokens, k], both in the kernel's dtype T (as the
router weights are once a model casts them to the activation dtype); y is [tokens, hidden].

Layout: a threadgroup holds ROWS tokens, S = TG / ROWS threads per token, and each thread owns
VEC contiguous hidden elements (one vector load per expert, one vector store). The grid's x
axis counts token groups, its y axis the hidden tiles of S * VEC elements, so a decode-sized
problem still spreads over many threadgroups. No threadgroup memory, no barriers.
"""

from __future__ import annotations

from zmlx_pipeline.kernels.spec import Feature, KernelSpec, Launch, load_grid

BODY = r"""
  constexpr int S = TG / ROWS;
  const int tokens = expert_out_shape[0];
  const int k = expert_out_shape[1];
  const int hidden = expert_out_shape[2];
  const int tid = (int)k_tid;
  const int tok = (int)k_block_x * ROWS + tid / S;
  const int col = ((int)k_block_y * S + tid % S) * VEC;
  if (tok >= tokens || col >= hidden) return;
  float acc[VEC];
  for (int i = 0; i < VEC; ++i) acc[i] = 0.0f;
  const size_t wbase = (size_t)tok * (size_t)k;
  for (int j = 0; j < k; ++j) {
    const float wj = static_cast<float>(w[wbase + j]);
    float v[VEC];
    k_load<VEC>(expert_out + ((wbase + j) * (size_t)hidden + col), v);
    for (int i = 0; i < VEC; ++i) acc[i] += wj * v[i];
  }
  k_store<VEC>(y + ((size_t)tok * (size_t)hidden + col), acc);
"""

PARAMS = {"TG": (32, 64, 128, 256, 512, 1024), "VEC": (1, 2, 4, 8), "ROWS": (1, 2, 4)}

CONSTRAINTS = (
    "TG <= max_threads",
    "TG % ROWS == 0",
    "hidden % VEC == 0",
    "VEC * dtype_bytes <= 16",
    # no thread of a token without hidden elements in the first tile
    "(TG // ROWS) * VEC <= hidden",
    "ROWS <= tokens",
)


def launch(config, shape):
    """x: token groups (whole threadgroups, as MLX counts threads); y: hidden tiles of S * VEC."""
    s = config["TG"] // config["ROWS"]
    groups = -(-shape["tokens"] // config["ROWS"])
    tiles = -(-shape["hidden"] // (s * config["VEC"]))
    return Launch(grid=(groups * config["TG"], tiles, 1), threadgroup=(config["TG"], 1, 1),
                  output_shapes=((shape["tokens"], shape["hidden"]),))


def make_inputs(shape, dtype, key):
    import mlx.core as mx

    t, k, h = shape["tokens"], shape["k"], shape["hidden"]
    k1, k2 = mx.random.split(key)
    expert_out = mx.random.normal((t, k, h), key=k1).astype(dtype)
    w = mx.softmax(mx.random.normal((t, k), key=k2), axis=-1).astype(dtype)
    return [expert_out, w]


def reference(inputs, shape):
    import mlx.core as mx

    expert_out, w = (a.astype(mx.float32) for a in inputs)
    return [mx.sum(expert_out * w[:, :, None], axis=1)]


def mlx_op(inputs, shape):
    """What an MLX MoE block (SwitchGLU users in mlx-lm) does: scale and sum over the k axis."""
    import mlx.core as mx

    expert_out, w = inputs
    return [mx.sum(expert_out * w[:, :, None], axis=-2)]


SPEC = KernelSpec(
    name="moe_combine",
    description="MoE combine: weighted sum of the k expert outputs per token",
    kernel_class="moe_combine",
    inputs=("expert_out", "w"),
    outputs=("y",),
    body=BODY,
    params=PARAMS,
    constraints=CONSTRAINTS,
    shape_grid=load_grid("moe_combine"),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, b: (s["tokens"] * s["k"] * s["hidden"] + s["tokens"] * s["k"]
                              + s["tokens"] * s["hidden"]) * b,
    flops=lambda s: 2.0 * s["tokens"] * s["k"] * s["hidden"],
    mlx_op=mlx_op,
    # the threadgroups launched (token groups x hidden tiles); kept out of the per-device models,
    # as for the other kernels that declare one (notes/learning.md)
    features={"threadgroups": Feature("-(-tokens // ROWS) * -(-hidden // ((TG // ROWS) * VEC))",
                                      per_device=False)},
)
