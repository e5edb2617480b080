"""What the real-node idle-session modules share (tests/e2e/test_idle_sessions_real.py,
tests/e2e/test_idle_session_cases_real.py): the test policy, Jupyter driven through its own REST and
websocket API, the session pods on the devcluster's real node with the GPU double beside them, the
node agent as a process and a scrape target of its own, and reads of the owners, Events,
Prometheus and the decision log.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

import httpx
import websocket
import yaml
from kubernetes import client
from test_controller import REPO, Controller, controller_config, wait_for

from ghostgpu.devcluster import DevCluster
from ghostgpu.devcluster.fleet import Box, RealShape, deployment, the_running_pod
from ghostgpu.idle_policy import IdleSessionsConfig

AFTER, WARN_BEFORE = 40, 20  # seconds: the test policy
CPU_WINDOW = "40s"  # what the tests read of cAdvisor's counter: several of its 10-15 s refreshes
TOKEN = uuid.uuid4().hex
AGENT_TARGET = "idle-agent"


def busy_cell(seconds: float, *, spin_first: float = 0.0) -> str:
    """A cell that computes on the CPU and prints nothing for `seconds`: a quarter of each half
    second (well above cpuBelow, 0.02 cores; a small share of a machine the test shares), after
    `spin_first` seconds of spinning without a pause (a process the agent's scans see running)."""
    return (
        "import time\n"
        f"t = time.time() + {spin_first}\n"
        "x = 0\n"
        "while time.time() < t:\n"
        "    x += 1\n"
        f"end = time.time() + {seconds}\n"
        "while time.time() < end:\n"
        "    t = time.time() + 0.125\n"
        "    while time.time() < t:\n"
        "        x += 1\n"
        "    time.sleep(0.375)\n"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def notebook(port: int) -> Box:
    """A Jupyter server as a notebook image's container runs it (hostNetwork: its own port)."""
    return Box(
        [
            "jupyter-server",
            "--allow-root",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={port}",
            "--ServerApp.port_retries=0",
            "--ServerApp.open_browser=False",
            "--ServerApp.root_dir=/tmp",
            f"--IdentityProvider.token={TOKEN}",
        ],
        image="notebook",
    )


class Named(Protocol):
    """A session: its Deployment's name (also its `app` label), its pod and container."""

    name: str
    pod: str
    container: str


@dataclass
class Session:
    """A Jupyter server in a Deployment of its own, and the one kernel it runs."""

    name: str
    port: int
    pod: str = ""
    kernel: str = ""
    started: float = 0.0  # monotonic: when its kernel was up
    container: str = "notebook"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def box(self) -> Box:
        return notebook(self.port)

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"token {TOKEN}"}, timeout=10)

    def answers(self) -> bool:
        try:
            with self.api() as api:
                return api.get("/api/status").status_code == 200
        except httpx.HTTPError:
            return False

    def start_kernel(self) -> None:
        """POST /api/kernels, then one kernel_info request over the websocket: its reply says the
        kernel is up (the REST `execution_state` of a kernel started this way stays `starting`:
        the server subscribes to the kernel's status messages after the first one was sent)."""
        with self.api() as api:
            r = api.post("/api/kernels", json={"name": "python3"})
            assert r.status_code == 201, r.text
            self.kernel = r.json()["id"]
        self.request("kernel_info_request", {}, reply="kernel_info_reply")
        self.started = time.monotonic()

    def kernel_alive(self) -> bool:
        with self.api() as api:
            return api.get(f"/api/kernels/{self.kernel}").status_code == 200

    def execute(self, code: str) -> None:
        """Run `code` in the kernel; returns once the kernel says it is busy with it."""
        content = {
            "code": code,
            "silent": False,
            "store_history": False,
            "user_expressions": {},
            "allow_stdin": False,
            "stop_on_error": True,
        }
        self.request("execute_request", content, busy=True)

    def channels(self, timeout: float = 30) -> websocket.WebSocket:
        """A websocket to the kernel's channels, as a browser tab opens it."""
        return websocket.create_connection(
            f"ws://127.0.0.1:{self.port}/api/kernels/{self.kernel}/channels",
            header=[f"Authorization: token {TOKEN}"],
            timeout=timeout,
        )

    def request(self, msg_type: str, content: dict[str, Any], *, reply: str = "", busy: bool = False) -> None:
        """One request through the server's websocket (Jupyter's kernel protocol, v5 messages on
        the shell channel), waiting for its `reply` (or the kernel's busy status for it); the
        connection is closed after, as a browser tab that goes away."""
        ws = self.channels()
        try:
            msg_id = uuid.uuid4().hex
            header = {
                "msg_id": msg_id,
                "msg_type": msg_type,
                "username": "e2e",
                "session": uuid.uuid4().hex,
                "date": datetime.now(UTC).isoformat(),
                "version": "5.3",
            }
            msg = {"header": header, "parent_header": {}, "metadata": {}, "content": content}
            ws.send(json.dumps({**msg, "channel": "shell", "buffers": []}))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                m = json.loads(ws.recv())
                if m.get("parent_header", {}).get("msg_id") != msg_id:
                    continue
                if m.get("msg_type") == reply:
                    return
                if busy and m.get("msg_type") == "status" and m["content"]["execution_state"] == "busy":
                    return
            raise AssertionError(f"{self.name}: no answer to {msg_type}")
        finally:
            ws.close()


