"""docs/reference/ is generated from the code and current: every ghostgpu.yaml key has a type,
a default and a description; every metric the controller and the agent serve is listed with its
labels, and every rendered alert with what to do; every command and flag has its help text."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from pydantic import BaseModel, Field

from ghostgpu.config import ControllerConfig
from ghostgpu.reference import cli, config_keys, metrics

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "docs" / "reference"


def test_the_reference_pages_are_current() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "hack" / "gen-reference"), "--check"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr


def test_check_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import ghostgpu.reference as ref

    monkeypatch.setattr(ref, "OUT", tmp_path)
    monkeypatch.setattr(ref, "REPO", tmp_path.parent)
    assert ref.main([]) == 0
    assert ref.main(["--check"]) == 0
    (tmp_path / "cli.md").write_text("stale\n")
    assert ref.main(["--check"]) == 1


# --- ghostgpu.yaml keys ---------------------------------------------------------------------------


def test_every_key_of_the_file_is_described() -> None:
    keys = list(config_keys.all_keys())
    assert len(keys) > 150
    assert all(k.description for k in keys)
    paths = {k.path for k in keys}
    # every controller key, nested sections and list elements included
    assert {f"controller.{f.alias or n}" for n, f in ControllerConfig.model_fields.items()} <= paths
    assert {
        "teams[].quota.<key>.nominalQuota",
        "controller.alerts.for",
        "controller.actuators[].stop",
    } <= paths


def test_a_key_without_a_description_stops_the_generator() -> None:
    class Section(BaseModel):
        described: int = Field(1, description="has one")
        bare: int = 2

    with pytest.raises(ValueError, match="bare"):
        list(config_keys.all_keys(Section))


def test_defaults_come_from_the_section_default() -> None:
    """A preset's keys show the preset's values, not the bare model's (which has none)."""
    by_path = {k.path: k for k in config_keys.all_keys()}
    assert by_path["controller.metrics.dcgm.utilizationMetric"].default == "`DCGM_FI_DEV_GPU_UTIL`"
    assert by_path["controller.metrics.hami.podLabel"].default == "`podname`"
    assert by_path["controller.pollInterval"].default == "`60s`"
    assert by_path["flavors[].name"].default == "required"
    assert by_path["controller.mode"].type == "one of `shadow`, `enforce`"
    assert by_path["controller.replicas"].type == "integer (≥ 1, ≤ 10)"


# --- metrics and alerts ---------------------------------------------------------------------------


def test_families_carry_their_labels_before_any_series() -> None:
    registry = CollectorRegistry()
    Gauge("x_things", "Things.", ["team", "flavor"], registry=registry)
    Counter("x_events", "Events.", registry=registry)
    found = {f.name: f for f in metrics.families(registry)}
    assert found["x_things"].labels == ("team", "flavor")
    assert found["x_events_total"].type == "counter" and found["x_events_total"].labels == ()


def test_every_controller_and_agent_metric_is_on_the_page() -> None:
    page = (REFERENCE / "metrics.md").read_text()
    controller = {f.name: f for f in metrics.controller_families()}
    agent = {f.name: f for f in metrics.agent_families()}
    # the controller's own, the apiserver budget's and the reservation's share one registry
    assert {
        "ghostgpu_ghost_gpus",
        "ghostgpu_apiserver_budget_wait_seconds",
        "ghostgpu_reservation_gpus",
    } <= set(controller)
    assert controller["ghostgpu_ghost_gpus"].labels == ("namespace", "flavor", "verdict")
    # The tracked pod under labels of the agent's own: Prometheus sets namespace/pod from the target.
    assert agent["ghostgpu_agent_container_processes"].labels == (
        "tracked_namespace",
        "tracked_pod",
        "tracked_uid",
        "tracked_container",
        "role",
        "programs",
    )
    for name in [*controller, *agent]:
        assert f"`{name}`" in page


def test_every_rendered_alert_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    names = {r["alert"] for r in metrics.alerts()}
    assert names == {"GhostGpuIdleWorkload", "GhostGpuControllerDown", "GhostGpuIdleSessionWarned"}
    page = (REFERENCE / "metrics.md").read_text()
    assert all(f"### {n}" in page for n in names)
    monkeypatch.setattr(metrics, "WHAT_TO_DO", {"GhostGpuIdleWorkload": "x"})
    with pytest.raises(ValueError, match="GhostGpuControllerDown"):
        metrics.alerts()


# --- the command line -----------------------------------------------------------------------------


def test_every_command_and_flag_has_help_and_is_on_the_page() -> None:
    assert cli.missing_help() == []
    page = (REFERENCE / "cli.md").read_text()
    paths = [" ".join(p) for p, _ in cli.commands(cli.tree())]
    assert {"ghostgpu controller", "ghostgpu bench scale", "ghostgpu devcluster up"} <= set(paths)
    for path, command in cli.commands(cli.tree()):
        section = page.split(f"\n## {' '.join(path)}\n", 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            if param.hidden:
                continue
            assert f"`{param.opts[0] if param.opts[0].startswith('-') else param.name.upper()}`" in section


# --- where the pages are found --------------------------------------------------------------------


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_readme_links_every_reference_page_and_their_links_resolve() -> None:
    readme = (REPO / "README.md").read_text()
    for page in sorted(REFERENCE.glob("*.md")):
        assert f"(docs/reference/{page.name})" in readme
        for target in LINK.findall(page.read_text()):
            if "://" not in target:
                assert (page.parent / target).exists(), f"{page.name} -> {target}"
