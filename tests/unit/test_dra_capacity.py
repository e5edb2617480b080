"""A DRA flavor's capacity: the devices its DeviceClass selects in the ResourceSlices of its nodes
(slices.py, deviceclass.py), in the accounting gap, the table, the metrics and the RBAC."""

from __future__ import annotations

from typing import Any

import pytest
from test_config import MINIMAL
from test_dra_count import DRA_FILE, FLAVORS, IS_GPU, controller_read_rules, counted, dra_pod, exactly, node

from ghostgpu.controller.app import DEVICECLASSES, RESOURCESLICES, Informers, _slim_node
from ghostgpu.controller.books.accounting import account
from ghostgpu.controller.deviceclass import (
    ClassView,
    Unsupported,
    attributes_of,
    class_selector,
    class_view,
    parse_expression,
)
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.slices import Capacity, DraCapacity, dra_capacity, slice_view

# NVIDIA's DRA driver (kubernetes-sigs/dra-driver-nvidia-gpu, deployments/helm/.../templates/
# deviceclass-{gpu,mig,vfio-gpu}.yaml), as the chart renders them.
NVIDIA_GPU = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
NVIDIA_MIG = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"


def device_class(name: str, *expressions: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]},
    }


CLASSES = {
    c.name: c
    for c in map(
        class_view,
        [
            {**device_class("gpu.nvidia.com", NVIDIA_GPU), "spec": {
                "selectors": [{"cel": {"expression": NVIDIA_GPU}}],
                "extendedResourceName": "nvidia.com/gpu",
            }},
            device_class("mig.nvidia.com", NVIDIA_MIG),
        ],
    )
}  # fmt: skip


def gpu(name: str, **extra: Any) -> dict[str, Any]:
    """A full GPU as the driver publishes it (cmd/gpu-kubelet-plugin/deviceinfo.go): unqualified
    attributes, in the driver's domain."""
    return {
        "name": name,
        "attributes": {
            "type": {"string": "gpu"},
            "uuid": {"string": f"GPU-{name}"},
            "productName": {"string": "NVIDIA H100 80GB HBM3"},
            "cudaComputeCapability": {"version": "9.0.0"},
            "resource.kubernetes.io/pcieRoot": {"string": "pci0000:00"},
        },
        "capacity": {"memory": {"value": "80Gi"}},
        **extra,
    }


def mig(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"type": {"string": "mig"}, "profile": {"string": "1g.10gb"}},
        "capacity": {"memory": {"value": "10Gi"}, "multiprocessors": {"value": "16"}},
    }


def resource_slice(
    node_name: str | None,
    devices: list[dict[str, Any]],
    *,
    driver: str = "gpu.nvidia.com",
    pool: str | None = None,
    generation: int = 1,
    count: int = 1,
    name: str | None = None,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "driver": driver,
        "pool": {
            "name": pool or node_name or "shared",
            "generation": generation,
            "resourceSliceCount": count,
        },
        "devices": devices,
        **spec,
    }
    if node_name is not None:
        body["nodeName"] = node_name
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": name or f"{node_name}-{driver}-{generation}"},
        "spec": body,
    }


NODES = [
    node("plugin-0", "plugin", {"nvidia.com/gpu": "8"}),
    node("node-1", "dra", {}),
    node("node-2", "dra", {}),
    node("cpu-0", "cpu", {}),
]
DRA_GPU, DRA_MIG = FLAVORS[1], FLAVORS[2]


def capacity(slices: list[dict[str, Any]], classes: dict[str, ClassView] = CLASSES) -> dict[str, Capacity]:
    return dra_capacity(FLAVORS, NODES, [slice_view(s) for s in slices], classes)


def devices(slices: list[dict[str, Any]], classes: dict[str, ClassView] = CLASSES) -> dict[str, float | None]:
    return {k: v.devices for k, v in capacity(slices, classes).items()}


# --- the selector subset -------------------------------------------------------------------------


def test_nvidias_device_classes_are_understood() -> None:
    gpu_sel = class_selector(device_class("gpu.nvidia.com", NVIDIA_GPU))
    assert gpu_sel.driver == "gpu.nvidia.com"
    attrs = slice_view(resource_slice("n", [gpu("gpu-0"), mig("mig-0")])).devices
    assert [gpu_sel.matches("gpu.nvidia.com", d.attributes) for d in attrs] == [True, False]
    assert gpu_sel.matches("nic.example.com", attrs[0].attributes) is False
    mig_sel = class_selector(device_class("mig.nvidia.com", NVIDIA_MIG))
    assert [mig_sel.matches("gpu.nvidia.com", d.attributes) for d in attrs] == [False, True]


