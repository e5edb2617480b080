"""The ghostgpu.yaml model: the embedded example, quantities, durations, controller section."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from ghostgpu.config import (
    ControllerConfig,
    GhostgpuConfig,
    MetricsPreset,
    load_config_text,
    load_default_config,
)
from ghostgpu.quantity import Duration, Quantity, parse_duration, parse_quantity

MINIMAL = """
flavors:
  - name: h100
    resource: nvidia.com/gpu
teams:
  - name: research
    quota: {h100: 4}
"""


def test_embedded_example_has_the_shape_the_issue_asks_for() -> None:
    cfg = load_default_config()
    resources = cfg.gpu_resources
    assert "nvidia.com/gpu" in resources
    assert any(r.startswith("nvidia.com/mig-") for r in resources), "a MIG profile is its own resource"
    assert all(f.node_labels for f in cfg.flavors)
    assert all(f.node_taints and f.tolerations for f in cfg.flavors)
    assert len(cfg.teams) == 3
    assert {t.cohort for t in cfg.teams} == {cfg.cohorts[0].name}, "three teams share one cohort"
    quotas = [q for t in cfg.teams for q in t.quota.values()]
    assert any(q.borrowing_limit is not None for q in quotas)
    assert any(q.lending_limit is not None for q in quotas)
    assert all(t.fair_sharing is not None for t in cfg.teams)
    assert len({t.fair_sharing.weight for t in cfg.teams if t.fair_sharing}) > 1
    assert {t.preemption.reclaim_within_cohort for t in cfg.teams} != {"Never"}
    assert cfg.priority_classes
    assert any(t.namespace_quota for t in cfg.teams)
    assert cfg.namespaces
    assert cfg.controller.mode == "shadow"


def test_minimal_config_gets_safe_defaults() -> None:
    cfg = load_config_text(MINIMAL)
    ctrl = cfg.controller
    assert ctrl.mode == "shadow"
    assert ctrl.replicas == 2
    assert ctrl.window == 5
    assert ctrl.poll_interval.seconds == 60
    assert ctrl.metrics.preset == "dcgm"
    assert ctrl.metrics.active.utilization_metric == "DCGM_FI_DEV_GPU_UTIL"
    assert ctrl.actions.reclaim.allows("FINISHED_IDLE")
    assert ctrl.actions.reclaim.allows("ZOMBIE_CRASHED")
    assert not ctrl.actions.reclaim.allows("UNKNOWN")
    assert not ctrl.actions.reclaim.allows("IDLE_HELD")
    assert ctrl.alerts.utilization_below_percent == 10
    assert ctrl.alerts.framebuffer_below.value == 500 * 2**20
    assert ctrl.alerts.for_.seconds == 3600
    assert cfg.kueue.fair_sharing.enabled


def test_shorthand_quota_equals_explicit_nominal_quota() -> None:
    short = load_config_text(MINIMAL)
    explicit = load_config_text(MINIMAL.replace("{h100: 4}", "{h100: {nominalQuota: 4}}"))
    assert short.teams[0].quota == explicit.teams[0].quota


def test_reclaim_switches_can_be_turned_off_per_verdict() -> None:
    cfg = load_config_text(MINIMAL + "controller:\n  actions:\n    reclaim: {ZOMBIE_CRASHED: false}\n")
    assert cfg.controller.actions.reclaim.allows("FINISHED_IDLE")
    assert not cfg.controller.actions.reclaim.allows("ZOMBIE_CRASHED")


def test_hami_preset_switches_metric_names_and_labels() -> None:
    cfg = load_config_text(MINIMAL + "controller:\n  metrics: {preset: hami}\n")
    active = cfg.controller.metrics.active
    assert active.utilization_metric == "Device_utilization_desc_of_container"
    assert active.framebuffer_metric == "vGPU_device_memory_usage_in_bytes"
    assert (active.namespace_label, active.pod_label) == ("podnamespace", "podname")


def test_dcgm_label_mapping_can_follow_exported_labels() -> None:
    # Overriding two fields keeps the rest of the built-in preset.
    text = MINIMAL + (
        "controller:\n  metrics:\n    dcgm: {namespaceLabel: exported_namespace, podLabel: exported_pod}\n"
    )
    preset = load_config_text(text).controller.metrics.active
    assert preset.utilization_metric == "DCGM_FI_DEV_GPU_UTIL"
    query = preset.render_query("utilization", [("team-a", "nb-0")])
    assert query.startswith("max by (exported_namespace, exported_pod) (max_over_time(DCGM_FI_DEV_GPU_UTIL{")
    # read only from dcgm-exporter's scrape, the busiest sample of the window
    assert '{job=~"nvidia-dcgm-exporter|dcgm-exporter", ' in query and query.endswith("[1m]))")
    assert 'exported_namespace=~"team-a"' in query
    assert 'exported_pod=~"nb-0"' in query


def test_batched_query_covers_every_tracked_pod_once() -> None:
    preset = load_default_config().controller.metrics.dcgm
    pods = [("ns-b", "trainer-1"), ("ns-a", "nb.0"), ("ns-a", "trainer-1")]
    query = preset.render_query("framebuffer", pods)
    # a GPU two containers name (a DRA device) is two series, counted once
    assert query.startswith(
        "sum by (namespace, pod) (max without (container) (max_over_time(DCGM_FI_DEV_FB_USED{job=~"
    )
    assert 'namespace=~"ns-a|ns-b"' in query
    # '.' would match any character in the regex; it is escaped (doubled for the PromQL string).
    assert 'pod=~"nb\\\\.0|trainer-1"' in query
    assert "$" not in query


def test_query_templates_reject_unknown_placeholders() -> None:
    fields = load_default_config().controller.metrics.dcgm.model_dump()
    fields["utilization_query"] = "max(${metric_name})"
    with pytest.raises(ValidationError, match=r"unknown placeholder\(s\) \$\{metric_name\}"):
        MetricsPreset(**fields)


def test_controller_section_round_trips_through_yaml() -> None:
    ctrl = load_default_config().controller
    again = ControllerConfig.model_validate(ctrl.model_dump(by_alias=True, mode="json"))
    assert again == ctrl


def test_model_is_immutable() -> None:
    cfg = load_config_text(MINIMAL)
    with pytest.raises(ValidationError):
        cfg.controller.window = 3  # type: ignore[misc]


def test_process_and_memory_policy_come_from_the_controller_section() -> None:
    from ghostgpu.config import ConfigError
    from ghostgpu.controller.observe.evidence import policy_from_config
    from ghostgpu.verdict import ProcessInfo, ProcessRole, classify

    cfg = ControllerConfig.model_validate(
        {
            "processes": {"timers": ["my-scheduler"], "foreverSleep": "24h"},
            "gpuMemory": {"freeAtMost": "128Mi", "heldFrom": "1Gi"},
        }
    )
    policy = policy_from_config(cfg)
    assert policy.memory_free_bytes == 128 << 20 and policy.memory_held_bytes == 1 << 30
    sleeping = ProcessInfo(pid=1, state="S", command="my-scheduler --every 1h")
    assert classify(sleeping, policy.processes) is ProcessRole.TIMER
    assert classify(ProcessInfo(pid=3, state="S", command="sleep 1d"), policy.processes) is ProcessRole.HOLDER
    assert classify(ProcessInfo(pid=3, state="S", command="sleep 23h"), policy.processes) is ProcessRole.TIMER
    # a list given replaces the built-in one: cron is no timer any more in this config
    assert classify(ProcessInfo(pid=1, state="S", command="cron -f"), policy.processes) is ProcessRole.WORK
    with pytest.raises(ValidationError, match="not a program name"):
        ControllerConfig.model_validate({"processes": {"holders": ["/usr/bin/pause"]}})
    with pytest.raises(ValidationError, match="heldFrom"):
        ControllerConfig.model_validate({"gpuMemory": {"freeAtMost": "1Gi", "heldFrom": "500Mi"}})
    bad = MINIMAL + "controller:\n  processes:\n    wrappers: [sh, sh]\n"
    with pytest.raises(ConfigError, match=r"controller\.processes\.wrappers: .*listed twice"):
        load_config_text(bad, "my-cluster.yaml")


def test_windows_must_be_ordered() -> None:
    with pytest.raises(ValidationError, match="longWindow"):
        ControllerConfig(window=10, long_window=5)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("8", Decimal(8)),
        ("500m", Decimal("0.5")),
        ("10Gi", Decimal(10 * 2**30)),
        ("1.5k", Decimal(1500)),
        ("1e3", Decimal(1000)),
        ("2E-3", Decimal("0.002")),
        (".5", Decimal("0.5")),
        ("+3", Decimal(3)),
    ],
)
def test_parse_quantity_accepts_kubernetes_spellings(text: str, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["", "abc", "1.2.3", "10GB", "5 Gi", "Gi", "1ki", "--1"])
def test_parse_quantity_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes quantity"):
        parse_quantity(text)


@given(st.integers(min_value=0, max_value=10**12), st.sampled_from(["", "k", "M", "Ki", "Mi", "Gi"]))
def test_quantity_value_scales_by_suffix(number: int, suffix: str) -> None:
    scale = {"": 1, "k": 1000, "M": 10**6, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30}[suffix]
    q = Quantity._validate(f"{number}{suffix}")
    assert q.value == number * scale
    assert q.is_whole


def test_quantity_from_yaml_numbers_keeps_a_string_form() -> None:
    assert Quantity._validate(4) == "4"
    assert Quantity._validate(4.0) == "4"
    assert Quantity._validate(0.5) == "0.5"
    assert not Quantity._validate(0.5).is_whole


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds
    assert Duration._validate(text).seconds == seconds


@pytest.mark.parametrize("text", ["30", "5 m", "1d", "m5", ""])
def test_parse_duration_rejects_garbage(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_config_can_be_built_in_python_with_field_names() -> None:
    cfg = GhostgpuConfig(
        flavors=[{"name": "a100", "resource": "nvidia.com/gpu"}],
        teams=[{"name": "ml", "quota": {"a100": {"nominal_quota": "2"}}}],
    )
    assert cfg.teams[0].quota["a100"].nominal_quota.value == 2


def test_example_spells_out_the_builtin_presets() -> None:
    # The example documents the PromQL presets; it must not drift from the code's defaults.
    assert load_default_config().controller.metrics == ControllerConfig().metrics


def test_process_source_is_agent_in_a_new_render_and_exec_for_an_existing_file() -> None:
    # The embedded example (what a new render uses and users copy) says agent explicitly; a file
    # without the key keeps the exec source it was written for (the same bundle as before).
    assert load_default_config().controller.process_source == "agent"
    assert load_config_text(MINIMAL).controller.process_source == "exec"
    cfg = load_config_text(MINIMAL + "controller: {processSource: agent}\n")
    assert cfg.controller.process_source == "agent"


def test_a_bad_process_source_names_the_key_and_the_allowed_values() -> None:
    from ghostgpu.config import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config_text(MINIMAL + "controller: {processSource: daemonset}\n")
    text = str(err.value)
    assert "controller.processSource" in text
    assert "'agent'" in text and "'exec'" in text
    assert "line " in text


def test_gitops_orphan_markers_default_to_escalate() -> None:
    # The safe default: a GitOps marker whose manager is not in this cluster (a hub Argo CD's
    # Application) holds the reclaim; `stale` says no manager outside the cluster exists.
    assert load_config_text(MINIMAL).controller.gitops.orphan_markers == "escalate"
    assert load_default_config().controller.gitops.orphan_markers == "escalate"
    cfg = load_config_text(MINIMAL + "controller: {gitops: {orphanMarkers: stale}}\n")
    assert cfg.controller.gitops.orphan_markers == "stale"


@pytest.mark.parametrize("value", ["ignore", "true", "Stale", "[stale]"])
def test_a_bad_orphan_markers_value_names_file_key_and_the_allowed_values(value: str) -> None:
    from ghostgpu.config import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config_text(MINIMAL + f"controller:\n  gitops:\n    orphanMarkers: {value}\n", "my-cluster.yaml")
    [line] = err.value.lines()
    assert line.startswith("my-cluster.yaml: controller.gitops.orphanMarkers: expected 'escalate' or 'stale'")
    assert line.endswith("(line 10)")
