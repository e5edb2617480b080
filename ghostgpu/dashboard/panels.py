"""The controller dashboard's panels: title, unit and PromQL, in display order. The one source of
truth: `ghostgpu render` lays them out as the Grafana dashboard in controller/, the e2e test runs
every query against a real Prometheus scraping a real controller, and `ghostgpu dashboard
preview` draws them from a Prometheus into a PNG.

Metric names and labels are those of ghostgpu/controller/metrics.py. Both replicas of the
controller poll and export the same gauges and signal failures, while only the leader acts, so
gauges and failures are deduplicated with `max by` and actions are summed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

# Counters are shown as "events in the last EVENTS_WINDOW" at each point in time.
EVENTS_WINDOW = "1h"
RATE_WINDOW = "5m"

REVERTS_METRIC = "ghostgpu_reclaim_reverts_total"
OWNER_KIND_METRIC = "ghostgpu_owner_kind_outside_kueue_gpus"
IDLE_METRIC = "ghostgpu_idle_session_deadline_seconds"


class Query(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    expr: str
    legend: str = Field(description="Grafana legendFormat: {{label}} is replaced by the series' label")
    empty_ok: str | None = Field(
        None, description="why this query may return no series on a healthy controller (None: it must not)"
    )


class Panel(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    title: str
    description: str
    unit: str = Field(description="Grafana unit id: short, s, ...")
    axis_label: str = Field(description="y axis of the PNG preview")
    queries: tuple[Query, ...]
    stacked: bool = False
    full_width: bool = False
    display: Literal["timeseries", "bargauge"] = Field(
        "timeseries",
        description="timeseries: over the dashboard's range; bargauge: one bar per series, its value "
        "now (an instant query, so a series that is gone has no bar)",
    )


def events(metric: str) -> str:
    """Per series: increments of a counter in the last EVENTS_WINDOW. increase() alone misses the
    first increment of a series born inside the window (prometheus_client creates a labelled
    series at its first inc(), so Prometheus never sees it at 0): for such a series, its value
    is the count. Reclaims are rare, so that first increment is most of them."""
    w = EVENTS_WINDOW
    return f"(increase({metric}[{w}]) and {metric} offset {w}) or {metric}"


def _flavor(kind: str) -> str:
    return f'max by (flavor) (ghostgpu_flavor_gpus{{kind="{kind}"}})'


PANELS: tuple[Panel, ...] = (
    Panel(
        title="Accounting gap per flavor",
        description=(
            "GPUs Kueue believes free (nominal quota minus admitted) beside the GPUs that are truly free "
            "on the nodes; the gap is what Kueue would hand out that is not there. Same numbers as "
            "`ghostgpu status`."
        ),
        unit="short",
        axis_label="GPUs",
        queries=(
            Query(
                expr=f"clamp_min({_flavor('kueue_believes_free')} - {_flavor('truly_free')}, 0)",
                legend="{{flavor}} gap",
            ),
            Query(expr=_flavor("kueue_believes_free"), legend="{{flavor}} Kueue believes free"),
            Query(expr=_flavor("truly_free"), legend="{{flavor}} truly free"),
        ),
    ),
    Panel(
        title="GPUs held outside Kueue by verdict",
        description="GPUs held by tracked workloads that bypass Kueue, by their latest verdict.",
        unit="short",
        axis_label="GPUs",
        stacked=True,
        queries=(
            Query(
                expr="sum by (verdict) (max by (flavor, verdict) (ghostgpu_flavor_outside_kueue_gpus))",
                legend="{{verdict}}",
            ),
        ),
    ),
    Panel(
        title="GPUs outside Kueue by owner kind",
        description=(
            "GPUs held outside Kueue now, by the kind and API group at the top of their pods' owner chain "
            "(Deployment apps, RayJob ray.io, Job batch or batch.volcano.sh, an operator's kind), and "
            "whether ghostgpu can stop them. stoppable: false is a kind with no actuator row (add a "
            "controller.actuators row for it), a row that does not apply to these objects, or objects the "
            "tracking policy did not label. Same rows as `ghostgpu status --by owner`."
        ),
        unit="short",
        axis_label="GPUs",
        display="bargauge",
        full_width=True,
        queries=(
            Query(
                expr=f"max by (owner_kind, owner_group, stoppable) ({OWNER_KIND_METRIC})",
                legend="{{owner_kind}} {{owner_group}} (stoppable: {{stoppable}})",
            ),
        ),
    ),
    Panel(
        title=f"Reclaims, escalations and reverts (last {EVENTS_WINDOW})",
        description=(
            "Reclaims taken (enforce mode), reclaims shadow mode would have taken, actions the risk gate "
            "handed to a person, and reclaims undone by someone other than `ghostgpu restore`."
        ),
        unit="short",
        axis_label=f"events in the last {EVENTS_WINDOW}",
        queries=(
            Query(
                expr=f"sum by (verdict) ({events('ghostgpu_reclaims_total')})", legend="reclaimed {{verdict}}"
            ),
            Query(
                expr=f"sum by (verdict) ({events('ghostgpu_would_reclaims_total')})",
                legend="would reclaim (shadow) {{verdict}}",
            ),
            Query(
                expr=f"sum by (action) ({events('ghostgpu_escalations_total')})",
                legend="escalated {{action}}",
            ),
            Query(
                expr=f"sum({events(REVERTS_METRIC)})",
                legend="reverted",
                empty_ok=f"{REVERTS_METRIC} is not exported yet: no series until the controller counts them",
            ),
        ),
    ),
    Panel(
        title=f"Signal failures by reason (last {EVENTS_WINDOW})",
        description=(
            "Failed signal readings (a missing or stale series, an HTTP error, a failed exec, ...): a "
            "workload with a failed required signal is UNKNOWN and never reclaimed."
        ),
        unit="short",
        axis_label=f"failures in the last {EVENTS_WINDOW}",
        queries=(
            Query(
                expr=f"max by (source, reason) ({events('ghostgpu_signal_failures_total')})",
                legend="{{source}}: {{reason}}",
            ),
        ),
    ),
    Panel(
        title="Idle sessions warned",
        description=(
            "Idle sessions under controller.idleSessions (docs/idle-sessions.md): for each warned one, the "
            "time left until its stop (a keep-until on the owner moves it; any activity removes the "
            "row); in shadow mode, the sessions that would be warned or stopped (their value: 0)."
        ),
        unit="s",
        axis_label="seconds until the stop",
        display="bargauge",
        full_width=True,
        queries=(
            Query(
                expr=f'max by (namespace, workload, class, team) ({IDLE_METRIC}{{state="warned"}}) - time()',
                legend="{{namespace}}/{{workload}} ({{class}}, {{team}})",
                empty_ok="no idle session is warned (controller.idleSessions is off, or no session is idle)",
            ),
            Query(
                expr="count by (namespace, workload, class, team, state) "
                f'({IDLE_METRIC}{{state=~"would-.*"}}) * 0',
                legend="{{namespace}}/{{workload}} ({{class}}, {{team}}): {{state}}",
                empty_ok="shadow mode has no idle session to report",
            ),
        ),
    ),
    Panel(
        title="Poll duration",
        description=(
            "Wall time of one reconcile poll (query, probes, verdicts, writes): keep it under pollInterval."
        ),
        unit="s",
        axis_label="seconds",
        full_width=True,
        queries=tuple(
            Query(
                expr=(
                    f"histogram_quantile({q}, sum by (le) "
                    f"(rate(ghostgpu_poll_duration_seconds_bucket[{RATE_WINDOW}])))"
                ),
                legend=f"p{round(q * 100)}",
            )
            for q in (0.5, 0.95)
        ),
    ),
)


def all_queries() -> list[tuple[Panel, Query]]:
    return [(p, q) for p in PANELS for q in p.queries]
