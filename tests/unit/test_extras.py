"""The optional extras: a missing one is named, with its pip extra, and exits 1 without a traceback."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.extras import require


def test_present_module_is_returned() -> None:
    assert require("json", "plot", "--plot") is sys.modules["json"]


def test_missing_module_names_the_extra(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(typer.Exit) as exc:
        require("ghostgpu_no_such_module", "plot", "--plot")
    assert exc.value.exit_code == 1
    err = capsys.readouterr().err
    assert "--plot needs the 'ghostgpu_no_such_module' package" in err
    assert "pip install 'ghostgpu[plot]'" in err


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
    assert result.exit_code == 1
    assert "pip install 'ghostgpu[devcluster]'" in result.output


def test_bench_scale_without_kubernetes_client(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "kubernetes", None)
    result = CliRunner().invoke(app, ["bench", "scale", "--sizes", "10"])
    assert result.exit_code == 1
    assert "ghostgpu bench scale needs the 'kubernetes' package" in result.output


def test_bench_plot_without_matplotlib(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    out = tmp_path / "window.png"
    result = CliRunner().invoke(app, ["bench", "--seeds", "1", "--instances", "20", "--plot", str(out)])
    assert result.exit_code == 1
    assert "--plot needs the 'matplotlib' package" in result.output
    assert "pip install 'ghostgpu[plot]'" in result.output
    assert not out.exists()
