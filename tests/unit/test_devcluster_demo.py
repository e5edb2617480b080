"""`ghostgpu devcluster demo`'s parts that need no cluster: its controller config, how it reads the
decision log, and the situations it refuses before starting anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.controller.app import load_any_config
from ghostgpu.devcluster import demo, paths
from ghostgpu.devcluster.demo import FLEET, DemoError, controller_config, latest_decisions, preflight


def test_controller_config_is_a_valid_config_at_the_demos_pace(tmp_path: Path) -> None:
    for mode in ("shadow", "enforce"):
        ctrl = load_any_config(controller_config(tmp_path, "http://127.0.0.1:9090", mode)).controller
        assert (ctrl.mode, ctrl.window) == (mode, 3)
        assert ctrl.poll_interval.seconds == 2
        assert ctrl.long_window > 100  # no demo run reaches IDLE_HELD
        assert ctrl.process_source == "exec"  # no node agent runs in the demo: ps is exec'd


def test_latest_decisions_keeps_each_workloads_last_line(tmp_path: Path) -> None:
    log = tmp_path / "decisions.jsonl"
    lines = [
        {"kind": "poll", "poll": 1, "ts": 1.0},
        {"poll": 1, "workload": "Deployment/a/x", "verdict": "UNKNOWN", "reasons": ["insufficient-samples"]},
        {"poll": 1, "workload": "Deployment/a/y", "verdict": "ACTIVE", "reasons": []},
        {"kind": "poll", "poll": 2, "ts": 3.0},
        {"poll": 2, "workload": "Deployment/a/x", "verdict": "FINISHED_IDLE", "reasons": ["holders-only"]},
        {"kind": "left", "poll": 2, "workload": "Deployment/a/y"},
    ]
    log.write_text("\n".join(json.dumps(x) for x in lines) + '\n{"poll": 3, "workl')  # a line mid-write
    got = latest_decisions(log)
    assert {k: v["verdict"] for k, v in got.items()} == {
        "Deployment/a/x": "FINISHED_IDLE",
        "Deployment/a/y": "ACTIVE",
    }
    assert latest_decisions(tmp_path / "absent.jsonl") == {}


def test_fleet_has_both_kinds_of_ghost_and_live_work_that_looks_idle() -> None:
    by = {w.expect for w in FLEET}
    assert by == {"FINISHED_IDLE", "ZOMBIE_CRASHED", "ACTIVE"}
    # The Job waits behind the ghosts: it fits the real node only once they are gone.
    held = sum(w.box.gpus for w in FLEET)
    ghosts = sum(w.box.gpus for w in FLEET if w.expect != "ACTIVE")
    assert demo.REAL_NODE_GPUS - held < demo.JOB_GPUS <= demo.REAL_NODE_GPUS - held + ghosts
    assert len({w.key for w in FLEET}) == len(FLEET)


def test_not_root_is_said_before_anything_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(demo.os, "geteuid", lambda: 1000)
    with pytest.raises(DemoError, match="run it as root"):
        preflight()
    r = CliRunner().invoke(app, ["devcluster", "demo", "--state-dir", "/nonexistent/demo"])
    assert r.exit_code == 2
    assert "error: devcluster demo:" in r.output and "fix: run it as root" in r.output
    assert "Traceback" not in r.output


def test_missing_binaries_name_hack_testbin(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(demo.os, "geteuid", lambda: 0)
    monkeypatch.setattr(paths, "cache_root", lambda: tmp_path)  # an empty cache: nothing built
    with pytest.raises(DemoError, match=r"run hack/testbin"):
        preflight()
