"""The devcluster's fake dcgm-exporter prints a DRA GPU's series as dcgm-exporter does with
`--kubernetes-enable-dra`: its pod labels plus the dra_* labels, in dcgm-exporter's order."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from ghostgpu.devcluster.fake_dcgm import DraLabels, FakeDcgmClient, GpuSample, Store, make_server

UUID = 'UUID="GPU-'


def util_lines(store: Store) -> list[str]:
    return [line for line in store.exposition().splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]


def test_a_dra_gpus_series_carries_dcgm_exporters_dra_labels_in_its_order() -> None:
    store = Store()
    dra = DraLabels(claim="x-gpu-7k2", pool="node-1", device="gpu-1")
    store.set(GpuSample(namespace="team-a", pod="x", gpu=1, dra=dra, values={"DCGM_FI_DEV_GPU_UTIL": 0}))
    (line,) = util_lines(store)
    labels = line[line.index("{") + 1 : line.rindex("}")]
    names = [pair.split("=", 1)[0] for pair in labels.split('",')]
    assert names == [
        "gpu", "UUID", "device", "modelName", "Hostname", "container",
        "dra_claim_name", "dra_claim_namespace", "dra_device_name", "dra_driver_name", "dra_pool_name",
        "namespace", "pod",
    ]  # fmt: skip
    assert line.endswith(
        'container="main",dra_claim_name="x-gpu-7k2",dra_claim_namespace="team-a",'
        'dra_device_name="gpu-1",dra_driver_name="gpu.nvidia.com",dra_pool_name="node-1",'
        'namespace="team-a",pod="x"} 0'
    )


def test_a_mig_device_adds_its_profile_and_uuid_and_needs_both() -> None:
    store = Store()
    dra = DraLabels(
        claim="m", pool="node-1", device="gpu-0-mig-1g10gb-0", mig_profile="1g.10gb", mig_device_uuid="MIG-1"
    )
    store.set(GpuSample(namespace="team-a", pod="x", dra=dra, values={"DCGM_FI_DEV_GPU_UTIL": 3}))
    (line,) = util_lines(store)
    assert (
        'dra_driver_name="gpu.nvidia.com",dra_mig_device_uuid="MIG-1",dra_mig_profile="1g.10gb",'
        'dra_pool_name="node-1",namespace="team-a"'
    ) in line
    with pytest.raises(ValidationError, match="mig_profile and mig_device_uuid together"):
        DraLabels(claim="m", pool="p", device="d", mig_profile="1g.10gb")


def test_a_device_plugin_gpus_series_is_unchanged() -> None:
    store = Store()
    store.set(GpuSample(namespace="team-a", pod="x", values={"DCGM_FI_DEV_GPU_UTIL": 5}))
    (line,) = util_lines(store)
    assert "dra_" not in line and line.endswith('container="main",namespace="team-a",pod="x"} 5')


def test_two_containers_naming_one_device_are_two_series_and_values_only_updates_keep_the_labels() -> None:
    store = Store()
    dra = DraLabels(claim="c", claim_namespace="shared-ns", pool="node-1", device="gpu-0")
    for c in ("a", "b"):
        store.set(
            GpuSample(namespace="team-a", pod="x", container=c, dra=dra, values={"DCGM_FI_DEV_GPU_UTIL": 0})
        )
    store.set(GpuSample(namespace="team-a", pod="x", container="a", values={"DCGM_FI_DEV_GPU_UTIL": 9}))
    lines = util_lines(store)
    assert len(lines) == 2 and all('dra_claim_namespace="shared-ns"' in line for line in lines)
    assert lines[0].startswith("DCGM_FI_DEV_GPU_UTIL{") and lines[0].endswith(" 9")


@pytest.fixture
def client() -> Iterator[FakeDcgmClient]:
    server = make_server(0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield FakeDcgmClient(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()


def test_the_client_sets_a_dra_gpu_over_http(client: FakeDcgmClient) -> None:
    client.set("team-a", "x", util=0.0, gpu=2, dra=DraLabels(claim="x-gpu", pool="node-1", device="gpu-2"))
    text = client.metrics()
    assert 'dra_device_name="gpu-2"' in text and 'gpu="2"' in text
    assert text.count('dra_claim_name="x-gpu"') == 2  # utilization and the framebuffer's default 0