@pytest.mark.parametrize(
    "expr",
    [
        'device.driver == "gpu.nvidia.com"',
        "'gpu.nvidia.com' == device.driver",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com']['type'] == 'gpu'",
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type != 'mig'",
    ],
)
def test_other_spellings_of_the_same_tests_are_understood(expr: str) -> None:
    sel = class_selector(device_class("c", expr))
    (full, part) = slice_view(resource_slice("n", [gpu("gpu-0"), mig("mig-0")])).devices
    assert sel.matches("gpu.nvidia.com", full.attributes) is True
    assert sel.matches("other.example.com", full.attributes) is False
    assert sel.matches("gpu.nvidia.com", part.attributes) is ("type" not in expr)


@pytest.mark.parametrize(
    "expr",
    [
        "device.driver == 'a' || device.driver == 'b'",
        "(device.driver == 'gpu.nvidia.com')",
        "device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) >= 0",
        "device.attributes['gpu.nvidia.com'].productName.startsWith('NVIDIA')",
        "device.driver == 'gpu.nvidia.com' &&",
        "device.driver == 1",
        "device.driver == 'a\\'b'",
        "has(device.attributes['gpu.nvidia.com'].type)",
        "",
    ],
)
def test_anything_else_is_not_understood(expr: str) -> None:
    with pytest.raises(Unsupported):
        parse_expression(expr)
    view = class_view(device_class("gpu.nvidia.com", NVIDIA_GPU, expr))
    assert view.selector is None and "selectors[1]" in view.error


def test_a_missing_attribute_or_an_undecidable_comparison_is_unknown_but_a_false_side_wins() -> None:
    sel = class_selector(device_class("c", NVIDIA_GPU))
    untyped = attributes_of({"uuid": {"string": "GPU-1"}})
    assert sel.matches("gpu.nvidia.com", untyped) is None  # CEL: no such key
    assert sel.matches("other.example.com", untyped) is False  # false && error is false
    version = class_selector(
        device_class("c", "device.attributes['gpu.nvidia.com'].driverVersion == '550.1.0'")
    )
    assert version.matches("gpu.nvidia.com", attributes_of({"driverVersion": {"version": "550.1.0"}})) is None
    typed = class_selector(device_class("c", "device.attributes['example.com'].count == 2"))
    assert typed.matches("x", attributes_of({"example.com/count": {"int": 2}})) is True
    assert typed.matches("x", attributes_of({"example.com/count": {"string": "2"}})) is None
    flag = class_selector(device_class("c", "device.attributes['example.com'].on == true"))
    assert flag.matches("x", attributes_of({"example.com/on": {"bool": True}})) is True
    assert flag.matches("x", attributes_of({"example.com/on": {"int": 1}})) is None
    # an unqualified attribute is in the driver's domain only
    assert typed.matches("example.com", attributes_of({"count": {"int": 2}})) is True
    assert typed.matches("other.example.com", attributes_of({"count": {"int": 2}})) is None
    # not exactly one value (the API refuses that) or a list value: nothing is told
    assert typed.matches("x", attributes_of({"example.com/count": {"int": 2, "string": "2"}})) is None
    assert typed.matches("x", attributes_of({"example.com/count": {"ints": [2]}})) is None


def test_devices_of_one_model_share_their_attributes_in_the_cache() -> None:
    a, b = slice_view(resource_slice("node-1", [gpu("gpu-0"), gpu("gpu-1")])).devices
    same = [x for x, y in zip(a.attributes, b.attributes, strict=True) if x is y]
    assert [x.name for x in same] == [
        "cudaComputeCapability",
        "productName",
        "resource.kubernetes.io/pcieRoot",
        "type",
    ]
    assert [x.name for x in a.attributes] == sorted(x.name for x in a.attributes)


def test_selectors_are_tried_in_order_the_first_false_or_error_deciding() -> None:
    first_false = class_selector(
        device_class("c", "device.driver == 'x'", "device.attributes['x'].type == 'gpu'")
    )
    assert first_false.matches("y", ()) is False
    first_error = class_selector(
        device_class("c", "device.attributes['x'].type == 'gpu'", "device.driver == 'x'")
    )
    assert first_error.matches("y", ()) is None
    assert class_selector(device_class("c")).matches("any.driver", ()) is True  # no selector: all


