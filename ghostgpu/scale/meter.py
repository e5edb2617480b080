"""Measuring a process from its own inside without touching the code it runs: every HTTP request
but exec leaves through `httpx.AsyncClient.send` (kr8s and the Prometheus client both use httpx), and
every exec upgrade through `podexec._run_direct` (or, behind a proxy, httpx again), so wrapping those
two counts Prometheus queries, apiserver requests and exec upgrades on the wire; CPU is
`resource.getrusage`, memory is the kernel's VmRSS/VmHWM of this process."""

from __future__ import annotations

import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def memory_mib() -> tuple[float, float]:
    """(current RSS, peak RSS) of this process in MiB, from /proc/self/status."""
    rss = hwm = 0.0
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return rss, hwm


HISTORY = "prometheus_history_query"  # the idle-session history (signals/idle_history.py)


def is_history(request: httpx.Request) -> bool:
    """The controller's idle-session history query: the only one reading cAdvisor's CPU counter."""
    from ghostgpu.scale.sessions import is_history_query

    try:
        return is_history_query(request.content)
    except httpx.RequestNotRead:  # a streamed body: no query of the controller's
        return False


def classify(request: httpx.Request, prometheus_port: int | None) -> str:
    url = urlsplit(str(request.url))
    if prometheus_port is not None and url.port == prometheus_port:
        return "prometheus_query" if url.path.endswith("/api/v1/query") else "prometheus_other"
    if url.path.endswith("/exec"):
        return "apiserver_exec"
    if "watch=true" in (url.query or ""):
        return "apiserver_watch"
    return "apiserver_other"


@dataclass
class RequestCounter:
    """Counts requests by class; `install()` patches httpx for the whole process."""

    prometheus_port: int | None = None
    counts: Counter[str] = field(default_factory=Counter)
    by_verb: Counter[str] = field(default_factory=Counter)
    history_wall_s: float = 0.0  # wall seconds the idle-session history queries took, in all

    def install(self) -> None:
        original = httpx.AsyncClient.send
        counter = self

        async def send(client: httpx.AsyncClient, request: httpx.Request, **kw: Any) -> httpx.Response:
            kind = classify(request, counter.prometheus_port)
            counter.counts[kind] += 1
            if kind.startswith("apiserver"):
                path = urlsplit(str(request.url)).path.rstrip("/").split("/")
                counter.by_verb[f"{request.method} {_resource_of(path)}"] += 1
            if kind == "prometheus_query" and is_history(request):
                # The idle-session history, counted apart (still one of the Prometheus queries)
                # and timed to its answer's headers: Prometheus evaluates the whole query first.
                counter.counts[HISTORY] += 1
                t0 = time.perf_counter()
                try:
                    return await original(client, request, **kw)
                finally:
                    counter.history_wall_s += time.perf_counter() - t0
            return await original(client, request, **kw)

        httpx.AsyncClient.send = send  # type: ignore[method-assign]

        from ghostgpu.signals import podexec

        direct = podexec._run_direct

        async def run_direct(endpoint: Any, path: str, stream: Any, *rest: Any) -> None:
            counter.counts["apiserver_exec"] += 1
            counter.by_verb["GET pods/exec"] += 1
            await direct(endpoint, path, stream, *rest)

        podexec._run_direct = run_direct  # type: ignore[assignment]

    def snapshot(self) -> dict[str, int]:
        return dict(self.counts)


def _resource_of(parts: list[str]) -> str:
    """/api/v1/namespaces/ns/pods/p/exec -> pods/exec; /apis/apps/v1/deployments -> deployments."""
    names = [p for p in parts if p]
    if "namespaces" in names:
        i = names.index("namespaces")
        rest = names[i + 2 :] if len(names) > i + 2 else ["namespaces"]
    else:
        rest = names[2:] if names and names[0] == "api" else names[3:]
    if len(rest) >= 3:
        return f"{rest[0]}/{rest[2]}"
    return rest[0] if rest else "?"


def delta(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    return {k: after.get(k, 0) - before.get(k, 0) for k in sorted(set(after) | set(before))}
