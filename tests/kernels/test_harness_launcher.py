"""Launcher: one MLX kernel object per dynamic shared-memory size, each config launched with its own (no GPU needed)."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")

from zmlx_pipeline.kernels.harness import Launcher  # noqa: E402
from zmlx_pipeline.kernels.registry import get_kernel  # noqa: E402


class FakeFactory:
    """Stands in for mx.fast.cuda_kernel / metal_kernel: records each kernel object made and each launch."""

    def __init__(self):
        self.made = []
        self.launches = []

    def __call__(self, **kwargs):
        self.made.append(kwargs)
        smem = kwargs.get("shared_memory", 0)
        return lambda **launch: self.launches.append((smem, launch)) or ["out"]


@pytest.fixture
def factory(monkeypatch):
    fake = FakeFactory()
    monkeypatch.setattr(mx.fast, "cuda_kernel", fake, raising=False)
    monkeypatch.setattr(mx.fast, "metal_kernel", fake, raising=False)
    return fake


SHAPE = {"M": 256, "N": 512, "K": 512}
SMALL = {"TG": 128, "BM": 128, "BN": 128, "BK": 32, "WM": 2, "WN": 2, "STAGES": 2}


def test_cuda_launches_carry_their_ring_as_dynamic_shared_memory(factory):
    launcher = Launcher(get_kernel("matmul"), "cuda")
    launcher.bind(SMALL, SHAPE, "float16")([1, 2])
    launcher.bind({**SMALL, "STAGES": 4}, SHAPE, "float16")([1, 2])
    launcher.bind({**SMALL, "BM": 64}, SHAPE, "float16")([1, 2])
    launcher.bind(SMALL, SHAPE, "float16")([1, 2])
    # 2 x (128 x 40 + 32 x 136) x 2 bytes, twice that in a 4-deep ring, and a 64-row block's ring
    assert [smem for smem, _ in factory.launches] == [37888, 75776, 27648, 37888]
    # one object per size (plus the size-0 one made up front), every one of the same name and source
    assert sorted(k.get("shared_memory", 0) for k in factory.made) == [0, 27648, 37888, 75776]
    assert len({(k["name"], k["source"], k["header"]) for k in factory.made}) == 1
    assert factory.launches[1][1]["template"][-1] == ("STAGES", 4)


def test_metal_and_static_kernels_ask_for_none(factory):
    Launcher(get_kernel("matmul"), "metal").bind(SMALL, SHAPE, "float16")([1, 2])
    Launcher(get_kernel("rmsnorm"), "cuda").bind(
        {"TG": 256, "VEC": 4, "ROWS": 1}, {"rows": 8, "cols": 4096}, "float16")([1, 2])
    assert [smem for smem, _ in factory.launches] == [0, 0]
    assert all("shared_memory" not in k for k in factory.made)
