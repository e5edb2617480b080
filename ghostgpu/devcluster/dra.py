"""GPUs through DRA in the devcluster, with no DRA driver running: NVIDIA's DeviceClasses, and
ResourceSlices for kwok GPU nodes published the way Kubernetes' scheduler_perf publishes them when
no kubelet plugin runs (test/integration/scheduler_perf/dra.go: one slice per node and driver,
`nodeName` set, the pool named after the node, generation 1, resourceSliceCount 1).

The real kube-scheduler allocates claims from these slices and writes `status.allocation` and
`reservedFor`; kube-controller-manager's resourceclaim controller creates a pod's claims from its
ResourceClaimTemplates and deletes them with the pod. No kubelet plugin prepares a device (kwok
pods run no containers), so a claim goes exactly as far as the control plane takes it.

DRA nodes are a node pool of their own (a flavor is one pool whose GPUs come through one path):
they carry `ghostgpu.io/gpu-driver=dra` and no `nvidia.com/gpu` allocatable.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from kubernetes import client

from ghostgpu.devcluster.kube import Kube
from ghostgpu.devcluster.nodes import GpuNodeSpec, Taint, node_manifest

RESOURCE_API = "resource.k8s.io/v1"
GPU_DRIVER = "gpu.nvidia.com"  # NVIDIA's DRA driver serves whole GPUs and MIG devices
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
NIC_DRIVER = NIC_CLASS = "nic.example.com"  # no GPU: what the tracking policy must leave alone
DRA_NODE_LABELS = {"ghostgpu.io/gpu-driver": "dra"}
# The GPU nodes' taint (what the GPU Operator sets); pods and Kueue flavors tolerate it.
DRA_NODE_TAINT = Taint(key="nvidia.com/gpu", value="present", effect="NoSchedule")
H100 = {
    "productName": "NVIDIA H100 80GB HBM3",
    "architecture": "Hopper",
    "cudaComputeCapability": "9.0.0",
    "memory": "80Gi",
}

# The selectors of NVIDIA's chart (dra-driver-nvidia-gpu templates/deviceclass-{gpu,mig}.yaml). The
# chart also sets `extendedResourceName: nvidia.com/gpu` on gpu.nvidia.com; left out here: it would
# let the scheduler serve nvidia.com/gpu requests from DRA devices, and the devcluster's
# device-plugin pools must stay the only ones that do.
_CLASS_SELECTORS = {
    GPU_CLASS: f"device.driver == '{GPU_DRIVER}' && device.attributes['{GPU_DRIVER}'].type == 'gpu'",
    MIG_CLASS: f"device.driver == '{GPU_DRIVER}' && device.attributes['{GPU_DRIVER}'].type == 'mig'",
    NIC_CLASS: f"device.driver == '{NIC_DRIVER}'",
}


def device_classes() -> list[dict[str, Any]]:
    """DeviceClasses gpu.nvidia.com and mig.nvidia.com as NVIDIA's driver installs them, and a NIC class."""
    return [
        {
            "apiVersion": RESOURCE_API,
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": expr}}]},
        }
        for name, expr in _CLASS_SELECTORS.items()
    ]


def gpu_uuid(node: str, index: int) -> str:
    """The UUID of GPU `index` of `node`: the one the fake dcgm-exporter labels its series with."""
    digest = hashlib.sha256(f"{node}/{index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _slice(node: str, driver: str, devices: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


def gpu_slice(node: str, gpus: int, model: dict[str, str] = H100) -> dict[str, Any]:
    """Devices gpu-0..gpu-<gpus-1> with the attributes NVIDIA's kubelet plugin publishes for a
    whole GPU (cmd/gpu-kubelet-plugin/deviceinfo.go) that a selector is likely to name."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": gpu_uuid(node, i)},
                "productName": {"string": model["productName"]},
                "brand": {"string": "Nvidia"},
                "architecture": {"string": model["architecture"]},
                "cudaComputeCapability": {"version": model["cudaComputeCapability"]},
            },
            "capacity": {"memory": {"value": model["memory"]}},
        }
        for i in range(gpus)
    ]
    return _slice(node, GPU_DRIVER, devices)


def nic_slice(node: str, nics: int) -> dict[str, Any]:
    devices = [{"name": f"nic-{i}", "attributes": {"type": {"string": "nic"}}} for i in range(nics)]
    return _slice(node, NIC_DRIVER, devices)


def dra_nodes(count: int = 2, prefix: str = "gpu-h100-dra") -> list[GpuNodeSpec]:
    """kwok nodes of the DRA pool: the pool's label and the GPU taint, no device-plugin GPUs."""
    return [
        GpuNodeSpec(name=f"{prefix}-{i}", gpus=0, labels=dict(DRA_NODE_LABELS), taints=[DRA_NODE_TAINT])
        for i in range(count)
    ]


def resource_api_served(kube: Kube) -> bool:
    """Whether the apiserver serves resource.k8s.io/v1 (Kubernetes 1.34+)."""
    groups = client.ApisApi(kube.api_client).get_api_versions().groups or []
    return any(v.group_version == RESOURCE_API for g in groups for v in g.versions or [])


def install(kube: Kube, nodes: list[GpuNodeSpec], gpus: int = 8, nics: int = 2, timeout: float = 60) -> None:
    """The DeviceClasses, the DRA nodes (kwok) and their GPU and NIC slices; returns once the
    nodes are Ready. Server-side applied: running it again changes nothing."""
    if not resource_api_served(kube):
        raise RuntimeError(f"the apiserver does not serve {RESOURCE_API} (DRA needs Kubernetes 1.34+)")
    for doc in device_classes():
        kube.apply(doc)
    for spec in nodes:
        kube.apply(node_manifest(spec))
        kube.apply(gpu_slice(spec.name, gpus))
        kube.apply(nic_slice(spec.name, nics))
    core = client.CoreV1Api(kube.api_client)
    deadline = time.monotonic() + timeout
    pending = {s.name for s in nodes}
    while pending and time.monotonic() < deadline:
        for name in sorted(pending):
            node = core.read_node(name)
            if any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or []):
                pending.discard(name)
        if pending:
            time.sleep(0.3)
    if pending:
        raise TimeoutError(f"DRA nodes not Ready after {timeout:.0f}s: {sorted(pending)}")


def uninstall(kube: Kube, nodes: list[GpuNodeSpec]) -> None:
    """Remove what `install` made (the nodes' pods go with the nodes: pod garbage collection)."""
    for spec in nodes:
        for driver in (GPU_DRIVER, NIC_DRIVER):
            kube.delete(RESOURCE_API, "ResourceSlice", f"{spec.name}-{driver}")
        kube.delete("v1", "Node", spec.name)
    for doc in device_classes():
        kube.delete(RESOURCE_API, "DeviceClass", doc["metadata"]["name"])
