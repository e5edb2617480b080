"""Real faults on the devcluster's real node (kubelet + containerd + runc), with the controller
(`ghostgpu controller`, enforce mode, exec process source) polling through them. Each test says
the verdict the fault must give and reads the decision log for why a workload was held:

- the kubelet stopped and started again while the controller polls: the exec through the
  apiserver fails, so an idle-looking workload is UNKNOWN (processes-failed), never reclaimed;
  once the kubelet is back the truly finished one is reclaimed and the live one kept;
- containerd stopped and started again: the same, through the kubelet's failed CRI calls;
- the node NotReady (the kubelet down until the node controller marks the node): the same;
- a GPU container's main process SIGKILLed while the child it never reaps stays (a real defunct
  process): ACTIVE while the GPU is busy, UNKNOWN while GPU memory is held, ZOMBIE_CRASHED only
  once every signal agrees;
- a container OOM-killed and restarted by the kubelet: its restart is the kubelet's (OOMKilled,
  exit 137), and the restarted live container is never reclaimed;
- the node agent replaced while the controller (now processSource: agent) polls, as a DaemonSet
  rollout replaces its pod: while no agent reports, idle-looking workloads are UNKNOWN (the
  agent's series missing); once the new agent reports, the finished one is reclaimed.

Only the GPU is a double (the fake dcgm-exporter). Every workload not meant to be reclaimed keeps
its replica on every check; the reclaimable ones are reclaimed only after their fault is over.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from test_controller import REPO, Controller, controller_config, opt_in, wait_for

from ghostgpu.devcluster import DevCluster, FakeDcgmClient, realnode
from ghostgpu.devcluster.fleet import SLEEP_LONG, Box, RealShape, deployment, sh, the_running_pod

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.real_node, pytest.mark.timeout(900)]

# A GPU worker that the test SIGKILLs from the host; its parent (the shell turned `sleep infinity`)
# never waits for it.
WORKER = "import time; time.sleep(10**9 + 7)"
OOM_LIMIT = "64Mi"
SHAPES = {
    # Live work in a batch gap: 0 % GPU, a live python. Never reclaimed, whatever fails.
    "gap": RealShape("gap", {"main": Box(["python3", "-c", SLEEP_LONG])}),
    # Finished (a shell kept alive by `sleep infinity`): reclaimable, but only once signals work.
    # Busy until its fault starts, so that each fault meets one that looks idle for the first time.
    "finished-kubelet": RealShape("finished-kubelet", {"main": sh("python3 -c 'print(1)'; sleep infinity")}),
    "finished-containerd": RealShape(
        "finished-containerd", {"main": sh("python3 -c 'print(1)'; sleep infinity")}
    ),
    "finished-notready": RealShape(
        "finished-notready", {"main": sh("python3 -c 'print(1)'; sleep infinity")}
    ),
    "finished-rollout": RealShape("finished-rollout", {"main": sh("python3 -c 'print(1)'; sleep infinity")}),
    "zombie": RealShape("zombie", {"main": sh(f'python3 -c "{WORKER}" & exec sleep infinity')}),
    # Allocates past its memory limit once (OOM-killed), then runs a live python.
    "oom": RealShape(
        "oom",
        {
            "main": sh(
                f'if [ -e /state/oomed ]; then exec python3 -c "{SLEEP_LONG}"; fi; touch /state/oomed; '
                "exec python3 -c 'b = bytearray(1 << 30); import time; time.sleep(600)'"
            )
        },
    ),
}
NEVER = {"gap", "oom"}  # live throughout
# Samples of zero before IDLE_HELD: far past the module's length, so that the live ones (idle GPU,
# live process) stay ACTIVE however slow the machine is. A 60-sample window was reached on a loaded
# run, and the OOM test then waited for an ACTIVE that IDLE_HELD had rightly replaced.
LONG_WINDOW = 3600


@dataclass
class Node:
    cluster: DevCluster
    ns: str
    ctrl: Controller
    dcgm: FakeDcgmClient
    pods: dict[str, str] = field(default_factory=dict)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.cluster.kube.api_client)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.cluster.kube.api_client)

    def verdict(self, name: str) -> str | None:
        """The verdict of the controller's last poll (the decision log writes a line on a change)."""
        lines = self.decisions(name)
        return str(lines[-1]["verdict"]) if lines else None

    def replicas(self, name: str) -> int:
        return int(self.apps.read_namespaced_deployment(name, self.ns).spec.replicas)

    def gpu(self, name: str, util: float, fb_mib: float = 0.0) -> None:
        self.dcgm.set(
            self.ns, self.pods[name], util=util, fb_used_mib=fb_mib, container="main", node="localhost"
        )

    def decisions(self, name: str, since: float = 0.0) -> list[dict[str, Any]]:
        """The decision log's lines for one workload, from `since` on."""
        if not self.ctrl.decisions.exists():
            return []
        out = []
        for line in self.ctrl.decisions.read_text().splitlines():
            d = json.loads(line)
            if d.get("workload") == f"Deployment/{self.ns}/{name}" and d.get("ts", 0) >= since:
                out.append(d)
        return out

    def check_live_kept(self) -> None:
        for name in NEVER:
            assert self.replicas(name) == 1, f"{name} (live) lost its replica"
            assert self.verdict(name) not in ("FINISHED_IDLE", "ZOMBIE_CRASHED"), name

    def node_ready(self) -> str:
        node = self.core.read_node(realnode.REAL_NODE_NAME)
        return next((c.status for c in node.status.conditions or [] if c.type == "Ready"), "")


