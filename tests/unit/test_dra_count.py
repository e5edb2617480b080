"""The controller counts DRA GPUs: the devices allocated to a pod's ResourceClaims (claims.py), per
flavor, in the accounting gap, the reservation placeholders and the RBAC (only with DRA flavors)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from test_config import MINIMAL

from ghostgpu.config import load_config_text
from ghostgpu.controller.app import dra_flavor_specs, load_any_config
from ghostgpu.controller.books.accounting import FlavorSpec, account
from ghostgpu.controller.books.reservation import desired_reservations, placeholder_object
from ghostgpu.controller.claims import DraCounter, claim_view, dra_gpus, pod_claim_names
from ghostgpu.controller.inventory import PodView, WorkloadRef, gpu_predicate, pod_view, workload_from
from ghostgpu.render import render_bundles

IS_GPU = gpu_predicate(["nvidia.com/gpu"])
CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")
PLUGIN = FlavorSpec("h100", "nvidia.com/gpu", {"pool": "plugin"})
DRA_GPU = FlavorSpec("h100-dra", "gpu.nvidia.com", {"pool": "dra"}, "gpu.nvidia.com")
DRA_MIG = FlavorSpec("mig-dra", "mig.nvidia.com", {"pool": "dra"}, "mig.nvidia.com")
FLAVORS = [PLUGIN, DRA_GPU, DRA_MIG]

DRA_FILE = """\
flavors:
  - name: h100
    resource: nvidia.com/gpu
  - name: h100-dra
    deviceClass: gpu.nvidia.com
    nodeLabels: {pool: dra}
teams:
  - name: research
    quota: {h100: 4, h100-dra: 8}
