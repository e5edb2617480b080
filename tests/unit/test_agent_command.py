"""`ghostgpu agent` refuses what it cannot start with: one line naming the flag or the config key,
exit 2, no traceback, nothing started."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ghostgpu.agent.command import AgentArgError, parse_listen
from ghostgpu.cli import app

runner = CliRunner()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "9402"], "--listen '9402': expected HOST:PORT"),
        (["--listen", "0.0.0.0:http"], "expected HOST:PORT"),
        (["--listen", "0.0.0.0:70000"], "expected HOST:PORT"),
        (["--proc", "/nonexistent-proc"], "--proc /nonexistent-proc: not a readable proc root"),
        (["--interval", "0"], "--interval 0.0: expected seconds > 0"),
        (["--node-name", ""], "--node-name is empty"),
    ],
)
def test_bad_flags(args: list[str], message: str) -> None:
    r = runner.invoke(app, ["agent", "--node-name", "n1", *args])
    assert r.exit_code == 2, r.output
    assert message in r.output
    assert "Traceback" not in r.output


def test_a_bad_config_names_its_key(tmp_path: Path) -> None:
    cfg = tmp_path / "ghostgpu-controller.yaml"
    cfg.write_text("processes:\n  holdrs: [pause]\n")
    r = runner.invoke(app, ["agent", "--node-name", "n1", "--config", str(cfg)])
    assert r.exit_code == 2
    assert str(cfg) in r.output and "holdrs" in r.output
    assert "Traceback" not in r.output


def test_listen_forms() -> None:
    assert parse_listen("0.0.0.0:9402") == ("0.0.0.0", 9402)
    assert parse_listen(":9402") == ("0.0.0.0", 9402)
    assert parse_listen("[::]:9402") == ("::", 9402)
    with pytest.raises(AgentArgError):
        parse_listen("host:")
