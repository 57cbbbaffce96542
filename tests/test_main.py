"""The `zmlx-pipeline` entry point: the CLI when the pipeline extra is installed, one line naming it when not."""

import subprocess
import sys

import pytest

from zmlx_pipeline import __main__ as entry


def _without(monkeypatch, module: str) -> None:
    """This process as if `module` were not installed (None in sys.modules makes its import fail)."""
    for name in [n for n in sys.modules if n == "zmlx_pipeline.pipeline.cli" or n == module or n.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, module, None)


@pytest.mark.parametrize("module", ["click", "duckdb"])
def test_a_missing_pipeline_package_is_one_line_naming_the_extra(monkeypatch, capsys, tmp_path, module):
    if module == "duckdb":  # the CLI imports duckdb only inside a command: run one that opens the store
        monkeypatch.setattr(sys, "argv", ["zmlx-pipeline", "summary", "--db", str(tmp_path / "store.duckdb")])
        if "zmlx_pipeline.data.store" in sys.modules:
            monkeypatch.delitem(sys.modules, "zmlx_pipeline.data.store")
        monkeypatch.setitem(sys.modules, "duckdb", None)
    else:
        monkeypatch.setattr(sys, "argv", ["zmlx-pipeline", "devices"])
        _without(monkeypatch, module)
    with pytest.raises(SystemExit) as exit_:
        entry.main()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"{module!r} is not installed" in err and "pip install 'zmlx-pipeline[pipeline]'" in err


def test_a_missing_module_outside_the_extra_is_not_blamed_on_it(monkeypatch):
    monkeypatch.setattr(sys, "argv", ["zmlx-pipeline", "devices"])
    _without(monkeypatch, "zmlx_pipeline.pipeline.cli")
    with pytest.raises(ModuleNotFoundError):
        entry.main()


def test_python_dash_m_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "zmlx_pipeline", "--help"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Usage: zmlx-pipeline" in done.stdout


def test_a_warning_of_the_command_is_one_line(tmp_path):
    """A warning (a strict lookup falling back to a cached bundle, say) prints as one `Warning:` line, not Python's
    file:line header and source line."""
    script = ("import warnings, sys\n"
              "from zmlx_pipeline.pipeline import cli\n"
              "from zmlx_pipeline.pipeline.cli_common import OneValueCommand\n"
              "cli.cli.add_command(OneValueCommand('warn', callback=lambda: warnings.warn('server down;\\n"
              "using the cached copy', UserWarning)))\n"
              "sys.argv = ['zmlx-pipeline', 'warn']\n"
              "cli.main()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr == "Warning: server down; using the cached copy\n"
