"""An external kernel (module:attr, entry point) may not take a built-in kernel's name unless it is that kernel."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from zmlx_pipeline.kernels.registry import UnknownKernel, get_kernel


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module `f12_user_kernels` holding the README's row_scale kernel renamed several ways, and rmsnorm itself."""
    (tmp_path / "f12_user_kernels.py").write_text(textwrap.dedent('''
        import dataclasses

        from zmlx_pipeline.kernels.builtin.rmsnorm import SPEC as RMSNORM

        ROW_SCALE = dataclasses.replace(RMSNORM, name="row_scale", description="a user's own kernel")
        SAME_NAME = dataclasses.replace(RMSNORM, description="a user's own kernel")
        UPPER = dataclasses.replace(RMSNORM, name="RMSNorm", description="a user's own kernel")
        SPACED = dataclasses.replace(RMSNORM, name=" rms norm", description="a user's own kernel")
        FULLWIDTH = dataclasses.replace(RMSNORM, name="\\uff52\\uff4d\\uff53\\uff4e\\uff4f\\uff52\\uff4d",
                                        description="a user's own kernel")
        ITSELF = RMSNORM
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield "f12_user_kernels"
    sys.modules.pop("f12_user_kernels", None)


@pytest.mark.parametrize("attr, name", [
    ("SAME_NAME", "'rmsnorm'"),
    ("UPPER", "'RMSNorm'"),
    ("SPACED", "' rms norm'"),
    ("FULLWIDTH", "'ｒｍｓｎｏｒｍ'"),
])
def test_a_user_kernel_named_as_a_builtin_is_refused(user_module, attr, name):
    with pytest.raises(UnknownKernel) as exc:
        get_kernel(f"{user_module}:{attr}")
    assert str(exc.value) == (
        f"'{user_module}:{attr}' is a kernel named {name}, the name of the built-in kernel 'rmsnorm' (names that "
        "differ only in case, white space or Unicode compatibility form are one name): give it a name of its own")


def test_a_user_kernel_of_its_own_name_or_the_builtin_itself_loads(user_module):
    assert get_kernel(f"{user_module}:ROW_SCALE").name == "row_scale"
    assert get_kernel(f"{user_module}:ITSELF") is get_kernel("rmsnorm")
