"""Fake GPU nodes for kwok: Node objects with nvidia.com/gpu (and MIG) capacity, the labels and
taints of the config's flavors, and the annotation that tells our kwok instance to manage them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field

from ghostgpu.devcluster.paths import REPO_ROOT

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
KWOK_NODE_ANNOTATION_VALUE = "fake"
GPU_RESOURCE = "nvidia.com/gpu"
EXAMPLE_CONFIG = REPO_ROOT / "examples" / "ghostgpu.yaml"


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


def nodes_for_flavors(flavors: list[dict[str, Any]], per_flavor: int = 2) -> list[GpuNodeSpec]:
    """`per_flavor` nodes for each flavor of a ghostgpu.yaml: its nodeLabels and nodeTaints, and 8
    units of its resource (whole GPUs), or 14 slices for a MIG profile (2 A100s x 7)."""
    out: list[GpuNodeSpec] = []
    for f in flavors:
        try:
            name, resource = str(f["name"]), str(f["resource"])
        except KeyError as e:
            raise ValueError(f"flavor {f!r}: missing key {e.args[0]!r}") from e
        taints = [Taint.model_validate(t) for t in f.get("nodeTaints") or []]
        labels = {str(k): str(v) for k, v in (f.get("nodeLabels") or {}).items()}
        for i in range(per_flavor):
            if resource == GPU_RESOURCE:
                spec = GpuNodeSpec(name=f"gpu-{name}-{i}", gpus=8, labels=labels, taints=taints)
            else:
                spec = GpuNodeSpec(
                    name=f"gpu-{name}-{i}", gpus=0, extended={resource: 14}, labels=labels, taints=taints
                )
            out.append(spec)
    return out


def default_nodes(config: Path = EXAMPLE_CONFIG) -> list[GpuNodeSpec]:
    """Nodes for the flavors of examples/ghostgpu.yaml (the config the rendered bundles come from)."""
    if not config.is_file():
        raise FileNotFoundError(f"{config}: missing; pass the node list explicitly")
    doc = yaml.safe_load(config.read_text()) or {}
    flavors = doc.get("flavors")
    if not isinstance(flavors, list) or not flavors:
        raise ValueError(f"{config}: expected a non-empty `flavors` list")
    # Plus one untainted CPU node, where non-GPU pods (the controller's own Deployment) can run.
    return [*nodes_for_flavors(flavors), GpuNodeSpec(name="cpu-0", gpus=0, cpu="32", memory="128Gi")]


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
