"""The generated sources: Metal text pinned by golden files (nothing compiles Metal here), no token crossing backends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from zmlx_pipeline.kernels import prelude
from zmlx_pipeline.kernels.builtin import BUILTIN
from zmlx_pipeline.kernels.registry import get_kernel
from zmlx_pipeline.kernels.spec import KernelSpecError

GOLDEN = Path(__file__).with_name("golden")


def metal_text(spec) -> str:
    return "// ---- header ----\n" + spec.header("metal") + "\n// ---- source ----\n" + spec.source("metal")


@pytest.mark.parametrize("name", BUILTIN)
def test_metal_source_matches_golden(name):
    """Regenerate with ZMLX_UPDATE_GOLDEN=1 after a deliberate change, and review the diff."""
    spec = get_kernel(name)
    path = GOLDEN / f"{name}.metal"
    text = metal_text(spec)
    if os.environ.get("ZMLX_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"no golden file {path.name}: run with ZMLX_UPDATE_GOLDEN=1"
    assert text == path.read_text()


@pytest.mark.parametrize("name", BUILTIN)
def test_no_cuda_token_in_metal_and_no_metal_token_in_cuda(name):
    spec = get_kernel(name)
    assert prelude.foreign_tokens(spec.header("metal") + spec.source("metal"), "metal") == []
    assert prelude.foreign_tokens(spec.header("cuda") + spec.source("cuda"), "cuda") == []


@pytest.mark.parametrize("name", BUILTIN)
def test_metal_source_names_the_attributes_it_uses(name):
    """metal_kernel adds an attribute parameter only when its name appears in `source`, not `header`."""
    source = get_kernel(name).source("metal")
    for attr in ("thread_position_in_threadgroup", "threadgroup_position_in_grid",
                 "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup"):
        assert attr in source


@pytest.mark.parametrize("name", BUILTIN)
def test_both_sources_share_one_body(name):
    spec = get_kernel(name)
    assert spec.source("metal").endswith(spec.body) and spec.source("cuda").endswith(spec.body)


def test_a_body_with_a_cuda_token_is_refused():
    spec = get_kernel("rmsnorm")
    with pytest.raises(KernelSpecError, match="__syncthreads"):
        spec.replace(body=spec.body.replace("KBARRIER()", "__syncthreads()"))


def test_version_changes_with_the_body_and_not_otherwise():
    spec = get_kernel("rmsnorm")
    same = spec.replace()
    changed = spec.replace(body=spec.body + "\n")
    assert same.version == spec.version
    assert changed.version != spec.version
