// Test stub of the one MLX header a JIT-built custom kernel includes: just the types a
// generated signature names, so nvcc can compile the translation unit off the GPU machine.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda/std/array>
#include <cuda/std/limits>
#include <cstdint>
#define MAX_NDIM 10
namespace mlx::core::cu {
using Shape = cuda::std::array<int32_t, MAX_NDIM>;
using Strides = cuda::std::array<int64_t, MAX_NDIM>;
}