# --- counting ------------------------------------------------------------------------------------


def test_each_flavor_counts_the_devices_its_class_selects_on_its_nodes() -> None:
    slices = [
        resource_slice("node-1", [gpu("gpu-0"), gpu("gpu-1"), mig("gpu-2-mig-0"), mig("gpu-2-mig-1")]),
        resource_slice("node-2", [gpu("gpu-0"), gpu("gpu-1")]),
        resource_slice(
            "node-1", [{"name": "nic-0", "attributes": {"type": {"string": "gpu"}}}], driver="nic.example.com"
        ),
        resource_slice("cpu-0", [gpu("gpu-0")]),  # not a node of the flavor
        resource_slice("gone-node", [gpu("gpu-0")]),  # a node that is no longer there
    ]
    assert devices(slices) == {"h100-dra": 4.0, "mig-dra": 2.0}


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    slices = [
        resource_slice("node-1", [gpu(f"gpu-{i}") for i in range(8)], generation=1),
        resource_slice("node-1", [gpu("gpu-0"), gpu("gpu-1")], generation=2),
    ]
    assert devices(slices)["h100-dra"] == 2.0


def test_an_incomplete_pool_of_the_classs_driver_makes_the_capacity_unknown() -> None:
    half = [resource_slice("node-1", [gpu("gpu-0")], count=2, name="a")]
    got = capacity(half)
    assert got["h100-dra"].devices is None and "incomplete" in got["h100-dra"].why
    whole = [*half, resource_slice("node-1", [gpu("gpu-1")], count=2, name="b")]
    assert devices(whole)["h100-dra"] == 2.0
    # a pool of another driver does not matter to a class that names its driver
    nic = [*whole, resource_slice("node-1", [], driver="nic.example.com", count=3)]
    assert devices(nic)["h100-dra"] == 2.0


def test_devices_not_published_for_one_node_make_the_capacity_unknown_only_when_selected() -> None:
    shared = resource_slice(None, [gpu("gpu-net-0")], allNodes=True)
    assert devices([resource_slice("node-1", [gpu("gpu-0")]), shared])["h100-dra"] is None
    nic = resource_slice(None, [{"name": "nic-0", "attributes": {}}], driver="nic.example.com", allNodes=True)
    assert devices([resource_slice("node-1", [gpu("gpu-0")]), nic])["h100-dra"] == 1.0
    per_device = resource_slice(
        None,
        [{**gpu("gpu-0"), "nodeName": "node-1"}, {**gpu("gpu-1"), "nodeName": "cpu-0"}],
        pool="per-device",
        perDeviceNodeSelection=True,
    )
    assert devices([per_device])["h100-dra"] == 1.0


def test_partitionable_and_multi_allocation_devices_make_the_capacity_unknown() -> None:
    counters = gpu(
        "gpu-0", consumesCounters=[{"counterSet": "gpu-0", "counters": {"memory": {"value": "80Gi"}}}]
    )
    got = capacity([resource_slice("node-1", [counters])])
    assert got["h100-dra"].devices is None and "counters" in got["h100-dra"].why
    shared = gpu("gpu-0", allowMultipleAllocations=True)
    assert devices([resource_slice("node-1", [shared])])["h100-dra"] is None
    assert devices([resource_slice("node-1", [counters])])["mig-dra"] == 0.0  # not a MIG device


