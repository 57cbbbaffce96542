"""The exact Metal source `mx.fast.metal_kernel` builds for one launch (MLX's write_signature and
template instantiation, mlx/backend/metal/custom_kernel.cpp), before MLX prepends its utils header."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: MLX's get_type_string for the dtypes kernels here use
TYPE_STRINGS = {"float32": "float", "float16": "float16_t", "bfloat16": "bfloat16_t", "int32": "int32_t", "uint32": "uint32_t"}

#: inputs of fewer elements go to the `constant` address space (MLX: max_constant_array_size)
MAX_CONSTANT_ARRAY_SIZE = 8

#: the attributes MLX declares for the kernel when their name appears in `source`, in its order
METAL_ATTRIBUTES = (
    ("dispatch_quadgroups_per_threadgroup", "uint"),
    ("dispatch_simdgroups_per_threadgroup", "uint"),
    ("dispatch_threads_per_threadgroup", "uint3"),
    ("grid_origin", "uint3"),
    ("grid_size", "uint3"),
    ("quadgroup_index_in_threadgroup", "uint"),
    ("quadgroups_per_threadgroup", "uint"),
    ("simdgroup_index_in_threadgroup", "uint"),
    ("simdgroups_per_threadgroup", "uint"),
    ("thread_execution_width", "uint"),
    ("thread_index_in_quadgroup", "uint"),
    ("thread_index_in_simdgroup", "uint"),
    ("thread_index_in_threadgroup", "uint"),
    ("thread_position_in_grid", "uint3"),
    ("thread_position_in_threadgroup", "uint3"),
    ("threadgroup_position_in_grid", "uint3"),
    ("threadgroups_per_grid", "uint3"),
    ("threads_per_grid", "uint3"),
    ("threads_per_simdgroup", "uint"),
    ("threads_per_threadgroup", "uint3"),
)


@dataclass(frozen=True)
class Param:
    """One parameter of the generated kernel, in buffer order: what the launch binds to it."""

    name: str
    kind: str  # "input", "shape", "strides", "ndim", "output" or "attribute"
    array: int = -1  # index of the input or output it belongs to
    ctype: str = ""  # the C type MLX writes


def kernel_name(name: str, template: list[tuple[str, object]]) -> str:
    """custom_kernel_<name>_<template args>, as MLX names it."""
    if not template:
        return f"custom_kernel_{name}"
    return f"custom_kernel_{name}_" + re.sub(r"<|>|(, )", "_", write_template(template))[:-1]


def write_template(template: list[tuple[str, object]]) -> str:
    parts = []
    for _, arg in template:
        if isinstance(arg, bool):
            parts.append(str(int(arg)))
        elif isinstance(arg, int):
            parts.append(str(arg))
        else:
            parts.append(TYPE_STRINGS[arg])
    return "<" + ", ".join(parts) + ">"


def metal_source(name, input_names, inputs, output_names, output_dtypes, source, header, template,
                 atomic_outputs=False) -> tuple[str, list[Param]]:
    """(the text MLX compiles after its utils header, the kernel's parameters in buffer order).

    `inputs` are (dtype, shape) of each input array; `template` is [(name, int | bool | dtype name)].
    """
    kname = kernel_name(name, template)
    params: list[Param] = []
    text = header
    if template:
        kinds = ["bool" if isinstance(a, bool) else "int" if isinstance(a, int) else "typename" for _, a in template]
        text += "template <" + ", ".join(f"{k} {n}" for k, (n, _) in zip(kinds, template)) + ">\n"
    text += f"[[kernel]] void {kname}(\n"
    index = 0
    for i, (iname, (dtype, shape)) in enumerate(zip(input_names, inputs)):
        size = 1
        for d in shape:
            size *= d
        location = "constant" if size < MAX_CONSTANT_ARRAY_SIZE else "device"
        ref = "&" if len(shape) == 0 else "*"
        ctype = f"const {location} {TYPE_STRINGS[dtype]}{ref}"
        text += f"  {ctype} {iname} [[buffer({index})]],\n"
        params.append(Param(iname, "input", i, ctype))
        index += 1
        if shape:
            for suffix, kind, ctype in (("_shape", "shape", "const constant int*"), ("_strides", "strides", "const constant int64_t*"),
                                        ("_ndim", "ndim", "const constant int&")):
                if iname + suffix in source:
                    text += f"  {ctype} {iname}{suffix} [[buffer({index})]],\n"
                    params.append(Param(iname + suffix, kind, i, ctype))
                    index += 1
    attributes = [(a, t) for a, t in METAL_ATTRIBUTES if a in source]
    for i, (oname, dtype) in enumerate(zip(output_names, output_dtypes)):
        tstr = f"atomic<{TYPE_STRINGS[dtype]}>" if atomic_outputs else TYPE_STRINGS[dtype]
        text += f"  device {tstr}* {oname} [[buffer({index})]]"
        params.append(Param(oname, "output", i, f"device {tstr}*"))
        text += ",\n" if (index < len(inputs) + len(output_names) - 1 or attributes) else ") {\n"
        index += 1
    for j, (attr, atype) in enumerate(attributes):
        text += f"  {atype} {attr} [[{attr}]]"
        params.append(Param(attr, "attribute", -1, atype))
        text += ",\n" if j < len(attributes) - 1 else ") {\n"
    text += source + "\n}\n"
    if template:
        tdef = kname + write_template(template)
        text += f'\ntemplate [[host_name("{kname}")]] [[kernel]] decltype({tdef}) {tdef};\n'
    return text, params