@dataclass
class Owners:
    """The sessions' Deployments, Events and pods in one namespace."""

    cluster: DevCluster
    ns: str

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.cluster.kube.api_client)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.cluster.kube.api_client)

    def annotations(self, s: Named) -> dict[str, str]:
        return self.apps.read_namespaced_deployment(s.name, self.ns).metadata.annotations or {}

    def replicas(self, s: Named) -> int:
        return int(self.apps.read_namespaced_deployment(s.name, self.ns).spec.replicas)

    def events(self, s: Named) -> list[Any]:
        sel = f"involvedObject.name={s.name},involvedObject.kind=Deployment"
        return self.core.list_namespaced_event(self.ns, field_selector=sel).items

    def has_event(self, s: Named, reason: str) -> bool:
        return any(e.reason == reason for e in self.events(s))

    def pods_gone(self, s: Named) -> bool:
        return not self.core.list_namespaced_pod(self.ns, label_selector=f"app={s.name}").items


def start_pods(cluster: DevCluster, ns: str, sessions: list[tuple[Named, Box]]) -> None:
    """Each session as a one-replica Deployment on the real node (its namespace and
    ghostgpu-system made first), its pod's name kept once it runs, and the GPU double for it:
    idle, a model's worth of steady memory."""
    images = cluster.state.node_images
    assert images is not None
    cluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    cluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ghostgpu-system"}})
    by_kind = {"notebook": images.notebook}
    for s, box in sessions:
        cluster.kube.apply(deployment(RealShape(s.name, {s.container: box}), ns, by_kind))
    core = client.CoreV1Api(cluster.kube.api_client)
    for s, _ in sessions:
        s.pod = wait_for(lambda s=s: the_running_pod(core, ns, s.name), 120, f"{s.name} running")
        gpu_double(cluster, ns, s)


def gpu_double(cluster: DevCluster, ns: str, s: Named) -> None:
    cluster.dcgm.set(ns, s.pod, util=0.0, fb_used_mib=20_000, container=s.container, node="localhost")


