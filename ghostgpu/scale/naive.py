"""BASELINE, not ghostgpu: the cron script an SRE writes first, measured for comparison.

Every run: list the tracked pods, then for EVERY pod one Prometheus query for its utilization and
one exec of `ps` into it; a pod at 0 % with no process but an idle holder is reported idle.

It is given the same clients as the controller (httpx to Prometheus, kr8s + the same exec code) and
the same concurrency bound (8), so the comparison measures the algorithm, not a slower client
(a shell loop around `kubectl exec` would cost far more per pod). With `--sample K` only every
(N/K)-th pod is visited and the run's counts, CPU and wall time are scaled by N/K in the report
(clearly labelled as extrapolated there).

Run: python -m ghostgpu.scale.naive --kubeconfig KC --prometheus URL --polls P --out FILE [--sample K]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ghostgpu.scale.meter import RequestCounter, cpu_seconds, delta, memory_mib

CONCURRENCY = 8


async def one_run(api: Any, prom: Any, executor: Any, sample: int | None) -> dict[str, int]:
    from ghostgpu.signals.podexec import ExecFailed, PodRef
    from ghostgpu.signals.processes import PS_ARGV, MalformedListing, parse_ps
    from ghostgpu.signals.prometheus import PrometheusError
    from ghostgpu.verdict import ProcessPolicy, ProcessRole, classify_listing

    pods: list[dict[str, Any]] = []
    params: dict[str, Any] = {"labelSelector": "ghostgpu.io/tracked=true", "limit": 500}
    while True:
        async with api.call_api("GET", version="v1", url="pods", params=params) as resp:
            body = resp.json()
        pods += body.get("items") or []
        cont = (body.get("metadata") or {}).get("continue")
        if not cont:
            break
        params["continue"] = cont
    pods = [p for p in pods if (p.get("status") or {}).get("phase") == "Running"]
    pods.sort(key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"]))
    if sample and sample < len(pods):
        step = len(pods) / sample
        pods = [pods[int(k * step)] for k in range(sample)]
    sem = asyncio.Semaphore(CONCURRENCY)
    idle = 0

    async def check(p: dict[str, Any]) -> bool:
        ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
        async with sem:
            try:
                _, samples = await prom.query(f'DCGM_FI_DEV_GPU_UTIL{{namespace="{ns}",pod="{name}"}}')
                util = max((s.value for s in samples), default=None)
            except PrometheusError:
                util = None
            try:
                res = await executor.run(PodRef(ns, name, "main"), PS_ARGV, timeout=10.0)
                roles = classify_listing(parse_ps(res.stdout), ProcessPolicy())
                # No work: nothing but wrappers, holders and defunct processes.
                no_work = (ProcessRole.WRAPPER, ProcessRole.HOLDER, ProcessRole.DEFUNCT)
                idle_procs = all(r in no_work for r in roles)
            except (ExecFailed, MalformedListing):
                idle_procs = False
        return util == 0 and idle_procs

    results = await asyncio.gather(*(check(p) for p in pods))
    idle = sum(results)
    return {"visited": len(pods), "idle": idle}


async def run(args: argparse.Namespace) -> None:
    import kr8s.asyncio

    from ghostgpu.signals.podexec import KubeExec
    from ghostgpu.signals.prometheus import PrometheusClient

    counter = RequestCounter(prometheus_port=urlsplit(args.prometheus).port)
    counter.install()
    api = await kr8s.asyncio.api(kubeconfig=args.kubeconfig)
    prom = PrometheusClient(args.prometheus, timeout=10.0)
    executor = KubeExec(api)
    try:
        for i in range(args.polls):
            t, cpu, before = time.perf_counter(), cpu_seconds(), counter.snapshot()
            found = await one_run(api, prom, executor, args.sample)
            rss, hwm = memory_mib()
            d = delta(counter.snapshot(), before)
            row = {
                "poll": i + 1,
                "wall_s": round(time.perf_counter() - t, 4),
                "cpu_s": round(cpu_seconds() - cpu, 4),
                "rss_mib": round(rss, 1),
                "peak_rss_mib": round(hwm, 1),
                "prometheus_queries": d.get("prometheus_query", 0),
                "apiserver_requests": sum(v for k, v in d.items() if k.startswith("apiserver")),
                "exec_calls": d.get("apiserver_exec", 0),
                **found,
            }
            with args.out.open("a", encoding="utf-8") as f:
                f.write(json.dumps(row, sort_keys=True) + "\n")
    finally:
        await prom.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--prometheus", required=True)
    ap.add_argument("--polls", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--sample", type=int, default=None)
    asyncio.run(run(ap.parse_args()))


if __name__ == "__main__":
    main()