def test_a_device_tainted_noschedule_is_not_capacity_like_an_unhealthy_device_plugin_gpu() -> None:
    def taint(effect: str) -> list[dict[str, Any]]:
        return [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": effect}]

    tainted = [gpu("gpu-0", taints=taint("NoSchedule")), gpu("gpu-1", taints=taint("None")), gpu("gpu-2")]
    assert devices([resource_slice("node-1", tainted)])["h100-dra"] == 2.0


def test_a_missing_or_unreadable_device_class_makes_the_capacity_unknown() -> None:
    slices = [resource_slice("node-1", [gpu("gpu-0")])]
    got = capacity(slices, {"mig.nvidia.com": CLASSES["mig.nvidia.com"]})
    assert got["h100-dra"] == Capacity(None, "no DeviceClass gpu.nvidia.com")
    odd = class_view(device_class("gpu.nvidia.com", "device.attributes['gpu.nvidia.com'].type in ['gpu']"))
    got = capacity(slices, {**CLASSES, "gpu.nvidia.com": odd})
    assert got["h100-dra"].devices is None and "gpu.nvidia.com" in got["h100-dra"].why
    # a device of the flavor's nodes the class cannot be evaluated on
    untyped = resource_slice("node-1", [{"name": "gpu-9", "attributes": {}}])
    assert devices([untyped])["h100-dra"] is None


def test_a_slices_tally_is_kept_while_the_slice_and_the_class_are_the_same_objects(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from ghostgpu.controller import slices as slices_module

    calls: list[str] = []
    real = slices_module.tally

    def counting(cls: Any, s: Any) -> Any:
        calls.append(f"{cls.name}:{s.name}")
        return real(cls, s)

    monkeypatch.setattr(slices_module, "tally", counting)
    count = DraCapacity()
    views = [slice_view(resource_slice("node-1", [gpu("gpu-0"), mig("mig-0")]))]
    assert count(FLAVORS, NODES, views, CLASSES)["h100-dra"] == Capacity(1.0)
    assert len(calls) == 2  # one slice, two classes
    assert count(FLAVORS, NODES, views, CLASSES)["mig-dra"] == Capacity(1.0)
    assert len(calls) == 2
    # the slice changed (a watch event): counted again, and the new devices count
    views = [slice_view(resource_slice("node-1", [gpu("gpu-0"), gpu("gpu-1")], generation=2))]
    assert count(FLAVORS, NODES, views, CLASSES)["h100-dra"] == Capacity(2.0)
    assert len(calls) == 4
    # the class changed: its slices are counted again under it
    classes = {
        **CLASSES,
        "gpu.nvidia.com": class_view(device_class("gpu.nvidia.com", NVIDIA_GPU.replace("'gpu'", "'vfio'"))),
    }
    assert count(FLAVORS, NODES, views, classes)["h100-dra"] == Capacity(0.0)
    assert len(calls) == 5


def test_without_dra_flavors_nothing_is_counted() -> None:
    assert (
        dra_capacity([FLAVORS[0]], NODES, [slice_view(resource_slice("node-1", [gpu("g")]))], CLASSES) == {}
    )


# --- where the capacity goes ---------------------------------------------------------------------


def test_the_dra_flavors_gap_and_truly_free_are_computed_like_a_device_plugin_flavors() -> None:
    claims = [
        {
            "metadata": {"namespace": "team-a", "name": "x-gpu", "uid": "c1"},
            "spec": {"devices": {"requests": [exactly("gpu", "gpu.nvidia.com", 3)]}},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "gpu",
                                "driver": "gpu.nvidia.com",
                                "pool": "node-1",
                                "device": f"gpu-{i}",
                            }
                            for i in range(3)
                        ]
                    }
                },
                "reservedFor": [{"resource": "pods", "name": "x", "uid": "u1"}],
            },
        }
    ]
    views = counted([dra_pod("x", "u1", templates={"gpu": "x-gpu"})], claims)
    cq = {
        "metadata": {"name": "research"},
        "spec": {
            "resourceGroups": [
                {
                    "flavors": [
                        {"name": "h100-dra", "resources": [{"name": "gpu.nvidia.com", "nominalQuota": 8}]}
                    ]
                }
            ]
        },
        "status": {
            "flavorsUsage": [{"name": "h100-dra", "resources": [{"name": "gpu.nvidia.com", "total": "2"}]}]
        },
    }
    cap = capacity([resource_slice("node-1", [gpu(f"gpu-{i}") for i in range(4)])])
    buckets = {("team-a", "x"): "FINISHED_IDLE"}
    _, dra, mig = account(FLAVORS, NODES, views.values(), [cq], buckets, cap)
    # 4 devices, 3 held outside Kueue: 1 truly free; Kueue admitted 2 of 8 and believes 6 free
    assert (dra.allocatable, dra.in_use, dra.truly_free, dra.kueue_believes_free, dra.gap) == (4, 3, 1, 6, 5)
    d = dra.as_dict()
    assert (d["allocatable"], d["trulyFree"], d["gap"], d["capacityUnknown"]) == (4, 1, 5, None)
    assert mig.as_dict()["allocatable"] == 0 and mig.free_known
    # a pod on its nodes whose claims are not known yet may hold some of them: free unknown
    unseen = counted([dra_pod("y", "u2", templates={"gpu": "not-yet"})], [])
    _, dra, _ = account(FLAVORS, NODES, [*views.values(), *unseen.values()], [cq], buckets, cap)
    d = dra.as_dict()
    assert d["allocatable"] == 4 and d["trulyFree"] is None and d["gap"] is None
    # capacity not given: unknown, with why
    _, dra, _ = account(FLAVORS, NODES, views.values(), [cq], buckets)
    assert dra.as_dict()["allocatable"] is None and dra.as_dict()["capacityUnknown"]


