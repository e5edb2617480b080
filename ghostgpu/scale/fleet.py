"""The scale fleet on the local control plane: kwok GPU nodes, opted-in namespaces, and N bare GPU
pods labelled `ghostgpu.io/tracked=true`, created fast with bounded concurrency.

Why bare Pods: a bare Pod is its own workload (docs/design.md#labelling-contract), so N tracked
pods are N workloads and N API objects. N Deployments would add N ReplicaSets and the
controller-manager's churn to the set-up without changing what a poll reads: the controller's poll
path (watch caches -> one PromQL query -> exec for idle candidates -> verdicts) is the same for
every kind; only the reclaim action differs, and the bench runs in shadow mode. Pods are bound to
their node at creation (`spec.nodeName`), so 10,000 pods do not wait for the scheduler, which is
not what is measured.

Which pods are idle is deterministic: pod i is idle iff i % stride == 0 (stride = 1 / idle
fraction), so growing the fleet from 100 to 10,000 keeps the first pods' truth.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from ghostgpu.devcluster.nodes import GpuNodeSpec, Taint, node_manifest

OPT_IN = {"ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": "research"}
FLEET_LABEL = "ghostgpu.io/scale-fleet"
GPUS_PER_NODE = 8
H100_LABELS = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
# An idle holder only: nothing runs (procps's listing of the controller's argv).
IDLE_TABLE = "    PID    PPID STAT ELAPSED COMMAND\n      1       0 S        900 sleep infinity\n"
# A busy pod's processes, as the node agent reports them (exec never lists a busy pod: only the
# utilization-idle candidates are asked): a shell and the training program it started.
BUSY_TABLE = (
    "    PID    PPID STAT ELAPSED COMMAND\n"
    "      1       0 Ss       900 /bin/sh -c python train.py\n"
    "      7       1 Rl       899 python train.py --epochs 90\n"
)
# An idle Jupyter session (`bench scale --idle-sessions`): a notebook server and its kernel, both
# asleep, started a day ago (older than any idle-session window, so the new-process rung is idle).
# The verdict counts them as live work (IDLE_HELD after the long window at 0 %); the node agent
# tells their class, notebook (idle_sessions.class_of), and exports its idle-session facts.
SESSION_TABLE = (
    "    PID    PPID STAT ELAPSED COMMAND\n"
    "      1       0 Ss     90000 /usr/bin/tini -g -- jupyter lab\n"
    "      7       1 Sl     90000 /opt/conda/bin/python3 /opt/conda/bin/jupyter-lab --ip=0.0.0.0\n"
    "     31       7 Ssl    86400 /opt/conda/bin/python3 -m ipykernel_launcher -f /tmp/kernel-1.json\n"
)


@dataclass(frozen=True)
class FleetSpec:
    nodes: int = 1250  # 1,250 x 8 GPUs = 10,000 GPUs: every pod of the largest fleet fits
    namespaces: int = 20
    idle_fraction: float = 0.02
    # Of the idle pods, this share are idle sessions (SESSION_TABLE, IDLE_HELD) instead of a
    # finished job's holder (FINISHED_IDLE); 0 outside `bench scale --idle-sessions`.
    session_fraction: float = 0.0

    @property
    def stride(self) -> int:
        return max(1, round(1 / self.idle_fraction)) if self.idle_fraction > 0 else 0

    def namespace(self, i: int) -> str:
        return f"scale-{i % self.namespaces:02d}"

    def namespace_names(self) -> list[str]:
        return [f"scale-{k:02d}" for k in range(self.namespaces)]

    @staticmethod
    def pod(i: int) -> str:
        return f"g{i:05d}"

    @staticmethod
    def node(j: int) -> str:
        return f"gpu-s-{j:04d}"

    def node_of(self, i: int) -> str:
        return self.node((i // GPUS_PER_NODE) % self.nodes)

    def idle(self, i: int) -> bool:
        return self.stride > 0 and i % self.stride == 0

    def idle_count(self, n: int) -> int:
        return sum(1 for i in range(n) if self.idle(i))

    @property
    def session_stride(self) -> int:
        return max(1, round(1 / self.session_fraction)) if self.session_fraction > 0 else 0

    def session(self, i: int) -> bool:
        """Pod i is an idle session: every `session_stride`-th idle pod, counted from pod 0, so a
        grown fleet keeps its first pods' truth."""
        return self.idle(i) and self.session_stride > 0 and (i // self.stride) % self.session_stride == 0

    def session_count(self, n: int) -> int:
        return sum(1 for i in range(n) if self.session(i))


class KubeHTTP:
    """Raw async HTTP to the devcluster's apiserver with the admin client certificate."""

    def __init__(self, server: str, pki: Path, *, concurrency: int = 32) -> None:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        self.client = httpx.AsyncClient(base_url=server, verify=ctx, limits=limits, timeout=60)
        self.sem = asyncio.Semaphore(concurrency)

    async def aclose(self) -> None:
        await self.client.aclose()

    async def create(self, path: str, body: dict[str, Any]) -> None:
        """POST; 409 AlreadyExists is success (the fleet grows incrementally and re-runs)."""
        async with self.sem:
            for attempt in range(5):
                r = await self.client.post(path, json=body)
                if r.status_code in (200, 201, 202, 409):
                    return
                if r.status_code in (429, 500, 503, 504) and attempt < 4:
                    await asyncio.sleep(0.5 * (attempt + 1))
                    continue
                raise RuntimeError(f"POST {path}: HTTP {r.status_code} {r.text[:200]}")

    async def create_all(self, path_and_bodies: Iterable[tuple[str, dict[str, Any]]]) -> int:
        items = list(path_and_bodies)
        await asyncio.gather(*(self.create(p, b) for p, b in items))
        return len(items)

    async def list_all(self, path: str, params: dict[str, str] | None = None) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        q: dict[str, str] = {"limit": "1000", **(params or {})}
        while True:
            r = await self.client.get(path, params=q)
            r.raise_for_status()
            body = r.json()
            out.extend(body.get("items") or [])
            cont = (body.get("metadata") or {}).get("continue")
            if not cont:
                return out
            q["continue"] = cont


def node_body(spec: FleetSpec, j: int) -> dict[str, Any]:
    node = GpuNodeSpec(
        name=spec.node(j),
        gpus=GPUS_PER_NODE,
        labels={**H100_LABELS, FLEET_LABEL: "true"},
        taints=[Taint(key="nvidia.com/gpu", value="present")],
        pods=16,
    )
    return node_manifest(node)


def pod_body(spec: FleetSpec, i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": spec.pod(i),
            "namespace": spec.namespace(i),
            "labels": {"ghostgpu.io/tracked": "true", FLEET_LABEL: "true"},
        },
        "spec": {
            "nodeName": spec.node_of(i),
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": "main",
                    "image": "registry.local/train:fake",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def cluster_exec_body(spec: FleetSpec, table: Path) -> dict[str, Any]:
    """One kwok ClusterExec for every fleet pod: `ps` prints the idle table (see devcluster's shim)."""
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "ClusterExec",
        "metadata": {"name": "ghostgpu-scale"},
        "spec": {
            "selector": {"matchNamespaces": spec.namespace_names()},
            "execs": [
                {
                    "local": {
                        "envs": [
                            {"name": "GHOSTGPU_PROC_TABLE", "value": str(table)},
                            {"name": "GHOSTGPU_PROC_EXIT", "value": "0"},
                        ]
                    }
                }
            ],
        },
    }


def session_exec_body(spec: FleetSpec, i: int, table: Path) -> dict[str, Any]:
    """A kwok Exec of idle session i's own: `ps` prints SESSION_TABLE. kwok looks up a pod's own
    Exec before the ClusterExec every other fleet pod answers from (cluster_exec_body)."""
    return {
        "apiVersion": "kwok.x-k8s.io/v1alpha1",
        "kind": "Exec",
        "metadata": {"name": spec.pod(i), "namespace": spec.namespace(i)},
        "spec": {
            "execs": [
                {
                    "local": {
                        "envs": [
                            {"name": "GHOSTGPU_PROC_TABLE", "value": str(table)},
                            {"name": "GHOSTGPU_PROC_EXIT", "value": "0"},
                        ]
                    }
                }
            ]
        },
    }


async def ensure_session_execs(kube: KubeHTTP, spec: FleetSpec, start: int, stop: int, table: Path) -> int:
    """The idle sessions among pods start..stop-1 answer exec mode's `ps` with their processes, so
    that exec mode and agent mode see the same fleet."""
    table.write_text(SESSION_TABLE)
    return await kube.create_all(
        (
            f"/apis/kwok.x-k8s.io/v1alpha1/namespaces/{spec.namespace(i)}/execs",
            session_exec_body(spec, i, table),
        )
        for i in range(start, stop)
        if spec.session(i)
    )


async def ensure_base(kube: KubeHTTP, spec: FleetSpec, table: Path, log: Any = print) -> None:
    """Namespaces, the controller's lease namespace, the exec table and the kwok nodes."""
    table.write_text(IDLE_TABLE)
    nss = [*spec.namespace_names()]
    await kube.create_all(
        (
            "/api/v1/namespaces",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": OPT_IN}},
        )
        for ns in nss
    )
    await kube.create(
        "/api/v1/namespaces",
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ghostgpu-system"}},
    )
    await kube.create("/apis/kwok.x-k8s.io/v1alpha1/clusterexecs", cluster_exec_body(spec, table))
    n = await kube.create_all(("/api/v1/nodes", node_body(spec, j)) for j in range(spec.nodes))
    log(f"[fleet] {n} kwok GPU nodes created")

    async def nodes_ready(timeout: float) -> None:
        await wait_for(
            lambda: _ready_nodes(kube),
            spec.nodes,
            what="kwok GPU nodes Ready with an address",
            timeout=timeout,
            log=log,
        )

    try:
        await nodes_ready(420)
    except TimeoutError:
        # kwok under this load has left some Ready nodes without `status.addresses` (and their
        # kubelet port) for good (6,147 of 6,250 after 10 minutes in one run): give them what kwok
        # gave the others (--node-ip=127.0.0.1, --node-port), so exec can reach their pods.
        fixed = await _address_nodes(kube)
        log(f"[fleet] gave {fixed} Ready nodes kwok's address and kubelet port")
        await nodes_ready(300)
    # Pods need the namespace's default ServiceAccount (the controller-manager creates it).
    await wait_for(
        lambda: _service_accounts(kube, nss), len(nss), what="default ServiceAccounts", timeout=120, log=log
    )


async def _ready_nodes(kube: KubeHTTP) -> int:
    """Nodes Ready *and* with an address: kwok under load (6,250 nodes) marks some Ready before it
    fills `status.addresses`, and the apiserver cannot route an exec to such a node ("no preferred
    addresses found"): the idle pods on it would read as exec errors (UNKNOWN)."""
    nodes = await kube.list_all("/api/v1/nodes", {"labelSelector": f"{FLEET_LABEL}=true"})
    return sum(
        1
        for n in nodes
        if _routable(n)
        and any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (n.get("status") or {}).get("conditions") or []
        )
    )


