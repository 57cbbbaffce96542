// A stand-in for what MLX puts before every custom Metal kernel (metal::utils(): its kernels/utils.h,
// which includes bf16.h): <metal_stdlib>, `using namespace metal;` and the dtype names MLX's
// get_type_string writes into the signature (float16_t, bfloat16_t, int32_t ...).
#pragma once

#include <metal_stdlib>

using namespace metal;

typedef half float16_t;
typedef bfloat bfloat16_t;
