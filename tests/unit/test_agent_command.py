"""`ghostgpu agent` refuses what it cannot start with: one line naming the flag or the config key,
exit 2, no traceback, nothing started."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ghostgpu.agent.command import Agent, AgentArgError, ScanFailed, parse_listen, settings
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


# --- the running agent ---------------------------------------------------------------------------


def _agent(tmp_path: Path) -> Agent:
    from ghostgpu.verdict import ProcessPolicy

    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "uptime").write_text("100.0 50.0\n")
    return Agent(object(), settings("node-a", proc, "127.0.0.1:0", 0.05), ProcessPolicy(), [])


def test_the_agent_watches_only_its_nodes_pods_that_can_run(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    assert agent.pods.field_selector == "spec.nodeName=node-a,status.phase!=Succeeded,status.phase!=Failed"
    gpu = {
        "metadata": {"namespace": "t", "name": "p", "uid": "u", "annotations": {"a": "b" * 1000}},
        "spec": {
            "nodeName": "node-a",
            "containers": [{"name": "c", "resources": {"limits": {"amd.com/gpu": 1}}}],
        },
        "status": {"phase": "Running"},
    }
    kept = agent.pods.transform(gpu)
    assert kept is not None and "annotations" not in kept["metadata"]
    assert agent.pods.transform({**gpu, "status": {"phase": "Succeeded"}}) is None


async def test_an_exception_in_a_scan_ends_the_agent_with_its_series(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The kubelet restarts it; until then its series are gone (missing: UNKNOWN), never stale.
    agent = _agent(tmp_path)
    agent.pods.synced.set()

    async def no_watch() -> None:
        await asyncio.Event().wait()

    monkeypatch.setattr(agent.pods, "run", no_watch)
    calls = []

    def scan(*args: object, **kw: object) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise RuntimeError("unexpected /proc")
        return real_scan(*args, **kw)

    from ghostgpu.agent import command

    real_scan = command.scan_node
    monkeypatch.setattr(command, "scan_node", scan)
    with pytest.raises(ScanFailed, match="RuntimeError: unexpected /proc"):
        await asyncio.wait_for(agent.run(max_scans=5), 10)
    assert len(calls) == 2
    assert agent.server._server is not None and not agent.server._server.is_serving()


def test_the_command_exits_non_zero_without_a_traceback_when_a_scan_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ghostgpu.agent import command

    async def failing_run(self: Agent, *, max_scans: int | None = None) -> None:
        raise ScanFailed("RuntimeError: unexpected /proc")

    async def no_api(kubeconfig: str | None) -> object:
        return object()

    monkeypatch.setattr(command.Agent, "run", failing_run)
    monkeypatch.setattr(command, "kube_api", no_api)
    proc = _agent(tmp_path).s.proc
    r = runner.invoke(app, ["agent", "--node-name", "n1", "--proc", str(proc), "--listen", "127.0.0.1:0"])
    assert r.exit_code == 1, r.output
    assert "scan failed: RuntimeError: unexpected /proc" in r.output
    assert "Traceback" not in r.output
