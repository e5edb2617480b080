"""docs/reference/metrics.md: every series the controller and the node agent serve, read from the
registries the code builds (ghostgpu.controller.exported, the agent's AgentExporter),
and every alert of the PrometheusRule `ghostgpu render` writes for examples/ghostgpu.yaml."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry

from ghostgpu.reference import header
from ghostgpu.reference.markdown import cell, code, table

# What a person does when the alert fires; a rendered alert without an entry here (or an entry
# without its alert) stops the generator, so the page never lists an alert without one.
WHAT_TO_DO = {
    "GhostGpuIdleWorkload": (
        "Read the `ghostgpu.io/verdict` and `ghostgpu.io/evidence` annotations of the pod's workload: "
        "FINISHED_IDLE or ZOMBIE_CRASHED is reclaimed in enforce mode under the risk gate (in shadow "
        "mode `ghostgpu report` counts it); IDLE_HELD means a live process still holds the GPU, so ask "
        "its owner; UNKNOWN's reasons name the signal that failed or is stale. The alert reads "
        "utilization and memory only; its thresholds are `controller.alerts`."
    ),
    "GhostGpuIdleSessionWarned": (
        "An idle session of the alert's team (its class and workload in the labels) is warned under "
        "controller.idleSessions and is stopped at the time in the alert's value. Its owner keeps it "
        "by using it (any GPU, CPU, process or terminal activity cancels the warning) or by "
        "annotating the owner `ghostgpu.io/keep-until: <RFC 3339 time>` (honoured up to maxSnooze); "
        "`kubectl describe` shows the Warning Event with what keeps it alive and the GPU-hours held. "
        "After the stop, `ghostgpu restore` brings it back (docs/idle-sessions.md)."
    ),
    "GhostGpuControllerDown": (
        "No replica is scraped, so no workload is judged and the accounting series stop. Check the "
        "controller Deployment's pods (`kubectl -n <controller.namespace> get pods`, their logs, "
        "/healthz), and that your Prometheus selects the ServiceMonitor "
        "(`controller.serviceMonitor.labels`); `ghostgpu doctor`'s `controller: running, leader` row "
        "shows the ready replicas and the Lease holder."
    ),
}


@dataclass(frozen=True)
class Family:
    name: str  # the name the series carry on /metrics
    type: str
    labels: tuple[str, ...]
    help: str


def families(registry: CollectorRegistry) -> Iterator[Family]:
    """Each metric family a registry serves, with its label names even before it has a series.
    prometheus_client keeps label names only on its collectors (`_labelnames` of a Counter, Gauge or
    Histogram, and of a custom collector's MetricFamily), not on what collect() yields when a
    labelled metric has no child yet; the page must list them all the same."""
    collectors = list(registry._collector_to_names)  # prometheus_client has no public listing
    for collector in collectors:
        wrapper_labels = getattr(collector, "_labelnames", None)
        for metric in collector.collect():
            labels = wrapper_labels if wrapper_labels is not None else getattr(metric, "_labelnames", ())
            sampled = {k for s in metric.samples for k in s.labels if k != "le"}
            if not set(labels) >= sampled:
                raise ValueError(f"{metric.name}: series carry labels {sorted(sampled)} beyond {labels}")
            suffix = "_total" if metric.type == "counter" else ""
            yield Family(metric.name + suffix, metric.type, tuple(labels), metric.documentation)


def controller_families() -> list[Family]:
    from ghostgpu.controller.exported import exported_metrics

    return sorted(families(exported_metrics().controller.registry), key=lambda f: f.name)


def agent_families() -> list[Family]:
    from ghostgpu.agent.exporter import AgentExporter

    return sorted(families(AgentExporter("node").registry), key=lambda f: f.name)


def alerts() -> list[dict[str, Any]]:
    """The rules of the PrometheusRule rendered from examples/ghostgpu.yaml."""
    from ghostgpu.config import load_default_config
    from ghostgpu.render import render_objects

    rules = [
        rule
        for obj in render_objects(load_default_config())
        if obj.get("kind") == "PrometheusRule"
        for group in obj["spec"]["groups"]
        for rule in group["rules"]
    ]
    names = [r["alert"] for r in rules]
    if set(names) != set(WHAT_TO_DO):
        raise ValueError(
            f"alerts {sorted(set(names) ^ set(WHAT_TO_DO))} are rendered without a WHAT_TO_DO entry "
            "or have one without being rendered (ghostgpu/reference/metrics.py)"
        )
    return rules


def _family_table(rows: list[Family]) -> str:
    return table(
        ["name", "type", "labels", "help"],
        [
            [code(f.name), f.type, ", ".join(code(label) for label in f.labels) or "—", cell(f.help)]
            for f in rows
        ],
    )


def page() -> str:
    source = "the controller's and the agent's metric registries and `ghostgpu render`"
    out = [header("Metrics and alerts", source)]
    out.append(
        "\nThe controller serves these on `/metrics` of `controller.port`, every replica. A counter's "
        "series carry `_total` "
        "(and `_created`, prometheus_client's creation time); a histogram's carry `_bucket`, `_sum` "
        "and `_count`. The dashboard's panels ([dashboard.md](../dashboard.md)) and the alerts below "
        "read them.\n\n## Controller\n\n"
    )
    out.append(_family_table(controller_families()))
    out.append(
        "\n## Node agent\n\nThe agent (`ghostgpu agent`, `controller.processSource: agent`) serves these "
        "on `/metrics` of its `--listen` address; the controller reads the per-container series through "
        "its one PromQL query ([agent.md](../agent.md)). Per-container series come from the last scan "
        "only: a container gone from the node is gone from the next scrape.\n\n"
    )
    out.append(_family_table(agent_families()))
    out.append(
        "\n## Alerts\n\nThe PrometheusRule `ghostgpu render` writes into `controller/` (shown for "
        "examples/ghostgpu.yaml: `controller.alerts` sets the idle alert's thresholds, `for`, severity "
        "and rule labels; `controller.metrics.preset` its series).\n"
    )
    for rule in alerts():
        annotations = rule.get("annotations", {})
        out.append(f"\n### {rule['alert']}\n\n")
        out.append(
            table(
                ["field", "value"],
                [
                    ["expr", code(rule["expr"])],
                    ["for", code(rule.get("for", "0s"))],
                    ["severity", code(rule.get("labels", {}).get("severity", ""))],
                    ["summary", cell(annotations.get("summary", ""))],
                    ["description", cell(annotations.get("description", ""))],
                ],
            )
        )
        out.append(f"\nWhat to do: {WHAT_TO_DO[rule['alert']]}\n")
    return "".join(out)
