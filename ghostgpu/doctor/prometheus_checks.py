"""The rows about Prometheus: reachable, and the configured GPU series there, for the tracked
pods, with the labels the controller's query joins on, freshly scraped. Every signal depends on
these series: without them every verdict is UNKNOWN."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import httpx

from ghostgpu.config import ControllerConfig
from ghostgpu.doctor.report import Row, fail, ok, warn
from ghostgpu.signals.agent import CONTAINER_METRICS

GPU_RESOURCE_HINT = "nvidia.com/"


class PromReader:
    def __init__(self, url: str, timeout: float) -> None:
        self.url = url.rstrip("/")
        self.client = httpx.AsyncClient(timeout=timeout)

    async def query(self, promql: str) -> list[dict[str, Any]]:
        resp = await self.client.post(f"{self.url}/api/v1/query", data={"query": promql})
        resp.raise_for_status()
        body = resp.json()
        if body.get("status") != "success":
            raise httpx.HTTPError(f"query {promql!r}: {body.get('error')}")
        return list(body["data"]["result"])

    async def buildinfo(self) -> dict[str, Any]:
        resp = await self.client.get(f"{self.url}/api/v1/status/buildinfo")
        resp.raise_for_status()
        return dict(resp.json().get("data") or {})

    async def aclose(self) -> None:
        await self.client.aclose()


async def check_reachable(prom: PromReader) -> tuple[Row, bool]:
    try:
        info = await prom.buildinfo()
    except httpx.HTTPError as exc:
        return (
            fail(
                "prometheus: reachable",
                f"{prom.url}: {exc or type(exc).__name__}",
                "set controller.prometheus.url to the Prometheus the controller reads (doctor uses the same)",
            ),
            False,
        )
    return ok("prometheus: reachable", f"Prometheus {info.get('version', '?')} at {prom.url}"), True


def tracked_gpu_pods(pods: Sequence[dict[str, Any]], opted_in: Sequence[str]) -> list[tuple[str, str]]:
    """(namespace, pod) of running pods that ask for a GPU in opted-in namespaces."""
    wanted = set(opted_in)
    out = []
    for p in pods:
        meta, spec = p["metadata"], p.get("spec") or {}
        if meta.get("namespace") not in wanted or (p.get("status") or {}).get("phase") != "Running":
            continue
        res = [c.get("resources") or {} for c in spec.get("containers") or []]
        if any(
            GPU_RESOURCE_HINT in k for r in res for part in ("limits", "requests") for k in r.get(part) or {}
        ):
            out.append((meta["namespace"], meta["name"]))
    return sorted(out)


async def check_gpu_series(
    prom: PromReader, ctrl: ControllerConfig, tracked: Sequence[tuple[str, str]]
) -> Row:
    from ghostgpu.promql import label_matchers

    preset = ctrl.metrics.active
    ns_label, pod_label = preset.namespace_label, preset.pod_label
    # Only the series the controller reads: those of the scrape the config names.
    source = label_matchers(preset.source)
    metric = f"{preset.utilization_metric}{{{source}}}"
    name = "prometheus: GPU series"
    fix = (
        f"run dcgm-exporter (or the configured exporter) on every GPU node with its pod mapping on, "
        f"scraped with honorLabels so {ns_label}/{pod_label} stay the pod's, and name its scrape in "
        f"controller.metrics.{ctrl.metrics.preset}.source (now {{{source}}})"
    )
    recent = f"last_over_time({metric}[5m])"
    seen = await prom.query(f"group by (job, instance, {ns_label}, {pod_label}) ({recent})")
    if not seen:
        return fail(name, f"no {metric} series in the last 5 minutes", fix)
    if not any(s["metric"].get(ns_label) and s["metric"].get(pod_label) for s in seen):
        return fail(
            name, f"{len(seen)} {metric} series, none with both {ns_label} and {pod_label} labels", fix
        )
    # The scrapes that produced them: failing (up 0) or old (the controller would call them stale).
    exporters = f"on (job, instance) group by (job, instance) ({recent})"
    scrapes = await prom.query(f"timestamp(up) and {exporters}")
    ups = await prom.query(f"up and {exporters}")
    down = sorted(
        {
            f"{s['metric'].get('job', '?')} {s['metric'].get('instance', '')}"
            for s in ups
            if float(s["value"][1]) < 1
        }
    )
    if down:
        return fail(name, f"the scrape of {metric} fails (up == 0): {', '.join(down)}", fix)
    age = time.time() - max((float(s["value"][1]) for s in scrapes), default=0.0)
    if age > ctrl.stale_after.seconds:
        return fail(
            name, f"last scrape of {metric} {age:.0f} s ago (staleAfter {ctrl.stale_after.seconds:g} s)", fix
        )
    now = await prom.query(f"group by ({ns_label}, {pod_label}) ({metric})")
    current = {(s["metric"].get(ns_label), s["metric"].get(pod_label)) for s in now}
    found = f"{len(current)} pods' {metric} with {ns_label}/{pod_label} labels, scraped {age:.0f} s ago"
    missing = [f"{ns}/{pod}" for ns, pod in tracked if (ns, pod) not in current]
    if missing:
        more = f" and {len(missing) - 6} more" if len(missing) > 6 else ""
        return fail(name, f"{found}; none for tracked pods {', '.join(missing[:6])}{more}", fix)
    if not tracked:
        return warn(
            name,
            f"{found}; no tracked GPU pod yet to match",
            "run doctor again once GPU pods run in opted-in namespaces",
        )
    return ok(name, f"{found}; all {len(tracked)} tracked GPU pods have one")


# How far back doctor looks for a second producer and for dropped samples.
PRODUCER_LOOKBACK = "10m"


def _producers_fix(what: str) -> str:
    return (
        f"find the target that writes {what} (the row names its job and instance) and stop it, or "
        "stop Prometheus from keeping a tenant target's own labels: no honor_labels on scrapes of "
        "tenant pods (Prometheus Operator: overrideHonorLabels: true on the Prometheus resource; "
        "docs/threat-model.md)"
    )


async def check_signal_sources(prom: PromReader, ctrl: ControllerConfig, namespaces: Sequence[str]) -> Row:
    """One producer per signal: the series the controller reads for the opted-in namespaces come
    only from the scrapes ghostgpu.yaml names (metrics.<preset>.source, xidSource, agentSource),
    one target per pod, and Prometheus drops no sample as out of order or duplicate (a second
    producer writing the same series ahead of the real one makes it drop the real samples)."""
    from ghostgpu.promql import label_matchers

    name = "prometheus: one producer per signal"
    if not namespaces:
        return warn(name, "no opted-in namespace to look at", "run doctor again once namespaces opt in")
    metrics = ctrl.metrics
    preset = metrics.active
    # Namespace names are DNS labels: no regex metacharacter to escape.
    tracked = "|".join(sorted(namespaces))
    ns_label, pod_label = preset.namespace_label, preset.pod_label
    gpu_names = sorted({preset.utilization_metric, preset.framebuffer_metric})
    kinds: list[tuple[list[str], str, str, tuple[str, str]]] = [
        (gpu_names, f'{ns_label}=~"{tracked}"', label_matchers(preset.source), (ns_label, pod_label)),
        (
            [preset.xid_metric] if preset.xid_metric else [],
            f'namespace=~"{tracked}"',
            label_matchers(preset.xid_source),
            ("namespace", "pod"),
        ),
    ]
    if ctrl.process_source == "agent":
        kinds.append(
            (list(CONTAINER_METRICS), f'tracked_namespace=~"{tracked}"', label_matchers(metrics.agent_source),
             ("tracked_namespace", "tracked_pod"))
        )  # fmt: skip
    problems: list[str] = []
    dropped = await prom.query(
        "sum(increase(prometheus_target_scrapes_sample_out_of_order_total"
        f"[{PRODUCER_LOOKBACK}])) + sum(increase(prometheus_target_scrapes_sample_duplicate_timestamp_total"
        f"[{PRODUCER_LOOKBACK}]))"
    )
    if not dropped:
        # One sample of the counters yet (Prometheus just started) has no increase: nothing dropped.
        dropped = await prom.query("count(prometheus_target_scrapes_sample_out_of_order_total) * 0")
    count = float(dropped[0]["value"][1]) if dropped else 0.0
    if count > 0:
        problems.append(
            f"Prometheus dropped {count:.0f} out-of-order or duplicate samples in the last "
            f"{PRODUCER_LOOKBACK}: a target writes series another already writes, ahead of it "
            "(its log names the target: 'Error on ingesting out-of-order samples')"
        )
    # Ten scrape intervals: long enough to count, short enough to see a producer that just began.
    span = f"{10 * metrics.scrape_interval.seconds:g}s"
    for metric_names, where, source, (ns, pod) in kinds:
        if not metric_names:
            continue
        names = "|".join(metric_names)
        # Plain selectors (Prometheus's lookback, 5 minutes) keep each series' metric name; a range
        # function would drop it and merge two metrics' series of one label set into an error.
        recent = f'{{__name__=~"{names}", {where}}}'
        pinned = f'{{__name__=~"{names}", {where}, {source}}}'
        others = await prom.query(f"group by (__name__, job, instance) ({recent} unless {pinned})")
        for s in others[:4]:
            m = s["metric"]
            problems.append(
                f"{m.get('__name__', names)} of an opted-in namespace written by job {m.get('job', '?')!r} "
                f"instance {m.get('instance', '?')!r}, not by the source {{{source}}}"
            )
        two = await prom.query(f"count by ({ns}, {pod}) (group by ({ns}, {pod}, instance) ({pinned})) > 1")
        for s in two[:4]:
            m = s["metric"]
            problems.append(f"{m.get(ns, '?')}/{m.get(pod, '?')} has {names} from {s['value'][1]} instances")
        # More samples than the target had scrapes: a second producer writes the very same series.
        for metric in metric_names:
            doubled = await prom.query(
                f"max by (job, instance) (count_over_time({metric}{{{where}, {source}}}[{span}])) "
                f"> on (job, instance) (1.5 * count_over_time(up{{{source}}}[{span}]) + 2)"
            )
            for s in doubled[:4]:
                m = s["metric"]
                problems.append(
                    f"{metric} of job {m.get('job', '?')!r} instance {m.get('instance', '?')!r} has more "
                    f"samples than the target had scrapes: a second producer writes the same series"
                )
    if problems:
        return fail(name, "; ".join(problems[:6]), _producers_fix("these series"))
    if not dropped:
        return warn(
            name,
            "every series comes from its source, one target per pod; Prometheus's own counters of "
            "out-of-order and duplicate samples are not in Prometheus (it does not scrape itself)",
            "let Prometheus scrape its own /metrics, then run doctor again",
        )
    return ok(
        name, "every series comes from its source, one target per pod; no sample dropped as out of order"
    )