@pytest.fixture(scope="module")
def node(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:
    if devcluster.state.real_node is None:
        pytest.fail(f"the devcluster's real node did not start: {devcluster.state.real_node_error}")
    if "prometheus" not in devcluster.state.addons:
        pytest.fail("needs the devcluster's Prometheus and fake dcgm-exporter")
    images = devcluster.state.node_images
    assert images is not None
    t0 = time.monotonic()
    ns = f"realfaults-{int(time.time())}"
    kube = devcluster.kube
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ghostgpu-system"}})
    for name, shape in SHAPES.items():
        obj = deployment(shape, ns, {"workload": images.workload})
        if name == "oom":
            obj["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = OOM_LIMIT
        kube.apply(obj)
    core = client.CoreV1Api(kube.api_client)
    pods = {n: wait_for(lambda n=n: the_running_pod(core, ns, n), 120, f"{n} running") for n in SHAPES}
    tmp = tmp_path_factory.mktemp("realfaults")
    cfg_path = controller_config(tmp, devcluster.state.prometheus_url, "enforce")
    cfg = yaml.safe_load(cfg_path.read_text())
    cfg["controller"]["longWindow"] = LONG_WINDOW
    cfg_path.write_text(yaml.safe_dump(cfg))
    dcgm = devcluster.dcgm
    n = Node(devcluster, ns, Controller(devcluster.kubeconfig, cfg_path, tmp, "realfaults"), dcgm, pods)
    try:
        for name in SHAPES:
            n.gpu(name, 0.0 if name in NEVER else 60.0)
        opt_in(devcluster, ns)
        n.ctrl.wait_polls(3, timeout=120)
        wait_for(
            lambda: all(n.verdict(s) == "ACTIVE" for s in SHAPES if s != "oom"), 90, "every shape ACTIVE"
        )
        print(f"[real-node faults] set up in {time.monotonic() - t0:.1f}s")
        yield n
    finally:
        n.ctrl.stop()
        for pod in pods.values():
            dcgm.remove(ns, pod)
        kube.delete("v1", "Namespace", ns)


def held_while(node: Node, name: str, since: float, until: float) -> list[dict[str, Any]]:
    """The decision lines for `name` written while a fault lasted."""
    return [d for d in node.decisions(name, since) if d["ts"] <= until]


def outage(node: Node, daemon: str, workload: str, *, until_not_ready: bool = False) -> None:
    """`workload` goes idle as `daemon` stops; while it is down the controller must hold it (UNKNOWN:
    processes-failed) and the live one too; once back, the finished one is reclaimed."""
    node.gpu(workload, 0.0)
    t0 = time.time()
    launch = node.cluster.stop_node_daemon(daemon)
    try:
        # Enough polls for the window to fill with zeros and the processes to be asked for.
        wait_for(lambda: node.verdict(workload) == "UNKNOWN", 60, f"{workload} UNKNOWN with {daemon} down")
        if until_not_ready:
            wait_for(lambda: node.node_ready() == "Unknown", 90, "the node NotReady")
            print(f"[real-node faults] node NotReady after {time.time() - t0:.0f}s")
            node.ctrl.wait_polls(2)
        else:
            node.ctrl.wait_polls(2)
        node.check_live_kept()
        assert node.replicas(workload) == 1, f"{workload} reclaimed while {daemon} was down"
    finally:
        node.cluster.start_node_daemon(launch)
    t_back = time.time()
    wait_for(lambda: node.node_ready() == "True", 90, "the node Ready again")
    assert all(node.cluster.state.running().values()), "the restarted daemon is not recorded"
    held = held_while(node, workload, t0, t_back)
    assert held and all(d["verdict"] == "UNKNOWN" for d in held), held
    assert any("processes-failed" in d["reasons"] for d in held), held
    for name in NEVER:
        lines = held_while(node, name, t0, t_back)
        assert all(d["verdict"] not in ("FINISHED_IDLE", "ZOMBIE_CRASHED") for d in lines), (name, lines)
    # The fault over: the finished workload is reclaimed, the live one kept.
    wait_for(lambda: node.replicas(workload) == 0, 120, f"{workload} reclaimed once {daemon} is back")
    node.check_live_kept()
    print(
        f"[real-node faults] {daemon}: {len(held)} held decisions, "
        f"reclaimed {time.time() - t_back:.0f}s after it was back"
    )


def test_kubelet_restarted_while_polling_holds_then_reclaims(node: Node) -> None:
    outage(node, "kubelet", "finished-kubelet")


def test_containerd_restarted_while_polling_holds_then_reclaims(node: Node) -> None:
    outage(node, "containerd", "finished-containerd")


def test_node_not_ready_for_a_while_holds_then_reclaims(node: Node) -> None:
    outage(node, "kubelet", "finished-notready", until_not_ready=True)


def host_pid(container_id: str, needle: str) -> int:
    """The host pid of the container's process whose command line holds `needle`."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            if container_id in (d / "cgroup").read_text() and needle in (d / "cmdline").read_bytes().decode():
                return int(d.name)
        except OSError:
            continue
    raise AssertionError(f"no process {needle!r} in container {container_id[:12]}")


def test_main_process_killed_with_an_unreaped_child_is_a_zombie_only_when_every_signal_agrees(
    node: Node,
) -> None:
    pod = node.core.read_namespaced_pod(node.pods["zombie"], node.ns)
    cid = pod.status.container_statuses[0].container_id.split("://", 1)[1]
    pid = host_pid(cid, "10**9 + 7")
    os.kill(pid, signal.SIGKILL)  # its parent, `sleep infinity`, never reaps it: a real defunct
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline, "the killed worker is not defunct"
        time.sleep(0.1)
    t0 = time.time()
    # The GPU still busy: the defunct process alone decides nothing.
    node.ctrl.wait_polls(3)
    assert node.verdict("zombie") == "ACTIVE"
    # Idle, but GPU memory still held: a context the listing does not show; never reclaimable.
    t1 = time.time()
    node.gpu("zombie", 0.0, fb_mib=4096)
    wait_for(lambda: node.verdict("zombie") == "UNKNOWN", 60, "zombie UNKNOWN with memory held")
    node.ctrl.wait_polls(2)
    assert node.replicas("zombie") == 1
    # The decision log writes a line when a row changes, stamped with its poll's start: a poll that
    # began shortly before the change can be the one that saw it.
    held = held_while(node, "zombie", t1 - 5, time.time())
    assert any("memory-without-process" in d["reasons"] for d in held), held
    # Every signal agrees: idle, memory free, only holders and a defunct worker left.
    node.gpu("zombie", 0.0, fb_mib=0)
    wait_for(lambda: node.replicas("zombie") == 0, 90, "the zombie reclaimed")
    lines = node.decisions("zombie", t0)
    crashed = [d for d in lines if d["verdict"] == "ZOMBIE_CRASHED"]
    assert crashed and "defunct-only" in crashed[0]["reasons"], [
        (round(d["ts"] - t0, 1), d["verdict"], d["action"], d["reasons"]) for d in lines
    ]
    assert all(d["verdict"] != "ZOMBIE_CRASHED" for d in lines if d["ts"] < crashed[0]["ts"])
    node.check_live_kept()


def test_oom_killed_container_restarted_by_the_kubelet_is_never_reclaimed(node: Node) -> None:
    def restarted() -> Any:
        pod = node.core.read_namespaced_pod(node.pods["oom"], node.ns)
        st = pod.status.container_statuses[0]
        return st if st.restart_count >= 1 and st.state.running and st.ready else None

    st = wait_for(restarted, 120, "the OOM-killed container restarted by the kubelet")
    assert (st.last_state.terminated.reason, st.last_state.terminated.exit_code) == ("OOMKilled", 137)
    t0 = time.time()
    # A restart resets the container's window; with a loaded machine's slower polls refilling it
    # has taken over a minute.
    wait_for(lambda: node.verdict("oom") == "ACTIVE", 150, "the restarted container ACTIVE")
    node.ctrl.wait_polls(3)
    assert node.replicas("oom") == 1
    lines = node.decisions("oom")
    assert lines and all(d["verdict"] not in ("FINISHED_IDLE", "ZOMBIE_CRASHED") for d in lines), lines
    now = [d for d in lines if d["ts"] >= t0 - 5] or lines[-1:]
    assert "live-process" in now[-1]["reasons"], now
    node.check_live_kept()


def start_agent(node: Node, name: str, agent_ns: str) -> subprocess.Popen[bytes]:
    """`ghostgpu agent` for the real node, as its DaemonSet pod runs it, scraped by Prometheus as
    the bundle's ServiceMonitor scrapes it (its job; its namespace the agent's)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cluster = node.cluster
    proc = subprocess.Popen(
        [sys.executable, "-m", "ghostgpu.cli", "agent", "--kubeconfig", str(cluster.kubeconfig),
         "--node-name", realnode.REAL_NODE_NAME, "--proc", "/proc", "--listen", f"127.0.0.1:{port}",
         "--interval", "1"],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    cluster.scrape(f"{node.ns}-{name}", port, labels={"namespace": agent_ns})
    return proc


def test_agent_replaced_during_polls_holds_while_no_agent_reports(
    node: Node, tmp_path: Path, prometheus_url: str
) -> None:
    node.ctrl.stop()  # the exec-mode controller: from here on the controller reads the agent
    agent_ns = f"{node.ns}-agents"
    path = controller_config(tmp_path, prometheus_url, "enforce", process_source="agent")
    cfg = yaml.safe_load(path.read_text())
    cfg["controller"]["longWindow"] = LONG_WINDOW
    cfg["controller"]["metrics"]["agentSource"] = {"job": "ghostgpu-controller", "namespace": agent_ns}
    path.write_text(yaml.safe_dump(cfg))
    old = start_agent(node, "agent-old", agent_ns)
    new: subprocess.Popen[bytes] | None = None
    node.ctrl = Controller(node.cluster.kubeconfig, path, tmp_path, "realfaults-agent")
    try:
        wait_for(lambda: node.verdict("gap") == "ACTIVE", 90, "gap ACTIVE from the agent's counts")
        # The rollout takes the old agent's pod first (maxUnavailable: 1) as a workload goes idle.
        node.gpu("finished-rollout", 0.0)
        t0 = time.time()
        old.terminate()
        old.wait(20)
        node.cluster.unscrape(f"{node.ns}-agent-old")
        wait_for(lambda: node.verdict("finished-rollout") == "UNKNOWN", 60, "UNKNOWN with no agent")
        node.ctrl.wait_polls(2)
        assert node.replicas("finished-rollout") == 1, "reclaimed while no agent reported"
        node.check_live_kept()
        new = start_agent(node, "agent-new", agent_ns)
        t_back = time.time()
        wait_for(lambda: node.replicas("finished-rollout") == 0, 90, "reclaimed once the new agent reports")
        held = held_while(node, "finished-rollout", t0, t_back)
        assert held and all(d["verdict"] == "UNKNOWN" for d in held), held
        assert any("processes-failed" in d["reasons"] for d in held), held
        wait_for(lambda: node.verdict("gap") == "ACTIVE", 60, "gap ACTIVE again from the new agent")
        node.check_live_kept()
    finally:
        for proc in (old, new):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(20)
        for name in ("agent-old", "agent-new"):
            node.cluster.unscrape(f"{node.ns}-{name}")
