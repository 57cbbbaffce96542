"""zmlx-pipeline: measure custom MLX kernels, learn their best launch configs, publish them."""

__version__ = "0.1.0"