def test_metrics_export_a_known_dra_capacity_and_drop_it_when_it_becomes_unknown() -> None:
    m = ControllerMetrics()
    cap = capacity([resource_slice("node-1", [gpu("gpu-0"), gpu("gpu-1")])])
    m.set_accounting(account(FLAVORS, NODES, [], [], {}, cap))

    def sample(kind: str) -> float | None:
        return m.registry.get_sample_value("ghostgpu_flavor_gpus", {"flavor": "h100-dra", "kind": kind})

    assert (sample("allocatable"), sample("truly_free")) == (2.0, 2.0)
    m.set_accounting(account(FLAVORS, NODES, [], [], {}, {"h100-dra": Capacity(None, "x")}))
    assert sample("allocatable") is None and sample("truly_free") is None
    assert sample("kueue_nominal") == 0.0


def test_resource_slices_and_device_classes_are_read_only_with_dra_flavors() -> None:
    rule = {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceslices", "deviceclasses"],
        "verbs": ["list", "watch"],
    }
    assert rule in controller_read_rules(DRA_FILE)
    assert not any("resource.k8s.io" in r["apiGroups"] for r in controller_read_rules(MINIMAL))
    # the code that needs it: the slices and classes reflectors (list + watch), `ghostgpu status` (list)
    assert (RESOURCESLICES.version, RESOURCESLICES.plural, RESOURCESLICES.namespaced) == (
        "resource.k8s.io/v1",
        "resourceslices",
        False,
    )
    assert (DEVICECLASSES.plural, DEVICECLASSES.namespaced) == ("deviceclasses", False)
    informers = Informers(object(), IS_GPU, gpu_classes=["gpu.nvidia.com"])
    assert informers.slices is not None and informers.classes is not None
    assert {informers.slices, informers.classes} <= set(informers.all)
    plain = Informers(object(), IS_GPU)
    assert plain.slices is None and plain.classes is None


def test_the_informers_snapshot_carries_each_dra_flavors_capacity() -> None:
    informers = Informers(object(), IS_GPU, gpu_classes=["gpu.nvidia.com", "mig.nvidia.com"])
    assert informers.slices is not None and informers.classes is not None
    for n in NODES:
        informers.nodes.store[("", n["metadata"]["name"])] = _slim_node(n)
    s = resource_slice("node-1", [gpu("gpu-0"), mig("mig-0"), mig("mig-1")])
    informers.slices.store[("", s["metadata"]["name"])] = slice_view(s)
    for c in CLASSES.values():
        informers.classes.store[("", c.name)] = c
    snap = informers.snapshot(FLAVORS)
    assert snap.dra_capacity == {"h100-dra": Capacity(1.0), "mig-dra": Capacity(2.0)}


async def test_ghostgpu_status_lists_the_slices_and_classes_and_says_why_when_it_cannot() -> None:
    from ghostgpu.controller.ops import _dra_capacity

    class Cluster:
        def __init__(self, fail: bool) -> None:
            self.fail = fail
            self.listed: list[str] = []

        async def list(self, rt: Any) -> list[dict[str, Any]]:
            self.listed.append(rt.plural)
            if self.fail:
                raise RuntimeError("403 Forbidden")
            if rt is RESOURCESLICES:
                return [resource_slice("node-1", [gpu("gpu-0"), mig("mig-0")])]
            assert rt is DEVICECLASSES
            return [device_class("gpu.nvidia.com", NVIDIA_GPU), device_class("mig.nvidia.com", NVIDIA_MIG)]

    ok = Cluster(fail=False)
    assert await _dra_capacity(ok, FLAVORS, NODES) == {"h100-dra": Capacity(1.0), "mig-dra": Capacity(1.0)}  # type: ignore[arg-type]
    assert ok.listed == ["resourceslices", "deviceclasses"]
    got = await _dra_capacity(Cluster(fail=True), FLAVORS, NODES)  # type: ignore[arg-type]
    assert set(got) == {"h100-dra", "mig-dra"}
    assert got["h100-dra"].devices is None and "403 Forbidden" in got["h100-dra"].why
