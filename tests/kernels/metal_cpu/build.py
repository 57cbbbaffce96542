"""Turn the Metal source of one launch into a shared library that runs it on the CPU.

The translation unit is what MLX compiles (its utils header, here include/mlx_utils.h, then the
generated source), followed by the CPU runtime (include/zp_runtime.h) and a launcher that calls the
kernel with its buffers and its lane's position attributes. Two edits are made, both to what C++
cannot express: the explicit instantiation loses its Metal attributes, and each declaration of a
`threadgroup` variable (after preprocessing, so macros such as KSHARED are seen through) becomes a
reference to storage the runtime shares among the threadgroup's lanes (MSL §4.4). Libraries are cached
by the hash of their preprocessed text, so an unchanged source is compiled once per machine.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

INCLUDE = Path(__file__).with_name("include")

_AS3 = r"__attribute__\(\(address_space\(3\)\)\)"
# a threadgroup variable: at a statement's start, `[const] threadgroup [const] TYPE NAME [DIMS];`
# (no initialiser: MSL allows none, and one left here fails to compile, as on a Mac)
_TG_DECL = re.compile(
    r"(?<=[;{}])(?P<pre>\s*)(?P<q>(?:const\s+)?" + _AS3 + r"\s+(?:const\s+)?)"
    r"(?P<type>[A-Za-z_][\w:]*(?:\s*<[^;{}()]*?>)?)\s+(?P<name>[A-Za-z_]\w*)\s*(?P<dims>(?:\[[^\[\];]*\]\s*)*);"
)
_MARKER = "namespace zp_kernel_source_begins {}"

FLAGS = ("-std=c++17", "-O1", "-fPIC", "-shared", "-nostdlib++", "-fno-exceptions", "-fno-rtti",
         "-fno-sanitize=all", "-Wno-unknown-attributes", "-Werror=return-type")


class BuildError(RuntimeError):
    """The source did not compile (the compiler's first errors are the message)."""


def compiler() -> list[str] | None:
    """The C++ compiler command: zig's clang from the `ziglang` package (the `test` extra) when
    installed, for the same clang everywhere; else a clang++ on PATH; None without either."""
    if importlib.util.find_spec("ziglang") is not None:
        return [sys.executable, "-m", "ziglang", "c++"]
    found = shutil.which("clang++")
    return [found] if found else None


def target_flags(cmd: list[str]) -> list[str]:
    """zig's clang cross-compiles by default: ask for this machine with glibc (the Python process's libc)."""
    if "ziglang" in cmd:
        return ["-target", f"{platform.machine()}-linux-gnu"]
    return []


def cache_dir() -> Path:
    path = Path(os.environ.get("ZMLX_METAL_CPU_CACHE") or Path(tempfile.gettempdir()) / f"zmlx-metal-cpu-{os.getuid()}")
    path.mkdir(parents=True, exist_ok=True)
    return path


def launcher(kernel_call: str, params) -> str:
    """extern "C" zp_launch: the kernel called by every lane with its buffers (in MLX's buffer order) and attributes."""
    args = []
    k = 0
    for p in params:
        if p.kind == "attribute":
            args.append(f"zp::attr::{p.name}()")
            continue
        if p.ctype.endswith("&"):
            args.append(f"*({p.ctype[:-1]}*)zp_bufs[{k}]")
        else:
            args.append(f"({p.ctype})zp_bufs[{k}]")
        k += 1
    return (
        f"static void* zp_bufs[{max(k, 1)}];\n"
        "static void zp_body() {\n"
        f"  {kernel_call}(\n    " + ",\n    ".join(args) + ");\n}\n"
        'extern "C" int zp_launch(void** bufs, const long* grid, const long* tg, long tg_mem, char* err, int errlen) {\n'
        f"  for (int i = 0; i < {k}; ++i) zp_bufs[i] = bufs[i];\n"
        "  return zp::dispatch(zp_body, grid, tg, tg_mem, err, errlen);\n}\n"
    )


def translation_unit(metal_text: str, kernel_call: str, params) -> str:
    """The C++ source before preprocessing: MLX's prefix, the generated Metal source, runtime and launcher."""
    body = re.sub(r'\ntemplate \[\[host_name\("[^"]*"\)\]\] \[\[kernel\]\] decltype\(', "\ntemplate decltype(", metal_text)
    return ("#include <mlx_utils.h>\n" + _MARKER + "\n" + body + "\n#include <zp_runtime.h>\n"
            + launcher(kernel_call, params))


def share_threadgroup_declarations(preprocessed: str) -> str:
    """Each threadgroup variable of the kernel's source becomes a reference to the threadgroup's shared storage."""
    head, marker, tail = preprocessed.partition(_MARKER)
    if not marker:
        raise BuildError("preprocessed source lost its marker")
    sites = iter(range(1 << 30))

    def shared(m: re.Match) -> str:
        dims = re.sub(r"\s+", "", m["dims"])
        return (f"{m['pre']}{m['q']}{m['type']} (&{m['name']}){dims} = "
                f"*zp::tg_alloc<{m['type']}{dims}>({next(sites)});")

    return head + marker + _TG_DECL.sub(shared, tail)


def _run(cmd: list[str], what: str, text_in: str | None = None) -> str:
    # zig keeps the C runtime it links against in its global cache: one per machine, not per HOME
    env = {**os.environ, "ZIG_GLOBAL_CACHE_DIR": str(cache_dir() / "zig")}
    done = subprocess.run(cmd, input=text_in, capture_output=True, text=True, timeout=600, env=env)
    if done.returncode != 0:
        errors = [line for line in done.stderr.splitlines() if "error" in line] or done.stderr.splitlines()
        raise BuildError(f"{what}: " + " | ".join(errors[:4])[:1500])
    return done.stdout


def build(tu: str) -> Path:
    """The shared library of a translation unit (compiled once per preprocessed text, then cached)."""
    cmd = compiler()
    if cmd is None:
        raise BuildError("no C++ compiler: install the test extra (ziglang) or clang")
    base = cmd + target_flags(cmd) + ["-I", str(INCLUDE)]
    pre = _run(base + ["-std=c++17", "-x", "c++", "-E", "-P", "-"], "preprocess", tu)
    text = share_threadgroup_declarations(pre)
    key = hashlib.sha256("\0".join([text, *base, *FLAGS]).encode()).hexdigest()[:24]
    out = cache_dir() / f"{key}.so"
    if out.exists():
        return out
    src = out.with_suffix(f".{os.getpid()}.ii")
    src.write_text(text)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    try:
        _run(base + [*FLAGS, "-x", "c++", str(src), "-o", str(tmp)], "compile")
        os.replace(tmp, out)  # atomic: a concurrent build of the same text writes the same library
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return out
