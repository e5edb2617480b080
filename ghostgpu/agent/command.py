"""`ghostgpu agent`: the node agent's loop. Watches its node's pods that can run (field selector
spec.nodeName and not Succeeded/Failed, kept slim: `agent_pod`), scans the proc root every
interval, serves the series on /metrics (with /healthz and /readyz) from the event loop. No state
on disk: a restart lists the pods and scans again. A scan that raises ends the process (exit 1):
the kubelet restarts it, and meanwhile its series are missing (UNKNOWN), never stale."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ghostgpu import __version__
from ghostgpu.agent import procfs
from ghostgpu.agent.exporter import AgentExporter
from ghostgpu.agent.scan import ScanResult, agent_pod, scan_node
from ghostgpu.boundary import BoundaryError
from ghostgpu.controller.inventory import gpu_predicate
from ghostgpu.controller.kube import PODS
from ghostgpu.controller.reflector import Reflector
from ghostgpu.controller.server import HealthServer
from ghostgpu.verdict import ProcessPolicy

log = logging.getLogger("ghostgpu.agent")
AGENT_USER_AGENT = f"ghostgpu-agent/{__version__}"


class AgentArgError(BoundaryError, ValueError):
    """A command-line value the agent cannot start with: what it is (naming the flag) and the fix."""

    def __init__(self, what: str, fix: str) -> None:
        super().__init__(f"error: {what}", f"fix: {fix}")


class ScanFailed(RuntimeError):
    """A scan raised: the agent stops serving and exits, rather than serve an old scan."""


@dataclass(frozen=True, slots=True)
class AgentSettings:
    node: str
    proc: Path
    host: str
    port: int
    interval_s: float


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise AgentArgError(f"--listen {value!r}: expected HOST:PORT", "give e.g. --listen 0.0.0.0:9402")
    return host.strip("[]") or "0.0.0.0", int(port)


def settings(node: str, proc: Path, listen: str, interval: float) -> AgentSettings:
    if not node:
        raise AgentArgError(
            "--node-name is empty (and so is NODE_NAME)",
            "give --node-name, or set NODE_NAME from the downward API (fieldRef spec.nodeName)",
        )
    if not interval > 0:
        raise AgentArgError(f"--interval {interval}: expected seconds > 0", "give e.g. --interval 15")
    try:
        procfs.pids(proc)
        procfs.uptime_s(proc)
    except (OSError, ValueError, IndexError) as exc:
        raise AgentArgError(
            f"--proc {proc}: not a readable proc root ({exc})",
            "give the host's /proc (the DaemonSet mounts it with hostPID: true)",
        ) from None
    host, port = parse_listen(listen)
    return AgentSettings(node, proc, host, port, interval)


class Agent:
    def __init__(self, api: Any, s: AgentSettings, policy: ProcessPolicy, gpu_resources: list[str]) -> None:
        self.s = s
        self.policy = policy
        self.is_gpu = gpu_predicate(gpu_resources)
        self.exporter = AgentExporter(s.node)
        # Only this node's pods that can still run: a finished pod leaves the watch (DELETED).
        self.pods = Reflector(
            api,
            PODS,
            field_selector=f"spec.nodeName={s.node},status.phase!=Succeeded,status.phase!=Failed",
            transform=lambda o: agent_pod(o, s.node, self.is_gpu),
        )
        self.server = HealthServer(
            self.exporter.registry, healthy=lambda: (True, "ok"), ready=self._ready, host=s.host, port=s.port
        )
        self.scans = 0

    def _ready(self) -> tuple[bool, str]:
        last = self.exporter.last
        if last is None:
            return False, "no scan yet"
        age = time.time() - last.timestamp
        if age > 3 * self.s.interval_s:
            return False, f"last scan {age:.0f}s ago"
        return True, "ok"

    def scan_once(self) -> ScanResult:
        now = time.time()
        t0 = time.perf_counter()
        pods = [p for p in self.pods.store.values() if p is not None]
        result = scan_node(pods, self.s.proc, self.policy, self.is_gpu, now=now)
        result = ScanResult(
            result.timestamp, result.containers, result.scanned_pids, time.perf_counter() - t0
        )
        self.exporter.publish(result)
        self.scans += 1
        return result

    async def run(self, *, max_scans: int | None = None) -> None:
        port = await self.server.start()
        log.info("agent serving", extra={"node": self.s.node, "port": port, "proc": str(self.s.proc)})
        watch = asyncio.create_task(self.pods.run())
        try:
            await self.pods.synced.wait()
            while max_scans is None or self.scans < max_scans:
                started = time.monotonic()
                # Off the loop: the watch and /metrics keep being served while /proc is read.
                try:
                    result = await asyncio.to_thread(self.scan_once)
                except Exception as exc:
                    log.exception("scan failed", extra={"node": self.s.node})
                    raise ScanFailed(f"{type(exc).__name__}: {exc}") from exc
                log.info(
                    "scan",
                    extra={
                        "containers": len(result.containers),
                        "pids": result.scanned_pids,
                        "seconds": round(result.duration_s, 4),
                    },
                )
                await asyncio.sleep(max(0.0, self.s.interval_s - (time.monotonic() - started)))
        finally:
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            await self.server.stop()


async def kube_api(kubeconfig: str | None) -> Any:
    from ghostgpu.boundary import kube_api as boundary_api
    from ghostgpu.controller.app import _identify

    api = await boundary_api(kubeconfig)
    _identify(api, AGENT_USER_AGENT)
    return api


def run_agent_command(
    config: Path | None,
    node: str,
    proc: Path,
    listen: str,
    interval: float,
    kubeconfig: str | None,
    *,
    echo: Any = print,
) -> int:
    """The `ghostgpu agent` command; a config or flag it cannot use raises (exit 2, ghostgpu.boundary)."""
    from ghostgpu.controller import jsonlog
    from ghostgpu.controller.app import load_any_config

    loaded = load_any_config(config)  # a bad file or flag: ConfigError, AgentArgError (ghostgpu.boundary)
    s = settings(node, proc, listen, interval)
    jsonlog.setup("INFO")

    async def main() -> None:
        api = await kube_api(kubeconfig)
        known = [f.resource for f in loaded.flavors or [] if f.device_class is None]
        await Agent(api, s, loaded.controller.processes.policy(), known).run()

    try:
        asyncio.run(main())
    except ScanFailed as exc:
        echo(f"error: scan failed: {exc}", err=True)
        return 1
    return 0
