"""DRA GPUs in the signals: the batched query's per-device series, a DRA GPU without a series as a
failed signal (never an idle one), and what the claims cache tells the observe room (a pod's GPU
devices, its GPU containers)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_dra_count import CLASSES, IS_GPU, claim, dra_pod, exactly

from ghostgpu.config import MetricsConfig
from ghostgpu.controller.claims import DraCounter, claim_view
from ghostgpu.controller.inventory import PodView, pod_view
from ghostgpu.signals.dra import DraDevice
from ghostgpu.signals.prometheus import VectorSample
from ghostgpu.signals.utilization import (
    FIELD_LABEL,
    PodKey,
    QuerySpec,
    build_query,
    readings_from_samples,
)
from ghostgpu.verdict import FailureReason, SignalFailure

NOW = 1_760_000_000.0
SPEC = QuerySpec.from_preset(MetricsConfig().dcgm, max_sample_age=60, dra_devices=True)
POD = PodKey("team-a", "x")
GPU0 = DraDevice("gpu.nvidia.com", "node-1", "gpu-0", "x-gpu")
GPU1 = DraDevice("gpu.nvidia.com", "node-1", "gpu-1", "x-gpu")


def series(kind: str, value: float, **labels: str) -> VectorSample:
    return VectorSample(
        {"namespace": POD.namespace, "pod": POD.name, FIELD_LABEL: kind, **labels}, NOW, value
    )


def dev(d: DraDevice, *, container: str = "") -> VectorSample:
    # the query's `group by` keeps the device labels only; `container` shows a duplicate is harmless
    extra = {"container": container} if container else {}
    return series("dev", 1, dra_driver_name=d.driver, dra_pool_name=d.pool, dra_device_name=d.device, **extra)


def reading(samples: list[VectorSample], devices: dict[PodKey, Any], spec: QuerySpec = SPEC) -> Any:
    return readings_from_samples(spec, [POD], NOW, samples, devices=devices)[POD].utilization


# --- the query -----------------------------------------------------------------------------------


def test_with_dra_flavors_the_query_asks_each_idle_pods_dra_devices_by_dcgm_exporters_labels() -> None:
    q = build_query(SPEC, [POD])
    dev = (
        "label_replace(group by (namespace, pod, dra_driver_name, dra_pool_name, dra_device_name) "
        '(DCGM_FI_DEV_GPU_UTIL{job=~"nvidia-dcgm-exporter|dcgm-exporter", namespace=~"team-a", pod=~".+", '
        'dra_device_name!=""}), "ghostgpu_field", "dev", "", "")'
    )
    # only for the pods at or under the zero threshold (with GPU memory, under one filter): a busy
    # DRA fleet adds nothing to the answer
    assert f" or {dev}) and on(namespace, pod) ((max by (namespace, pod) (max_over_time(" in q
    assert q.endswith(")) <= 0)")
    without = build_query(QuerySpec.from_preset(MetricsConfig().dcgm, max_sample_age=60), [POD])
    assert "dra_" not in without
    assert q == without.replace(
        ") and on(namespace, pod) ((max by", f" or {dev}) and on(namespace, pod) ((max by", 1
    )


def test_dra_labels_must_be_prometheus_label_names() -> None:
    with pytest.raises(ValueError, match="dra-device"):
        SPEC.model_validate({**SPEC.model_dump(), "dra_labels": ("a", "b", "dra-device")})


# --- a DRA GPU without a series is a failed signal -------------------------------------------------


def test_an_idle_dra_pod_missing_a_series_of_one_of_its_gpus_is_missing_naming_the_device() -> None:
    got = reading([series("util", 0), dev(GPU0)], {POD: (GPU0, GPU1)})
    assert isinstance(got, SignalFailure) and got.reason is FailureReason.MISSING
    assert "gpu.nvidia.com/node-1/gpu-1" in got.detail and "claim team-a/x-gpu" in got.detail
    nothing = reading([series("util", 0)], {POD: (GPU0, GPU1)})
    assert isinstance(nothing, SignalFailure) and "gpu-0" in nothing.detail and "1 more" in nothing.detail


def test_every_gpu_with_its_series_reads_as_usual_however_many_containers_name_a_device() -> None:
    samples = [series("util", 0), dev(GPU0, container="a"), dev(GPU0, container="b"), dev(GPU1)]
    assert reading(samples, {POD: (GPU0, GPU1)}) == 0.0


def test_a_series_of_another_device_does_not_stand_in_for_a_missing_one() -> None:
    other = DraDevice("gpu.nvidia.com", "node-2", "gpu-1", "x-gpu")  # same device name, other pool
    got = reading([series("util", 0), dev(GPU0), dev(other)], {POD: (GPU0, GPU1)})
    assert isinstance(got, SignalFailure) and "node-1/gpu-1" in got.detail


def test_a_busy_dra_pod_keeps_its_reading_the_missing_gpu_cannot_make_it_idle() -> None:
    assert reading([series("util", 40.0)], {POD: (GPU0, GPU1)}) == 40.0


def test_devices_are_checked_only_when_the_query_asked_for_their_series() -> None:
    plain = SPEC.model_copy(update={"dra_devices": False})
    assert reading([series("util", 0)], {POD: (GPU0,)}, plain) == 0.0
    assert reading([series("util", 0)], {}) == 0.0  # a pod without DRA GPUs: nothing expected


# --- what the claims cache tells the observe room -------------------------------------------------


def counted(pods: list[dict[str, Any]], claims: list[dict[str, Any]]) -> dict[str, PodView]:
    store = {(c.namespace, c.name): c for c in map(claim_view, claims)}
    return {v.name: v for v in DraCounter(CLASSES).pods([pod_view(p, IS_GPU) for p in pods], store)}


def test_every_consumer_of_a_claim_expects_a_series_of_each_of_its_gpu_devices_nic_devices_none() -> None:
    c = claim(
        "shared",
        [("gpu", "gpu-0"), ("nic", "nic-0")],
        [exactly("gpu", "gpu.nvidia.com"), exactly("nic", "nic.example.com")],
        ["u1", "u2"],
    )
    views = counted(
        [dra_pod("a", "u1", shared={"g": "shared"}), dra_pod("b", "u2", shared={"g": "shared"})], [c]
    )
    want = (DraDevice("gpu.nvidia.com", "node-1", "gpu-0", "shared"),)
    # the holder counts the device, the other consumer does not; both use it, so both need its series
    assert views["a"].dra_devices == want and views["b"].dra_devices == want
    assert dict(views["b"].gpu_requests) == {}


def test_a_container_naming_a_gpu_claim_is_a_probe_target_one_naming_only_a_nic_request_is_not() -> None:
    c = claim(
        "x-gpu",
        [("gpu", "gpu-0"), ("nic", "nic-0")],
        [exactly("gpu", "gpu.nvidia.com"), exactly("nic", "nic.example.com")],
        ["u1"],
    )
    pod = dra_pod("x", "u1", templates={"g": "x-gpu"})
    pod["spec"]["containers"] = [
        {"name": "sidecar", "resources": {"claims": [{"name": "g", "request": "nic"}]}},
        {"name": "trainer", "resources": {"claims": [{"name": "g", "request": "gpu"}]}},
        {"name": "all", "resources": {"claims": [{"name": "g"}]}},
        {"name": "plain"},
    ]
    before = pod_view(pod, IS_GPU)
    assert before.probe_containers == ("sidecar",)  # no claims cache: the first container
    view = counted([pod], [c])["x"]
    assert view.gpu_containers == ("trainer", "all") and view.probe_containers == ("trainer", "all")


def test_a_first_available_result_belongs_to_the_request_a_container_names() -> None:
    req = {"name": "gpu", "firstAvailable": [{"name": "small", "deviceClassName": "mig.nvidia.com"}]}
    c = claim("x-gpu", [("gpu/small", "mig-0")], [req], ["u1"])
    pod = dra_pod("x", "u1", templates={"g": "x-gpu"})
    pod["spec"]["containers"] = [{"name": "m", "resources": {"claims": [{"name": "g", "request": "gpu"}]}}]
    assert counted([pod], [c])["x"].gpu_containers == ("m",)


def test_device_plugin_gpu_containers_come_first_then_the_claims_ones() -> None:
    c = claim("x-gpu", [("gpu", "gpu-0")], [exactly("gpu", "gpu.nvidia.com")], ["u1"])
    pod = dra_pod("x", "u1", templates={"g": "x-gpu"}, gpus=1)  # container "a" also asks nvidia.com/gpu
    assert counted([pod], [c])["x"].gpu_containers == ("a", "b")


async def test_the_observe_room_hands_each_dra_pods_gpu_devices_to_the_utilization_query(
    tmp_path: Path,
) -> None:
    from test_controller_reconciler import ScriptedUtilization
    from test_dra_shared_claim import ClaimHarness

    seen: list[object] = []

    class Recording(ScriptedUtilization):
        async def poll(self, pods: Any, *, now: float, devices: object = None, uids: object = None) -> Any:
            seen.append(devices)
            return await super().poll(pods, now=now)

    h = ClaimHarness(tmp_path)
    h.util = Recording()
    h.rec = h.reconciler()
    h.add("dra", util=0.0)
    h.add("plugin", util=0.0)
    pod = h.pods[0]
    pod["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimTemplateName": "t"}]
    pod["status"]["resourceClaimStatuses"] = [{"name": "g", "resourceClaimName": "dra-gpu"}]
    h.claims = [
        claim("dra-gpu", [("gpu", "gpu-3")], [exactly("gpu", "gpu.nvidia.com")], [pod["metadata"]["uid"]])
    ]
    await h.polls(1)
    key = PodKey(pod["metadata"]["namespace"], pod["metadata"]["name"])
    assert seen == [{key: (DraDevice("gpu.nvidia.com", "node-1", "gpu-3", "dra-gpu"),)}]


# --- the query on Prometheus's own PromQL engine (promtool's rule unit tests) ----------------------


def _dcgm_dra(pod: str, container: str, gpu: str, device: str, metric: str = "DCGM_FI_DEV_GPU_UTIL") -> str:
    labels = {
        "gpu": gpu,
        "UUID": f"GPU-{gpu}",
        "Hostname": "node-1",
        "container": container,
        "dra_claim_name": f"{pod}-gpu",
        "dra_claim_namespace": "team-a",
        "dra_device_name": device,
        "dra_driver_name": "gpu.nvidia.com",
        "dra_pool_name": "node-1",
        "namespace": "team-a",
        "pod": pod,
        "job": "dcgm-exporter",  # the scrape the query reads them from (metrics.dcgm.source)
        "instance": "10.0.0.9:9400",
    }
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
def test_promql_counts_a_device_two_containers_name_once_and_asks_no_device_of_a_busy_pod(
    tmp_path: Path,
) -> None:
    q = build_query(SPEC, [PodKey("team-a", "x"), PodKey("team-a", "busy")])
    series = [
        {"series": _dcgm_dra("x", "a", "0", "gpu-0"), "values": "0x10"},
        {"series": _dcgm_dra("x", "b", "0", "gpu-0"), "values": "0x10"},  # the same GPU, 2nd container
        {"series": _dcgm_dra("x", "a", "1", "gpu-1"), "values": "0x10"},
        {"series": _dcgm_dra("busy", "a", "2", "gpu-2"), "values": "50x10"},
        {"series": _dcgm_dra("x", "a", "0", "gpu-0", "DCGM_FI_DEV_FB_USED"), "values": "100x10"},
        {"series": _dcgm_dra("x", "b", "0", "gpu-0", "DCGM_FI_DEV_FB_USED"), "values": "100x10"},
    ]
    dev = {"dra_driver_name": "gpu.nvidia.com", "dra_pool_name": "node-1", "namespace": "team-a", "pod": "x"}

    def sample(value: float, **labels: str) -> dict[str, Any]:
        body = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
        return {"labels": "{" + body + "}", "value": value}

    expected = [
        sample(0, ghostgpu_field="util", namespace="team-a", pod="x"),
        sample(50, ghostgpu_field="util", namespace="team-a", pod="busy"),
        sample(100 * 1048576, ghostgpu_field="fb", namespace="team-a", pod="x"),  # once, not twice
        sample(1, ghostgpu_field="dev", dra_device_name="gpu-0", **dev),  # once, not per container
        sample(1, ghostgpu_field="dev", dra_device_name="gpu-1", **dev),
    ]
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [{"expr": q, "eval_time": "5m", "exp_samples": expected}],
            }
        ],
    }
    path = tmp_path / "query_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False, width=100_000))
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
