"""A local GPU test cluster built from the Go module proxy (see hack/testbin): real control plane,
kwok GPU nodes, Kueue, Kyverno, a fake dcgm-exporter and Prometheus. `DevCluster` is the API.

The names below load on first use: `ghostgpu --help` and `ghostgpu render` import this package
through the CLI and must not pay for the kubernetes client (about 0.4 s)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_LAZY = {
    "ClusterState": "cluster",
    "DevCluster": "cluster",
    "down": "cluster",
    "status": "cluster",
    "FakeDcgmClient": "fake_dcgm",
    "ProcessRow": "kwok_exec",
    "ProcessTables": "kwok_exec",
    "GpuNodeSpec": "nodes",
    "Taint": "nodes",
    "default_nodes": "nodes",
}

if TYPE_CHECKING:
    from ghostgpu.devcluster.cluster import ClusterState, DevCluster, down, status
    from ghostgpu.devcluster.fake_dcgm import FakeDcgmClient
    from ghostgpu.devcluster.kwok_exec import ProcessRow, ProcessTables
    from ghostgpu.devcluster.nodes import GpuNodeSpec, Taint, default_nodes


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'ghostgpu.devcluster' has no attribute {name!r}")
    return getattr(importlib.import_module(f"ghostgpu.devcluster.{module}"), name)


__all__ = [
    "ClusterState",
    "DevCluster",
    "FakeDcgmClient",
    "GpuNodeSpec",
    "ProcessRow",
    "ProcessTables",
    "Taint",
    "default_nodes",
    "down",
    "status",
]
