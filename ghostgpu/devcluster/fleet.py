"""Workloads on the devcluster's real node: a shape is a pod whose real processes (kubelet,
containerd, runc) look like one of the fleet's cases (a kernel that finished, a crashed worker, a
server between requests). tests/e2e/test_real_node.py and `ghostgpu devcluster demo` build their
pods from these definitions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ghostgpu.devcluster.nodes import GPU_RESOURCE
from ghostgpu.devcluster.realnode import REAL_NODE_LABEL, REAL_NODE_SCHEDULER, REAL_NODE_TAINT

TRACKED_LABEL = "ghostgpu.io/tracked"
GPU_TOLERATION = {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
# BusyBox's applets first on PATH: the container's `ps` is BusyBox's (no etimes column).
BUSYBOX_PATH = "/bb:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
BUSYBOX_SETUP = "mkdir -p /bb && for a in ps ash sleep; do ln -sf /usr/bin/busybox /bb/$a; done && "
SUPERVISORD = (
    "printf '[supervisord]\\nnodaemon=true\\nuser=root\\nlogfile=/tmp/sd.log\\npidfile=/tmp/sd.pid\\n"
    "[program:{name}]\\ncommand={command}\\nautorestart=false\\nstartsecs=0\\n' > /tmp/sd.conf && "
    "exec /usr/bin/supervisord -n -c /tmp/sd.conf"
)
SLEEP_LONG = "import time; time.sleep(10**9)"


@dataclass
class Box:
    """One container of a real shape."""

    command: list[str]
    image: str = "workload"  # or "distroless"
    gpus: int = 1
    busybox: bool = False


@dataclass
class RealShape:
    corpus: str  # the shape's name in tests/shapes/shapes.yaml
    containers: dict[str, Box]
    shared_pid: bool = False
    session: str | None = None  # "tty" / "pipe": a held-open exec of bash into the first container
    crash_first: bool = False  # the first container exits 1 once, then runs (a real restart)
    extra: dict[str, Box] = field(default_factory=dict)  # containers without a GPU

    @property
    def name(self) -> str:  # a Deployment name (<= 63 characters)
        return self.corpus[:50].rstrip("-")


def sh(script: str, **kw: Any) -> Box:
    return Box(["/bin/sh", "-c", script], **kw)


def container(name: str, box: Box, images: dict[str, str]) -> dict[str, Any]:
    c: dict[str, Any] = {
        "name": name,
        "image": images[box.image],
        "imagePullPolicy": "Never",  # imported into the node's containerd; nothing is ever pulled
        "command": box.command,
        "volumeMounts": [{"name": "state", "mountPath": "/state"}] if box.image == "workload" else [],
    }
    if box.gpus:
        c["resources"] = {"limits": {GPU_RESOURCE: str(box.gpus)}}
    if box.busybox:
        c["env"] = [{"name": "PATH", "value": BUSYBOX_PATH}]
    return c


def real_node_pod_spec(boxes: dict[str, Box], images: dict[str, str]) -> dict[str, Any]:
    """A pod spec the real node runs (and only the real node: its scheduler, label and taint)."""
    return {
        # containerd 1.6 gives a pod network only with an eth0 address: the real node's pods share
        # the host's network namespace (nothing in them talks to anything but loopback).
        "hostNetwork": True,
        "schedulerName": REAL_NODE_SCHEDULER,  # the default scheduler never places a pod there
        "nodeSelector": {REAL_NODE_LABEL: "true"},
        "tolerations": [GPU_TOLERATION, {"key": REAL_NODE_TAINT.key, "operator": "Exists"}],
        "terminationGracePeriodSeconds": 1,
        "volumes": [{"name": "state", "emptyDir": {}}],
        "containers": [container(n, b, images) for n, b in boxes.items()],
    }


def deployment(
    shape: RealShape, ns: str, images: dict[str, str], *, kind: str = "Deployment", name: str | None = None
) -> dict[str, Any]:
    """The shape as a one-replica Deployment (or StatefulSet) named after it (or `name`)."""
    name = name or shape.name
    labels = {"app": name, TRACKED_LABEL: "true"}
    spec = real_node_pod_spec({**shape.containers, **shape.extra}, images)
    if shape.shared_pid:
        spec["shareProcessNamespace"] = True
    workload: dict[str, Any] = {
        "replicas": 1,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": labels}, "spec": spec},
    }
    if kind == "StatefulSet":
        workload["serviceName"] = name
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": workload,
    }


def the_running_pod(core: Any, namespace: str, app: str) -> str | None:
    """The name of the one pod labelled `app` that runs with every container ready (not being
    deleted), or None while there is none or more than one (a rollout, a restart in progress)."""
    pods = core.list_namespaced_pod(namespace, label_selector=f"app={app}").items
    ready = [
        p.metadata.name
        for p in pods
        if p.status.phase == "Running"
        and not p.metadata.deletion_timestamp
        and all(cs.ready for cs in p.status.container_statuses or [])
    ]
    return ready[0] if len(ready) == 1 else None
