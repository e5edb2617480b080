"""The devcluster's DRA objects (ghostgpu.devcluster.dra): NVIDIA's classes, slices as scheduler_perf
publishes them, a DRA node pool apart from the device-plugin pools. The e2e tests
(tests/e2e/test_dra_devcluster.py) show the real scheduler allocating from them."""

from __future__ import annotations

import re

from ghostgpu.devcluster import dra
from ghostgpu.devcluster.fake_dcgm import GpuSample
from ghostgpu.devcluster.nodes import GPU_RESOURCE, default_nodes, node_manifest


def test_device_classes_select_as_nvidias_chart_does() -> None:
    by_name = {c["metadata"]["name"]: c for c in dra.device_classes()}
    assert set(by_name) == {"gpu.nvidia.com", "mig.nvidia.com", "nic.example.com"}
    exprs = {n: c["spec"]["selectors"][0]["cel"]["expression"] for n, c in by_name.items()}
    assert exprs["gpu.nvidia.com"] == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    )
    assert exprs["mig.nvidia.com"].endswith(".type == 'mig'")
    assert exprs["nic.example.com"] == "device.driver == 'nic.example.com'"
    # No extendedResourceName: DRA devices must not serve the device-plugin pools' nvidia.com/gpu.
    assert all("extendedResourceName" not in c["spec"] for c in by_name.values())


def test_gpu_slice_is_one_pool_per_node() -> None:
    s = dra.gpu_slice("gpu-h100-dra-1", 3)
    spec = s["spec"]
    assert s["metadata"]["name"] == "gpu-h100-dra-1-gpu.nvidia.com"
    assert spec["driver"] == "gpu.nvidia.com" and spec["nodeName"] == "gpu-h100-dra-1"
    assert spec["pool"] == {"name": "gpu-h100-dra-1", "generation": 1, "resourceSliceCount": 1}
    assert [d["name"] for d in spec["devices"]] == ["gpu-0", "gpu-1", "gpu-2"]
    gpu = spec["devices"][1]
    assert gpu["attributes"]["type"] == {"string": "gpu"}
    assert gpu["attributes"]["productName"] == {"string": "NVIDIA H100 80GB HBM3"}
    assert gpu["capacity"] == {"memory": {"value": "80Gi"}}
    uuids = {d["attributes"]["uuid"]["string"] for d in spec["devices"]}
    shape = r"GPU-[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}"
    assert len(uuids) == 3 and all(re.fullmatch(shape, u) for u in uuids)


def test_gpu_uuid_is_the_fake_exporters() -> None:
    labels = GpuSample(namespace="ns", pod="p", node="gpu-h100-dra-0", gpu=5).labels()
    assert f'UUID="{dra.gpu_uuid("gpu-h100-dra-0", 5)}"' in labels
    assert dra.gpu_uuid("gpu-h100-dra-0", 5) != dra.gpu_uuid("gpu-h100-dra-1", 5)


def test_nic_slice_is_another_driver_on_the_same_node() -> None:
    s = dra.nic_slice("n", 2)
    assert s["metadata"]["name"] == "n-nic.example.com" and s["spec"]["driver"] == "nic.example.com"
    assert s["spec"]["pool"]["name"] == "n"
    assert [d["name"] for d in s["spec"]["devices"]] == ["nic-0", "nic-1"]


def test_dra_nodes_are_a_pool_of_their_own() -> None:
    nodes = dra.dra_nodes(2)
    assert [n.name for n in nodes] == ["gpu-h100-dra-0", "gpu-h100-dra-1"]
    default_names = {n.name for n in default_nodes()}
    for n in nodes:
        m = node_manifest(n)
        assert n.name not in default_names
        assert m["metadata"]["labels"]["ghostgpu.io/gpu-driver"] == "dra"
        assert "nvidia.com/gpu.product" not in m["metadata"]["labels"]  # no device-plugin flavor's node
        assert GPU_RESOURCE not in m["status"]["allocatable"]
        assert m["spec"]["taints"] == [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]
