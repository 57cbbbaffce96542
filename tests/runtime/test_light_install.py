"""The base install is the runtime alone: a fresh virtual environment with `pip install zmlx-pipeline` (no extras)
gets none of the pipeline's heavy packages, answers lookups from the default bundle, and its `zmlx-pipeline`
command names the extra to install in one line.

Needs `python -m venv` and a package index (or pip's cache) for MLX and the build backend; skipped when either
is missing. 15-25 s on 2 cores with pip's cache warm; 100 s the first time on a busy 2-core machine.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bundle_fixtures import REPO

#: distributions the pipeline extra brings, and the modules they install
HEAVY = {"duckdb": "duckdb", "polars": "polars", "scikit-learn": "sklearn", "skops": "skops",
         "matplotlib": "matplotlib", "pyarrow": "pyarrow"}
#: what pip prints when it cannot reach an index (then the test is skipped, not failed)
OFFLINE = ("NewConnectionError", "Temporary failure in name resolution", "No matching distribution found",
           "Could not find a version that satisfies", "Network is unreachable", "ConnectionError")

PROBE = r"""
import importlib.metadata as md, importlib.util, json, sys
from zmlx_pipeline.runtime import predicted_config
heavy = json.loads(sys.argv[1])
p = predicted_config("rmsnorm", {"rows": 4096, "cols": 4096}, "float16", device="nvidia-h100-sxm")
print(json.dumps({
    "installed": sorted({x.metadata["Name"].lower() for x in md.distributions()} & set(heavy)),
    "importable": sorted(m for m in heavy.values() if importlib.util.find_spec(m) is not None),
    "config": p.config, "evidence": p.evidence, "bundle_id": p.bundle_id,
    "location": __import__("zmlx_pipeline").__file__,
    "heavy_loaded": sorted(m for m in heavy.values() if m in sys.modules),
}))
"""


def _run(args, cwd, timeout=600):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "ZMLX_PIPELINE_BUNDLE", "VIRTUAL_ENV")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def light_venv(tmp_path_factory) -> Path:
    """A fresh venv holding zmlx-pipeline installed from a copy of this tree without extras."""
    root = tmp_path_factory.mktemp("light")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    shutil.copytree(REPO / "zmlx_pipeline", src / "zmlx_pipeline",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    venv = root / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], cwd=root, timeout=300)
    if made.returncode != 0:
        pytest.skip(f"cannot create a virtual environment: {made.stderr.strip().splitlines()[-1:]}")
    python = venv / "bin" / "python"
    installed = _run([str(python), "-m", "pip", "install", "--quiet", str(src)], cwd=root)
    if installed.returncode != 0:
        output = installed.stdout + installed.stderr
        if any(sign in output for sign in OFFLINE):
            pytest.skip("no package index reachable to install MLX and the build backend")
        pytest.fail(f"pip install of the base package failed:\n{output[-3000:]}")
    return venv


def test_the_base_install_brings_none_of_the_pipeline_packages_and_answers_from_the_default_bundle(light_venv):
    run = light_venv.parent / "run"  # not the repository: the venv's package, not this tree's, is imported
    run.mkdir(exist_ok=True)
    probe = _run([str(light_venv / "bin" / "python"), "-c", PROBE, json.dumps(HEAVY)], cwd=run, timeout=120)
    assert probe.returncode == 0, probe.stderr
    out = json.loads(probe.stdout.strip().splitlines()[-1])
    assert out["installed"] == [] and out["importable"] == [] and out["heavy_loaded"] == []
    assert Path(out["location"]).is_relative_to(light_venv)
    assert out["evidence"] in ("measured", "predicted") and out["config"] and out["bundle_id"]
    shipped = json.loads((REPO / "zmlx_pipeline" / "runtime" / "default_bundle" / "manifest.json").read_text())
    assert out["bundle_id"] == shipped["bundle_id"]


def test_the_command_in_a_base_install_names_the_extra_in_one_line(light_venv):
    run = light_venv.parent / "run"
    run.mkdir(exist_ok=True)
    for args in (["lookup", "rmsnorm", "--shape", "rows=4096,cols=4096", "--dtype", "float16"], ["--help"]):
        done = _run([str(light_venv / "bin" / "zmlx-pipeline"), *args], cwd=run, timeout=120)
        assert done.returncode == 1
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        assert "pip install 'zmlx-pipeline[pipeline]'" in lines[0] and "'click' is not installed" in lines[0]
        assert done.stdout == ""
