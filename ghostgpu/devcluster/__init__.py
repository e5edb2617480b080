"""A local GPU test cluster built from the Go module proxy (see hack/testbin): real control plane,
kwok GPU nodes, Kueue, Kyverno, a fake dcgm-exporter and Prometheus. `DevCluster` is the API."""

from ghostgpu.devcluster.cluster import ClusterState, DevCluster, down, status
from ghostgpu.devcluster.fake_dcgm import FakeDcgmClient
from ghostgpu.devcluster.kwok_exec import ProcessRow, ProcessTables
from ghostgpu.devcluster.nodes import GpuNodeSpec, Taint, default_nodes

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
