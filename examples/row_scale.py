"""A kernel from outside zmlx-pipeline: y[r, c] = x[r, c] * s[r], tunable in threadgroup size and vector width."""

from zmlx_pipeline.kernels.spec import KernelSpec, Launch, ShapeGrid

BODY = r"""
  const int rows = x_shape[0];
  const int cols = x_shape[1];
  const size_t i = ((size_t)k_block_x * TG + k_tid) * VEC;
  if (i < (size_t)rows * (size_t)cols) {
    float v[VEC];
    k_load<VEC>(x + i, v);
    const float scale = static_cast<float>(s[i / cols]);
    for (int j = 0; j < VEC; ++j) v[j] *= scale;
    k_store<VEC>(y + i, v);
  }
"""


def launch(config, shape):
    n = shape["rows"] * shape["cols"] // config["VEC"]
    groups = -(-n // config["TG"])
    return Launch(grid=(groups * config["TG"], 1, 1), threadgroup=(config["TG"], 1, 1),
                  output_shapes=((shape["rows"], shape["cols"]),))


def make_inputs(shape, dtype, key):
    import mlx.core as mx

    k1, k2 = mx.random.split(key)
    return [mx.random.normal((shape["rows"], shape["cols"]), key=k1).astype(dtype),
            mx.random.uniform(0.5, 2.0, (shape["rows"],), key=k2).astype(dtype)]


def reference(inputs, shape):
    import mlx.core as mx

    x, s = (a.astype(mx.float32) for a in inputs)
    return [x * s[:, None]]


SPEC = KernelSpec(
    name="row_scale",
    description="scale each row by its own factor",
    kernel_class="elementwise",
    inputs=("x", "s"),
    outputs=("y",),
    body=BODY,
    params={"TG": (64, 128, 256, 512), "VEC": (1, 2, 4)},
    constraints=("TG <= max_threads", "cols % VEC == 0", "VEC * dtype_bytes <= 16"),
    shape_grid=ShapeGrid(["rows", "cols"], {"smoke": {"rows": [16, 4096], "cols": [4096]}}),
    launch=launch,
    make_inputs=make_inputs,
    reference=reference,
    bytes_moved=lambda s, b: (2 * s["rows"] * s["cols"] + s["rows"]) * b,
)
