"""The optional extras: a missing one is named, with its pip extra, and exits 2 without a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ghostgpu.boundary import BoundaryError
from ghostgpu.cli import app
from ghostgpu.extras import require


def test_present_module_is_returned() -> None:
    assert require("json", "plot", "--plot") is sys.modules["json"]


def test_missing_module_names_the_extra() -> None:
    with pytest.raises(BoundaryError) as exc:
        require("ghostgpu_no_such_module", "plot", "--plot")
    error, fix = exc.value.lines
    assert error.startswith("error: --plot needs the 'ghostgpu_no_such_module' package")
    assert fix == "fix: pip install 'ghostgpu[plot]'"


def test_broken_dependency_of_a_present_module_is_not_hidden(monkeypatch: pytest.MonkeyPatch) -> None:
    """A module that exists but fails on its own import is a real error, not a missing extra."""

    def broken(name: str) -> None:
        raise ModuleNotFoundError("No module named 'inner'", name="inner")

    monkeypatch.setattr("importlib.import_module", broken)
    with pytest.raises(ModuleNotFoundError, match="inner"):
        require("matplotlib", "plot", "--plot")


def test_devcluster_without_kubernetes_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)  # an import of it now fails
    result = CliRunner().invoke(app, ["devcluster", "status"])
    assert result.exit_code == 2
    assert "pip install 'ghostgpu[devcluster]'" in result.output


def test_bench_scale_without_kubernetes_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    result = CliRunner().invoke(app, ["bench", "scale", "--sizes", "10"])
    assert result.exit_code == 2
    assert "ghostgpu bench scale needs the 'kubernetes' package" in result.output


def test_bench_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "window.png"
    result = CliRunner().invoke(app, ["bench", "--seeds", "1", "--instances", "20", "--plot", str(out)])
    assert result.exit_code == 2
    assert "--plot needs the 'matplotlib' package" in result.output
    assert "pip install 'ghostgpu[plot]'" in result.output
    assert not out.exists()