def _routable(node: dict[str, Any]) -> bool:
    """An exec can reach the node's pods: an address and kwok's kubelet port (0 when unset)."""
    status = node.get("status") or {}
    port = ((status.get("daemonEndpoints") or {}).get("kubeletEndpoint") or {}).get("Port")
    return bool(status.get("addresses")) and bool(port)


async def _address_nodes(kube: KubeHTTP) -> int:
    """Give every fleet node kwok left unroutable what kwok gave the others: its addresses (one
    InternalIP: a Hostname address would be tried first by the apiserver, and no DNS here knows
    kwok's node names) and its kubelet endpoint (without it, an exec goes to port 0)."""
    nodes = await kube.list_all("/api/v1/nodes", {"labelSelector": f"{FLEET_LABEL}=true"})
    done = next((n for n in nodes if _routable(n)), None)
    if done is None:
        raise TimeoutError("kwok has made no fleet node routable: nothing to copy its endpoint from")
    addresses, endpoints = done["status"]["addresses"], done["status"]["daemonEndpoints"]
    missing = [n["metadata"]["name"] for n in nodes if not _routable(n)]
    for name in missing:
        r = await kube.client.patch(
            f"/api/v1/nodes/{name}/status",
            content=json.dumps({"status": {"addresses": addresses, "daemonEndpoints": endpoints}}),
            headers={"Content-Type": "application/merge-patch+json"},
        )
        r.raise_for_status()
    return len(missing)