"""


def claim(
    name: str,
    devices: list[tuple[str, str]],  # (request, device)
    requests: list[dict[str, Any]],
    consumers: list[str],
    *,
    ns: str = "team-a",
    allocated: bool = True,
) -> dict[str, Any]:
    status: dict[str, Any] = {
        "reservedFor": [{"resource": "pods", "name": f"p-{u}", "uid": u} for u in consumers]
    }
    if allocated:
        status["allocation"] = {
            "devices": {
                "results": [
                    {"request": r, "driver": "gpu.nvidia.com", "pool": "node-1", "device": d}
                    for r, d in devices
                ]
            }
        }
    return {
        "metadata": {"namespace": ns, "name": name, "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": requests}},
        "status": status,
    }


def exactly(name: str, cls: str, count: int = 1) -> dict[str, Any]:
    return {"name": name, "exactly": {"deviceClassName": cls, "count": count}}


def dra_pod(
    name: str,
    uid: str,
    *,
    templates: dict[str, str | None] | None = None,  # claim entry -> generated claim (None: not yet)
    shared: dict[str, str] | None = None,  # claim entry -> ResourceClaim name
    node: str | None = "node-1",
    gpus: int = 0,
) -> dict[str, Any]:
    claims = [{"name": k, "resourceClaimTemplateName": f"tpl-{k}"} for k in templates or {}]
    claims += [{"name": k, "resourceClaimName": v} for k, v in (shared or {}).items()]
    statuses = [{"name": k, "resourceClaimName": v} for k, v in (templates or {}).items() if v]
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    return {
        "metadata": {"namespace": "team-a", "name": name, "uid": uid},
        "spec": {
            "nodeName": node,
            "resourceClaims": claims,
            "containers": [
                {
                    "name": "a",
                    "resources": {"limits": limits, "claims": [{"name": k} for k in templates or {}]},
                },
                {"name": "b", "resources": {"claims": [{"name": k} for k in templates or {}]}},
            ],
        },
        "status": {"phase": "Running", "resourceClaimStatuses": statuses},
    }


def counted(pods: list[dict[str, Any]], claims: list[dict[str, Any]]) -> dict[str, PodView]:
    store = {(c.namespace, c.name): c for c in map(claim_view, claims)}
    views = DraCounter(CLASSES).pods([pod_view(p, IS_GPU) for p in pods], store)
    return {v.name: v for v in views}


def node(name: str, pool: str, alloc: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"pool": pool}}, "status": {"allocatable": alloc}}


# --- a pod's claims and its DRA GPUs -------------------------------------------------------------


def test_a_template_claim_is_named_by_the_pods_status_and_a_shared_one_by_its_spec() -> None:
    p = dra_pod("x", "u1", templates={"gpu": "x-gpu-abc", "later": None}, shared={"s": "shared-1"})
    assert pod_claim_names(p["spec"], p["status"]) == ("x-gpu-abc", "", "shared-1")
    no_claim_needed = {"resourceClaimStatuses": [{"name": "gpu"}]}
    assert (
        pod_claim_names(
            {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}, no_claim_needed
        )
        == ()
    )
    assert pod_view(dra_pod("y", "u2"), IS_GPU).claims == ()


def test_gpu_devices_count_per_class_nic_devices_do_not_and_a_device_counts_once() -> None:
    c = claim(
        "x-gpu",
        [("gpu", "gpu-0"), ("gpu", "gpu-1"), ("nic", "nic-0"), ("mig", "mig-1g-0")],
        [
            exactly("gpu", "gpu.nvidia.com", 2),
            exactly("nic", "nic.example.com"),
            exactly("mig", "mig.nvidia.com"),
        ],
        ["u1"],
    )
    views = counted([dra_pod("x", "u1", templates={"gpu": "x-gpu"})], [c])
    # two containers use the claim: its devices count once; MIG under its own class
    assert dict(views["x"].gpu_requests) == {"gpu.nvidia.com": 2.0, "mig.nvidia.com": 1.0}
    assert views["x"].holds_gpus and not views["x"].gpus_unknown


def test_a_first_available_subrequest_is_counted_under_its_own_class() -> None:
    req = {
        "name": "gpu",
        "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu.nvidia.com"},
            {"name": "small", "deviceClassName": "mig.nvidia.com"},
        ],
    }
    c = claim("x-gpu", [("gpu/small", "mig-0")], [req], ["u1"])
    assert c["status"]["allocation"]
    views = counted([dra_pod("x", "u1", templates={"gpu": "x-gpu"})], [c])
    assert dict(views["x"].gpu_requests) == {"mig.nvidia.com": 1.0}


def test_a_shared_claim_counts_once_on_the_consumer_whose_uid_sorts_first() -> None:
    c = claim("shared", [("gpu", "gpu-0")], [exactly("gpu", "gpu.nvidia.com")], ["u2", "u1"])
    views = counted(
        [dra_pod("a", "u2", shared={"g": "shared"}), dra_pod("b", "u1", shared={"g": "shared"})], [c]
    )
    assert dict(views["b"].gpu_requests) == {"gpu.nvidia.com": 1.0}
    assert dict(views["a"].gpu_requests) == {} and not views["a"].gpus_unknown
    (acc,) = [
        a
        for a in account(FLAVORS, [node("node-1", "dra", {})], views.values(), [], {})
        if a.dra and a.flavor == "h100-dra"
    ]
    assert acc.in_use == 1


def test_an_unallocated_claim_counts_zero_and_a_claim_not_seen_is_unknown() -> None:
    c = claim("x-gpu", [], [exactly("gpu", "gpu.nvidia.com")], [], allocated=False)
    views = counted(
        [
            dra_pod("pending", "u1", templates={"gpu": "x-gpu"}, node=None),
            dra_pod("unseen", "u2", templates={"gpu": "not-in-cache"}),
            dra_pod("ungenerated", "u3", templates={"gpu": None}),
            dra_pod("ungenerated-pending", "u4", templates={"gpu": None}, node=None),
        ],
        [c],
    )
    assert dict(views["pending"].gpu_requests) == {} and not views["pending"].gpus_unknown
    assert views["unseen"].gpus_unknown and views["ungenerated"].gpus_unknown
    assert not views["ungenerated-pending"].gpus_unknown  # nothing is allocated before scheduling
    (acc,) = [
        a
        for a in account(FLAVORS, [node("node-1", "dra", {})], views.values(), [], {})
        if a.flavor == "h100-dra"
    ]
    assert acc.gpus_unknown_pods == 2
    d = acc.as_dict()
    assert d["trulyFree"] is None and d["gap"] is None and d["allocatable"] is None  # never "free"


def test_a_finished_pod_whose_generated_claim_was_deleted_is_not_unknown() -> None:
    """Kubernetes deletes a finished pod's generated claims while the pod stays (a completed Job's
    pod): before this, one such pod left its flavor's gap unknown and the reservation waiting for
    good (seen in the devcluster, tests/e2e/test_dra_devcluster.py)."""
    done = dra_pod("done", "u1", templates={"gpu": "deleted"})
    failed = dra_pod("failed", "u2", templates={"gpu": "deleted-too"})
    done["status"]["phase"], failed["status"]["phase"] = "Succeeded", "Failed"
    views = counted([done, failed, dra_pod("running", "u3", templates={"gpu": "deleted-as-well"})], [])
    assert not views["done"].gpus_unknown and dict(views["done"].gpu_requests) == {}
    assert not views["failed"].gpus_unknown
    assert views["running"].gpus_unknown  # a running pod's missing claim stays unknown
    (acc,) = [
        a
        for a in account(FLAVORS, [node("node-1", "dra", {})], views.values(), [], {})
        if a.flavor == "h100-dra"
    ]
    assert acc.gpus_unknown_pods == 1


def test_an_unchanged_dra_pod_is_the_same_object_every_poll() -> None:
    c = claim_view(claim("x-gpu", [("gpu", "gpu-0")], [exactly("gpu", "gpu.nvidia.com")], ["u1"]))
    view = pod_view(dra_pod("x", "u1", templates={"gpu": "x-gpu"}), IS_GPU)
    counter = DraCounter(CLASSES)
    (first,) = counter.pods([view], {("team-a", "x-gpu"): c})
    (again,) = counter.pods([view], {("team-a", "x-gpu"): c})
    assert again is first and first is not view


def test_dra_gpus_of_a_claim_of_another_namespace_are_unknown() -> None:
    c = claim_view(claim("x-gpu", [("gpu", "gpu-0")], [exactly("gpu", "gpu.nvidia.com")], ["u1"], ns="other"))
    got = dra_gpus("team-a", "u1", ("x-gpu",), {("other", "x-gpu"): c}, CLASSES, scheduled=True)
    assert got.unknown and got.gpus == {}


# --- accounting and reservation ------------------------------------------------------------------


def cluster_queue() -> dict[str, Any]:
    return {
        "metadata": {"name": "research"},
        "spec": {
            "resourceGroups": [
                {"flavors": [{"name": "h100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 8}]}]},
                {
                    "flavors": [
                        {"name": "h100-dra", "resources": [{"name": "gpu.nvidia.com", "nominalQuota": 8}]}
                    ]
                },
            ]
        },
        "status": {
            "flavorsUsage": [
                {"name": "h100", "resources": [{"name": "nvidia.com/gpu", "total": "2"}]},
                {"name": "h100-dra", "resources": [{"name": "gpu.nvidia.com", "total": "3"}]},
            ]
        },
    }


def mixed_cluster() -> tuple[list[dict[str, Any]], dict[str, PodView]]:
    nodes = [node("plugin-0", "plugin", {"nvidia.com/gpu": "8"}), node("node-1", "dra", {})]
    gpus = [("gpu", f"gpu-{i}") for i in range(4)]
    claims = [claim("dra-ghost-gpu", gpus, [exactly("gpu", "gpu.nvidia.com", 4)], ["u-dra"])]
    pods = [
        dra_pod("dra-ghost", "u-dra", templates={"gpu": "dra-ghost-gpu"}),
        {**dra_pod("plugin-ghost", "u-plugin", node="plugin-0", gpus=3)},
    ]
    return nodes, counted(pods, claims)


def test_a_team_with_device_plugin_and_dra_gpus_has_both_in_its_books() -> None:
    nodes, views = mixed_cluster()
    buckets = {("team-a", "dra-ghost"): "FINISHED_IDLE", ("team-a", "plugin-ghost"): "FINISHED_IDLE"}
    plugin, dra, mig = account(FLAVORS, nodes, views.values(), [cluster_queue()], buckets)
    # device plugin: 8 on the node, 3 held outside Kueue, 2 admitted: 5 truly free, Kueue sees 6
    assert (plugin.allocatable, plugin.in_use, plugin.held_outside_kueue) == (8, 3, 3)
    assert (plugin.truly_free, plugin.kueue_believes_free, plugin.gap) == (5, 6, 1)
    assert plugin.as_dict()["gap"] == 1 and "gpusUnknownPods" not in plugin.as_dict()
    # DRA: 4 devices of the claim held outside Kueue, Kueue admitted 3 of 8 and believes 5 free;
    # no ResourceSlices given (test_dra_capacity.py counts them): free and gap unknown, not made up
    assert (dra.in_use, dra.held_outside_kueue, dra.kueue_nominal, dra.kueue_admitted) == (4, 4, 8, 3)
    assert dra.kueue_believes_free == 5 and dra.as_dict()["gap"] is None
    assert mig.in_use == 0


def test_dra_gpus_are_reserved_under_the_class_resource_kueue_charges() -> None:
    nodes, views = mixed_cluster()
    ref = WorkloadRef("Pod", "team-a", "dra-ghost")
    wl = workload_from("Pod", dra_pod("dra-ghost", "u-dra"), IS_GPU)
    ns = {"team-a": {"ghostgpu.io/reclaim": "enabled", "ghostgpu.io/team": "research"}}
    cqs = {"research": {"h100": {"nvidia.com/gpu"}, "h100-dra": {"gpu.nvidia.com"}}}
    (r,) = desired_reservations(
        FLAVORS,
        ns,
        {ref: wl},
        {ref: [views["dra-ghost"]]},
        nodes,
        {"team-a": "research"},
        cqs,
        local_queue="default",
    )
    assert (r.flavor, r.resource, r.gpus) == ("h100-dra", "gpu.nvidia.com", 4)
    container = placeholder_object(r, DRA_GPU.node_labels)["spec"]["podSets"][0]["template"]["spec"][
        "containers"
    ][0]
    # Kueue adds a pod set's container requests to the DRA resources it maps: one quota resource
    assert container["resources"]["requests"] == {"gpu.nvidia.com": "4"}


# --- config, render, RBAC ------------------------------------------------------------------------


def controller_read_rules(text: str) -> list[dict[str, Any]]:
    files = render_bundles(load_config_text(text))
    objs = [o for o in yaml.safe_load_all(files["controller/rbac.yaml"]) if o]
    (read,) = [
        o for o in objs if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "ghostgpu-controller-read"
    ]
    return read["rules"]


def test_resource_claims_are_read_only_with_dra_flavors() -> None:
    claims = {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims"],
        "verbs": ["get", "list", "watch"],
    }
    assert claims in controller_read_rules(DRA_FILE)
    assert not any("resource.k8s.io" in r["apiGroups"] for r in controller_read_rules(MINIMAL))
    # the code that needs it: the claims reflector (list + watch) and `ghostgpu status` (list)
    from ghostgpu.controller.app import RESOURCECLAIMS, Informers

    assert (RESOURCECLAIMS.version, RESOURCECLAIMS.plural) == ("resource.k8s.io/v1", "resourceclaims")
    assert Informers(object(), IS_GPU, gpu_classes=["gpu.nvidia.com"]).claims is not None
    assert Informers(object(), IS_GPU).claims is None


def test_the_controller_config_carries_the_dra_flavors_only_when_there_are_some(tmp_path: Path) -> None:
    def controller_section(text: str) -> dict[str, Any]:
        (cm,) = [
            o
            for o in yaml.safe_load_all(render_bundles(load_config_text(text))["controller/configmap.yaml"])
            if o
        ]
        return yaml.safe_load(next(iter(cm["data"].values())))

    assert "draFlavors" not in controller_section(MINIMAL)
    section = controller_section(DRA_FILE)
    assert section["draFlavors"] == [
        {
            "name": "h100-dra",
            "deviceClass": "gpu.nvidia.com",
            "resource": "gpu.nvidia.com",
            "nodeLabels": {"pool": "dra"},
        }
    ]
    path = tmp_path / "controller.yaml"
    path.write_text(yaml.safe_dump(section))
    loaded = load_any_config(path)
    assert loaded.flavors is None  # device-plugin flavors discovered from Kueue, as before
    assert dra_flavor_specs(loaded.controller) == [DRA_GPU]
    whole = tmp_path / "ghostgpu.yaml"
    whole.write_text("apiVersion: ghostgpu.io/v1alpha1\nkind: GhostgpuConfig\n" + DRA_FILE)
    assert load_any_config(whole).flavors == [FlavorSpec("h100", "nvidia.com/gpu", {}), DRA_GPU]


def test_a_managers_pod_whose_gpus_are_unknown_stays_its_pod_so_it_is_not_judged_without_it() -> None:
    """A manager keeps only its GPU pods (a RayCluster's CPU head is not judged); a pod whose claim
    the cache has not seen yet has no GPUs counted, but it must stay the manager's pod: dropped,
    the manager would be judged on its other pods alone instead of waiting, as a Deployment does."""
    from ghostgpu.actuators import ActuatorTable
    from ghostgpu.controller.inventory import pods_by_workload
    from ghostgpu.controller.managers import manager_workload

    table = ActuatorTable()
    rc = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
          "metadata": {"name": "rc", "namespace": "team-a", "uid": "uid-rc"}, "spec": {}}  # fmt: skip
    wl = manager_workload(table.only("RayCluster"), rc, IS_GPU)
    c = claim("w1-gpu", [("gpu", "gpu-0")], [exactly("gpu", "gpu.nvidia.com")], ["u1"])
    pods = [
        dra_pod("w1", "u1", templates={"gpu": "w1-gpu"}),
        dra_pod("w2", "u2", templates={"gpu": "not-in-cache"}),
        dra_pod("head", "u3"),
    ]
    for p in pods:
        p["metadata"]["ownerReferences"] = [{"kind": "RayCluster", "name": "rc", "controller": True}]
    views = counted(pods, [c])
    assert views["w2"].gpus_unknown and not views["w2"].gpu_requests
    got = pods_by_workload({wl.ref: wl}, views.values(), lambda p: wl.ref)
    assert [p.name for p in got[wl.ref]] == ["w1", "w2"]  # the CPU head is not its GPU pod
