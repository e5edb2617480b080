"""Fake GPU nodes for kwok: Node objects with nvidia.com/gpu (and MIG) capacity, the labels and
taints of the config's flavors, and the annotation that tells our kwok instance to manage them."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
GPU_RESOURCE = "nvidia.com/gpu"


class Taint(BaseModel):
    key: str
    value: str = ""
    effect: str = "NoSchedule"


class GpuNodeSpec(BaseModel):
    """One fake node. `extended` holds MIG or other extended resources, e.g.
    {"nvidia.com/mig-1g.10gb": 7}."""

    name: str
    gpus: int = Field(ge=0)
    extended: dict[str, int] = Field(default_factory=dict)
    labels: dict[str, str] = Field(default_factory=dict)
    taints: list[Taint] = Field(default_factory=list)
    cpu: str = "64"
    memory: str = "512Gi"
    pods: int = 110


def default_nodes() -> list[GpuNodeSpec]:
    """Two A100 nodes, one H100 node and one A100 node partitioned into MIG 1g.10gb slices; labels
    follow the NVIDIA GPU operator's (nvidia.com/gpu.product, nvidia.com/mig.config)."""
    gpu_taint = [Taint(key="nvidia.com/gpu", value="present")]
    a100 = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.count": "8"}
    return [
        GpuNodeSpec(name="gpu-a100-0", gpus=8, labels=a100, taints=gpu_taint),
        GpuNodeSpec(name="gpu-a100-1", gpus=8, labels=a100, taints=gpu_taint),
        GpuNodeSpec(
            name="gpu-h100-0",
            gpus=8,
            labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.count": "8"},
            taints=gpu_taint,
        ),
        GpuNodeSpec(
            name="gpu-mig-0",
            gpus=0,
            extended={"nvidia.com/mig-1g.10gb": 14},
            labels={**a100, "nvidia.com/mig.config": "all-1g.10gb"},
            taints=gpu_taint,
        ),
    ]


def node_manifest(spec: GpuNodeSpec) -> dict[str, Any]:
    resources: dict[str, str] = {"cpu": spec.cpu, "memory": spec.memory, "pods": str(spec.pods)}
    if spec.gpus:
        resources[GPU_RESOURCE] = str(spec.gpus)
    resources.update({k: str(v) for k, v in sorted(spec.extended.items())})
    labels = {
        "kubernetes.io/hostname": spec.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "kwok",
        "type": "kwok",
        **spec.labels,
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": labels,
            "annotations": {KWOK_NODE_ANNOTATION: KWOK_NODE_ANNOTATION_VALUE},
        },
        "spec": {"taints": [t.model_dump() for t in spec.taints]},
        # Nodes may carry status on create; kwok's node-initialize stage keeps capacity/allocatable.
        "status": {"capacity": resources, "allocatable": dict(resources)},
    }
