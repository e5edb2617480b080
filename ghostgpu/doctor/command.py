"""`ghostgpu doctor`: every prerequisite ghostgpu has in the cluster and in Prometheus, one row
each, read-only. A row's own read failing (a 403 for the identity running doctor, a timeout)
fails that row with the boundary's message (ghostgpu.boundary) and the next row still runs."""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import httpx

from ghostgpu import __version__
from ghostgpu.boundary import explain, kube_api, name_endpoint
from ghostgpu.config import (
    ControllerConfig,
    GhostgpuConfig,
    PrometheusConfig,
    load_config,
    load_default_config,
)
from ghostgpu.doctor import cluster_checks as cc
from ghostgpu.doctor import prometheus_checks as pc
from ghostgpu.doctor.rbac_checks import check_rbac
from ghostgpu.doctor.reads import DOCTOR_USER_AGENT_PREFIX, Reads
from ghostgpu.doctor.report import Row, as_json, exit_code, fail, print_table, skip
from ghostgpu.render import render_objects


def _failed(check: str, exc: Exception) -> Row:
    """The row of a check whose own read failed in a way the boundary can name; else re-raise."""
    lines = explain(exc)
    if lines is None:
        raise exc
    return fail(check, lines[0].removeprefix("error: "), (lines[1:] or [""])[0].removeprefix("fix: "))


async def _row(check: str, work: Awaitable[Row]) -> Row:
    try:
        return await work
    except Exception as exc:
        return _failed(check, exc)


async def _kueue_build_version(prom: pc.PromReader) -> str | None:
    try:
        series = await prom.query("max by (git_version) (kueue_build_info)")
    except httpx.HTTPError:  # only a hint for the version row; Prometheus has its own row
        return None
    return next((s["metric"]["git_version"] for s in series if s["metric"].get("git_version")), None)


async def run_doctor(cfg: GhostgpuConfig, kubeconfig: str | None) -> list[Row]:
    from ghostgpu.controller.app import _identify

    objects = render_objects(cfg)
    api = await kube_api(kubeconfig)
    _identify(api, f"{DOCTOR_USER_AGENT_PREFIX}{__version__}")
    reads = Reads(api)
    ctrl = cfg.controller
    name_endpoint(ctrl.prometheus.url, "Prometheus (controller.prometheus.url)")
    prom = pc.PromReader(ctrl.prometheus.url, ctrl.prometheus.timeout.seconds)
    try:
        rows = [await _row("apiserver", cc.check_apiserver(reads, api.auth.server))]
        reachable_row, reachable = await pc.check_reachable(prom)
        build = await _kueue_build_version(prom) if reachable else None
        rows += [
            await _row("kueue: installed", cc.check_kueue_installed(reads)),
            await _row("kueue: version", cc.check_kueue_version(reads, build)),
            await _row("kueue: manager running", cc.check_kueue_running(reads)),
            await _row("kueue: flavors and queues", cc.check_kueue_queues(reads, objects)),
            await _row("kueue: configuration", cc.check_kueue_configuration(reads, objects)),
            await _row("kyverno: CEL policy kinds", cc.check_kyverno_kinds(reads, objects)),
            await _row("kyverno: controllers running", cc.check_kyverno_running(reads)),
            await _row("kyverno: policies", cc.check_kyverno_policies(reads, objects)),
            await _row("kyverno: CRD watcher", cc.check_kyverno_crd_watcher(reads)),
            reachable_row,
        ]
        namespaces_row: Row | None = None
        try:
            namespaces = await cc.opted_in_namespaces(reads)
        except Exception as exc:
            namespaces_row, namespaces = _failed("namespaces: opted in", exc), []
        known = cc.namespaces_with_known_team(namespaces, cfg)
        sources = "prometheus: one producer per signal"
        if reachable:
            rows.append(await _row("prometheus: GPU series", _gpu_series(reads, prom, ctrl, known)))
            opted = sorted(n["metadata"]["name"] for n in namespaces)  # every one the controller reads
            rows.append(await _row(sources, pc.check_signal_sources(prom, ctrl, opted)))
        else:
            rows.append(skip("prometheus: GPU series", "Prometheus is not reachable"))
            rows.append(skip(sources, "Prometheus is not reachable"))
        rows += [
            namespaces_row or cc.check_namespaces(namespaces, cfg),
            await _row(
                "kueue: MultiKueue", cc.check_multikueue(reads, cfg, [cc._name(n) for n in namespaces])
            ),
            await _row("controller: RBAC", check_rbac(reads, objects, ctrl, known)),
            await _row("controller: running, leader", cc.check_controller(reads, cfg, objects)),
            await _row("agent: on every GPU node", cc.check_agent(reads, cfg)),
        ]
    finally:
        await prom.aclose()
    return rows


async def _gpu_series(
    reads: Reads, prom: pc.PromReader, ctrl: ControllerConfig, namespaces: list[str]
) -> Row:
    """The GPU series row, over the running GPU pods of the opted-in namespaces with a known team."""
    pods: list[dict[str, Any]] = []
    for ns in namespaces:
        pods += await reads.items("v1", "pods", ns)
    return await pc.check_gpu_series(prom, ctrl, pc.tracked_gpu_pods(pods, namespaces))


def run_doctor_command(
    config_path: Path | None, kubeconfig: str | None, prometheus_url: str | None, json_out: bool, echo: Any
) -> int:
    import asyncio

    cfg = load_config(config_path) if config_path else load_default_config()
    if prometheus_url is not None:
        from ghostgpu.boundary import Override, validated_overrides

        prom = cfg.controller.prometheus.model_dump(by_alias=True, mode="json")
        url = Override("url", "--prometheus-url", prometheus_url)
        checked = validated_overrides(PrometheusConfig, prom, [url])
        cfg = cfg.model_copy(update={"controller": cfg.controller.model_copy(update={"prometheus": checked})})
    rows = asyncio.run(run_doctor(cfg, kubeconfig))
    if json_out:
        echo(as_json(rows))
    else:
        print_table(rows)
    return exit_code(rows)