def start_agent(cluster: DevCluster, tmp: Path) -> subprocess.Popen[bytes]:
    """The real node agent (`ghostgpu agent`, scanning the host's /proc every second), scraped as
    the target AGENT_TARGET (the devcluster's ghostgpu-agent job serves the fake dcgm-exporter's
    agent series, which know nothing of these pods)."""
    port = free_port()
    agent = subprocess.Popen(
        [sys.executable, "-m", "ghostgpu.cli", "agent", "--kubeconfig", str(cluster.kubeconfig),
         "--node-name", "localhost", "--proc", "/proc", "--listen", f"127.0.0.1:{port}", "--interval", "1"],
        cwd=REPO, stdout=(tmp / "agent.log").open("w"), stderr=subprocess.STDOUT,
    )  # fmt: skip
    cluster.scrape(AGENT_TARGET, port)
    return agent


def stop_agent(cluster: DevCluster, agent: subprocess.Popen[bytes]) -> None:
    agent.terminate()
    agent.wait(timeout=20)
    cluster.unscrape(AGENT_TARGET)


def idle_config(tmp: Path, prometheus_url: str, **policy: Any) -> Path:
    """The controller in enforce mode under the test policy (`policy`: more idleSessions keys),
    reading the real agent's target."""
    path = controller_config(tmp, prometheus_url, "enforce")
    cfg = yaml.safe_load(path.read_text())
    c = cfg["controller"]
    c["idleSessions"] = {
        "mode": "enforce",
        "after": f"{AFTER}s",
        "warnBefore": f"{WARN_BEFORE}s",
        "afterBounds": {"min": "10s", "max": "1h"},
        **policy,
    }
    c["metrics"]["agentSource"] = {"job": "ghostgpu-controller", "target": AGENT_TARGET}
    path.write_text(yaml.safe_dump(cfg))
    return path


def promql(cluster: DevCluster, query: str) -> float | None:
    url = f"{cluster.state.prometheus_url}/api/v1/query"
    result = httpx.get(url, params={"query": query}, timeout=10).json()["data"]["result"]
    return float(result[0]["value"][1]) if result else None


def cpu_series(ns: str, s: Named) -> str:
    """The container's cAdvisor CPU counter under the default cpuSource selector."""
    sel = ", ".join(f'{k}=~"{v}"' for k, v in IdleSessionsConfig().cpu_source.items())
    where = f'namespace="{ns}", pod="{s.pod}", container="{s.container}"'
    return f"container_cpu_usage_seconds_total{{{sel}, {where}}}"


def cpu_rate(cluster: DevCluster, ns: str, s: Named, window: str) -> float:
    return promql(cluster, f"rate({cpu_series(ns, s)}[{window}])") or 0.0


def computing(cluster: DevCluster, ns: str, s: Named) -> bool:
    """Its container's CPU over CPU_WINDOW is above cpuBelow (asked again while Prometheus hangs)."""
    try:
        return cpu_rate(cluster, ns, s, CPU_WINDOW) > IdleSessionsConfig().cpu_below
    except httpx.HTTPError:
        return False


def agent_series(name: str, ns: str, s: Named) -> str:
    """One of the agent's idle-session series of the session's container."""
    return (
        f'{name}{{target="{AGENT_TARGET}", tracked_namespace="{ns}", tracked_pod="{s.pod}", '
        f'tracked_container="{s.container}"}}'
    )


def decisions_of(controller: Controller, ns: str, s: Named) -> list[dict[str, Any]]:
    """The controller's decision-log lines for the session's Deployment, in order."""
    key = f"Deployment/{ns}/{s.name}"
    lines = [json.loads(x) for x in controller.decisions.read_text().splitlines() if x.strip()]
    return [x for x in lines if x.get("workload") == key]


def wait_decision(
    controller: Controller, ns: str, s: Named, action: str, timeout: float = 30
) -> list[dict[str, Any]]:
    """The session's decision-log lines with `action`, once there is one. The leader writes a poll's
    lines after the poll's actions, so the stop itself (the scale, its Event) is seen first."""
    return wait_for(
        lambda: [d for d in decisions_of(controller, ns, s) if d.get("action") == action],
        timeout,
        f"a decision line with action {action} for {s.name}",
    )
