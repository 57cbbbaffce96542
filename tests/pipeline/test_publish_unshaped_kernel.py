"""A Kernel Tuner file that names no problem size imports as one case of an empty shape; publish refuses such a
kernel in one line before any table is built (lookups find a kernel's answers by its shape) and leaves the publish
directory as it was, where it used to end in a traceback after building every other kernel's tables."""

import json

from click.testing import CliRunner

from zmlx_pipeline.pipeline.cli import cli


def _cache(path, kernel="kt_noshape"):
    entries = {f"{x},{y}": {"bx": x, "by": y, "time": 1 + x / 100 + y / 10, "times": [1.0] * 3}
               for x in (32, 64, 128) for y in (1, 2, 4)}
    path.write_text(json.dumps({"kernel_name": kernel, "device_name": "NVIDIA A100-PCIE-40GB",
                                "tune_params_keys": ["bx", "by"], "tune_params": {"bx": [32, 64, 128], "by": [1, 2, 4]},
                                "objective": "time", "cache": entries}))


def test_publish_refuses_a_kernel_of_no_problem_size_naming_it_and_the_fix(tmp_path):
    db, out = str(tmp_path / "s.duckdb"), tmp_path / "bundles"
    _cache(tmp_path / "noshape.json")
    run = CliRunner()
    assert run.invoke(cli, ["import", "--db", db, str(tmp_path / "noshape.json")]).exit_code == 0
    assert run.invoke(cli, ["train", "--db", db, "-k", "kt_noshape", "-j", "1"]).exit_code == 0
    result = run.invoke(cli, ["publish", "--db", db, "--to", str(out)])
    assert result.exit_code == 1 and "Traceback" not in result.output
    last = result.output.splitlines()[-1]
    assert last == ("Error: cannot publish kernel 'kt_noshape': it was measured at no problem size, and lookups find a "
                    "kernel's answers by its shape; import its files again with --problem-size (or a search-spaces "
                    "file beside them), or publish the other kernels with --kernel")
    assert not out.exists()
    again = tmp_path / "sized.json"
    _cache(again, kernel="kt_sized")
    assert run.invoke(cli, ["import", "--db", db, str(again), "--problem-size", "4096"]).exit_code == 0
    assert run.invoke(cli, ["train", "--db", db, "-k", "kt_sized", "-j", "1"]).exit_code == 0
    sized = run.invoke(cli, ["publish", "--db", db, "--to", str(out), "--kernel", "kt_sized",
                             "--device", "nvidia-a100-pcie-40gb"])
    assert sized.exit_code == 0, sized.output