async def _service_accounts(kube: KubeHTTP, namespaces: Sequence[str]) -> int:
    sas = await kube.list_all("/api/v1/serviceaccounts", {"fieldSelector": "metadata.name=default"})
    have = {(s.get("metadata") or {}).get("namespace") for s in sas}
    return sum(1 for ns in namespaces if ns in have)


async def running_pods(kube: KubeHTTP) -> int:
    pods = await kube.list_all("/api/v1/pods", {"labelSelector": f"{FLEET_LABEL}=true"})
    return sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Running")


async def pod_uids(kube: KubeHTTP) -> dict[tuple[str, str], str]:
    """Every fleet pod's uid by (namespace, name): the node agent's series carry it."""
    pods = await kube.list_all("/api/v1/pods", {"labelSelector": f"{FLEET_LABEL}=true"})
    return {(p["metadata"]["namespace"], p["metadata"]["name"]): p["metadata"]["uid"] for p in pods}


async def grow_pods(kube: KubeHTTP, spec: FleetSpec, start: int, stop: int, log: Any = print) -> None:
    """Create pods start..stop-1 and wait until all `stop` fleet pods run."""
    n = await kube.create_all(
        (f"/api/v1/namespaces/{spec.namespace(i)}/pods", pod_body(spec, i)) for i in range(start, stop)
    )
    log(f"[fleet] {n} pods created ({start}..{stop - 1})")
    await wait_for(lambda: running_pods(kube), stop, what="fleet pods Running", timeout=1800, log=log)


async def wait_for(probe: Any, want: int, *, what: str, timeout: float, log: Any = print) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last = -1
    while True:
        have = await probe()
        if have >= want:
            log(f"[fleet] {what}: {have}/{want}")
            return
        if have != last:
            log(f"[fleet] {what}: {have}/{want} ...")
            last = have
        if loop.time() > deadline:
            raise TimeoutError(f"{what}: {have}/{want} after {timeout:.0f}s")
        await asyncio.sleep(2.0)
