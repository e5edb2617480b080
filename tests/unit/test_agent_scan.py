"""A node scan (fake proc tree + pod objects as the apiserver returns them) and the series the
agent exports from it: their names, labels and values are the contract the controller parses."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from test_agent_procfs import FakeProc

from ghostgpu.agent.exporter import AgentExporter, exported_programs
from ghostgpu.agent.scan import ContainerKey, ScanResult, Seen, Unseen, agent_pod, scan_node, targets_of
from ghostgpu.controller.inventory import gpu_predicate
from ghostgpu.verdict import ProcessCounts, ProcessPolicy, count_roles

POLICY = ProcessPolicy()
IS_GPU = gpu_predicate(["example.com/accel"])
SHIM = "0::/system.slice/containerd.service"


def cid(n: int) -> str:
    return f"{n:064x}"


def uid(n: int) -> str:
    return f"{n:08x}-0000-4000-8000-000000000000"


def pod(
    name: str,
    n: int,
    containers: dict[str, dict[str, Any]],
    *,
    phase: str = "Running",
    shared: bool = False,
    init_gpu: bool = False,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """containers: name -> {"gpu": resource or None, "id": container id or None, "state": ...}."""
    spec: dict[str, Any] = {
        "nodeName": "node-a",
        "containers": [
            {"name": c, "resources": {"limits": {v["gpu"]: "1"}} if v.get("gpu") else {}}
            for c, v in containers.items()
        ],
    }
    if shared:
        spec["shareProcessNamespace"] = True
    if init_gpu:
        spec["initContainers"] = [{"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    return {
        "metadata": {"namespace": "team", "name": name, "uid": uid(n), "annotations": annotations or {}},
        "spec": spec,
        "status": {
            "phase": phase,
            "containerStatuses": [
                {
                    "name": c,
                    **({"containerID": f"containerd://{v['id']}"} if v.get("id") else {}),
                    "state": {v.get("state", "running"): {}},
                }
                for c, v in containers.items()
            ],
        },
    }


def cg(n: int, container: str) -> str:
    return f"0::/kubepods/burstable/pod{uid(n)}/{container}"


@pytest.fixture
def node(tmp_path: Path) -> FakeProc:
    f = FakeProc(tmp_path / "proc")
    f.add(10, ppid=1, nspid=(10,), cgroup=SHIM, comm="containerd-shim")
    f.add(11, ppid=1, nspid=(11,), cgroup="0::/user.slice", comm="bash", argv=["bash"])
    return f


def key(name: str, n: int, container: str) -> ContainerKey:
    return ContainerKey("team", name, uid(n), container)


def test_a_containers_processes_counted_by_role(node: FakeProc) -> None:
    node.add(100, ppid=10, nspid=(100, 1), cgroup=cg(1, cid(1)), comm="sh",
             argv=["/bin/sh", "-c", "python3 train.py; sleep infinity"])  # fmt: skip
    node.add(101, ppid=100, nspid=(101, 7), cgroup=cg(1, cid(1)), argv=["sleep", "infinity"])
    node.add(102, ppid=10, nspid=(102, 9), cgroup=cg(1, cid(1)), comm="bash", argv=["bash"])  # exec'd
    node.add(103, ppid=10, nspid=(103, 1), cgroup=cg(1, cid(2)), comm="python3",
             argv=["python3", "serve.py"], state="R")  # fmt: skip
    pods = [
        pod("trainer", 1, {"main": {"gpu": "nvidia.com/gpu", "id": cid(1)}, "side": {"id": cid(2)}}),
    ]
    got = scan_node(pods, node.root, POLICY, IS_GPU, now=1234.5)
    assert got.timestamp == 1234.5 and got.scanned_pids == 6
    assert list(got.containers) == [key("trainer", 1, "main")]  # the sidecar asks for no GPU
    seen = got.containers[key("trainer", 1, "main")]
    assert isinstance(seen, Seen)
    assert [(r.pid, r.ppid, r.command, r.scope) for r in seen.rows] == [
        (1, 0, "/bin/sh -c python3 train.py; sleep infinity", "trainer/main"),
        (7, 1, "sleep infinity", "trainer/main"),
        (9, 0, "bash", "trainer/main"),
    ]
    assert seen.counts == ProcessCounts(wrapper=1, holder=1, session=1, programs=("bash",))
    assert seen.counts == count_roles(seen.rows, POLICY)


def test_which_pods_and_containers_are_reported(node: FakeProc) -> None:
    node.add(100, ppid=10, nspid=(100, 1), cgroup=cg(1, cid(1)), argv=["sleep", "1"])
    node.add(200, ppid=10, nspid=(200, 1), cgroup=cg(4, cid(4)), argv=["python3", "a.py"])
    node.add(300, ppid=10, nspid=(300, 1), cgroup=cg(7, cid(7)), argv=["python3", "b.py"])
    pods = [
        pod("mig", 1, {"a": {"gpu": "nvidia.com/mig-1g.10gb", "id": cid(1)}}),
        pod("cpu-only", 2, {"a": {"id": cid(2)}}),
        pod("pending", 3, {"a": {"gpu": "nvidia.com/gpu"}}, phase="Pending"),
        pod("flavor", 4, {"a": {"gpu": "example.com/accel", "id": cid(4)}}),  # a flavor's resource
        pod("crashing", 5, {"a": {"gpu": "nvidia.com/gpu", "id": cid(5), "state": "waiting"}}),
        pod("no-id-yet", 6, {"a": {"gpu": "nvidia.com/gpu"}}),
        pod("init-only", 7, {"first": {"id": cid(7)}, "second": {"id": cid(8)}}, init_gpu=True),
        pod("vanished", 9, {"a": {"gpu": "amd.com/gpu", "id": cid(9)}}),
    ]
    got = scan_node(pods, node.root, POLICY, IS_GPU, now=0)
    outcome = {
        k.pod + "/" + k.container: v if isinstance(v, Unseen) else "seen" for k, v in got.containers.items()
    }
    assert outcome == {
        "mig/a": "seen",
        "flavor/a": "seen",
        "crashing/a": Unseen.NOT_RUNNING,
        "no-id-yet/a": Unseen.NOT_RUNNING,
        "init-only/first": "seen",  # a GPU only in an init container: the first container
        "vanished/a": Unseen.NO_CGROUP_MATCH,
    }


def test_a_container_naming_a_dra_claim_is_a_gpu_container(node: FakeProc) -> None:
    # The agent reads pods only: a claim's device class is not known to it, so a container that
    # names any claim is reported; one that names none (a sidecar) is not.
    node.add(100, ppid=10, nspid=(100, 1), cgroup=cg(1, cid(1)), argv=["python3", "train.py"])
    node.add(101, ppid=10, nspid=(101, 1), cgroup=cg(1, cid(2)), argv=["sleep", "infinity"])
    dra = pod("dra", 1, {"trainer": {"id": cid(1)}, "side": {"id": cid(2)}})
    dra["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
    dra["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    got = scan_node([dra], node.root, POLICY, IS_GPU, now=0)
    assert list(got.containers) == [key("dra", 1, "trainer")]
    assert isinstance(got.containers[key("dra", 1, "trainer")], Seen)


def test_a_shared_pid_namespace_is_listed_whole_in_each_gpu_container(node: FakeProc) -> None:
    sandbox = cid(99)
    node.add(400, ppid=10, nspid=(400, 1), cgroup=cg(1, sandbox), comm="pause", argv=["/pause"])
    node.add(401, ppid=10, nspid=(401, 7), cgroup=cg(1, cid(1)), comm="sh",
             argv=["/bin/sh", "-c", "python3 -c 'print(1)'; sleep infinity"])  # fmt: skip
    node.add(402, ppid=401, nspid=(402, 8), cgroup=cg(1, cid(1)), argv=["sleep", "infinity"])
    node.add(403, ppid=10, nspid=(403, 12), cgroup=cg(1, cid(2)), argv=["sleep", "infinity"])
    pods = [
        pod(
            "shared",
            1,
            {"trainer": {"gpu": "nvidia.com/gpu", "id": cid(1)}, "eval": {"id": cid(2)}},
            shared=True,
        ),
    ]
    got = scan_node(pods, node.root, POLICY, IS_GPU, now=0)
    seen = got.containers[key("shared", 1, "trainer")]
    assert isinstance(seen, Seen)
    assert [(r.pid, r.ppid, r.command) for r in seen.rows] == [
        (1, 0, "/pause"),
        (7, 0, "/bin/sh -c python3 -c 'print(1)'; sleep infinity"),
        (8, 7, "sleep infinity"),
        (12, 0, "sleep infinity"),
    ]
    # Pause as pid 1: the entrypoints' ppid 0 is no exec session; only holders and a wrapper.
    assert seen.counts == ProcessCounts(wrapper=1, holder=3)


def test_a_static_pods_processes_are_found_from_its_containers_own_cgroup(node: FakeProc) -> None:
    # The kubelet names a static pod's cgroup after its config hash, not the mirror pod's UID: the
    # pod cgroup of the container's own processes (the ID in its status) says which pod it is.
    h = "8d6a3c2f1e0b9a7c5d4e3f2a1b0c9d8e"
    node.add(500, ppid=10, nspid=(500, 1), cgroup=f"0::/kubepods/pod{h}/{cid(98)}", comm="pause")
    node.add(501, ppid=10, nspid=(501, 3), cgroup=f"0::/kubepods/pod{h}/{cid(1)}", argv=["train"], state="R")
    pods = [pod("static", 1, {"a": {"gpu": "nvidia.com/gpu", "id": cid(1)}}, shared=True)]
    seen = scan_node(pods, node.root, POLICY, IS_GPU, now=0).containers[key("static", 1, "a")]
    assert isinstance(seen, Seen) and [r.pid for r in seen.rows] == [1, 3]


def test_an_annotation_a_pod_author_sets_cannot_borrow_another_pods_processes(node: FakeProc) -> None:
    # Any pod author may write kubernetes.io/config.hash: naming the victim's pod UID there must
    # not list the victim's processes under the author's shared-namespace pod.
    node.add(100, ppid=10, nspid=(100, 1), cgroup=cg(1, cid(1)), argv=["python3", "secret-train.py"])
    node.add(200, ppid=10, nspid=(200, 1), cgroup=cg(2, cid(2)), argv=["sleep", "infinity"])
    victim = pod("victim", 1, {"a": {"gpu": "nvidia.com/gpu", "id": cid(1)}})
    forger = pod("forger", 2, {"a": {"gpu": "nvidia.com/gpu", "id": cid(2)}}, shared=True,
                 annotations={"kubernetes.io/config.hash": uid(1)})  # fmt: skip
    got = scan_node([victim, forger], node.root, POLICY, IS_GPU, now=0)
    forged = got.containers[key("forger", 2, "a")]
    assert isinstance(forged, Seen) and [r.command for r in forged.rows] == ["sleep infinity"]


def test_a_process_named_like_a_status_line_blinds_no_container(node: FakeProc) -> None:
    # prctl(PR_SET_NAME, "\x1cVmLck:") in any pod of the node: every GPU container is still seen.
    node.add(100, ppid=10, nspid=(100, 1), cgroup=cg(1, cid(1)), argv=["train"])
    node.add(200, ppid=10, nspid=(200, 1), cgroup=cg(2, cid(2)), argv=[], comm="\x1cVmLck:")
    pods = [
        pod("p", 1, {"a": {"gpu": "nvidia.com/gpu", "id": cid(1)}}),
        pod("renamer", 2, {"a": {"gpu": "nvidia.com/gpu", "id": cid(2)}}),
    ]
    got = scan_node(pods, node.root, POLICY, IS_GPU, now=0)
    assert isinstance(got.containers[key("p", 1, "a")], Seen)
    renamed = got.containers[key("renamer", 2, "a")]
    assert isinstance(renamed, Seen) and [r.command for r in renamed.rows] == ["[\x1cVmLck:]"]


def test_an_unreadable_process_fails_its_own_container_only(node: FakeProc) -> None:
    node.add(100, ppid=10, nspid=(100, 1), cgroup=cg(1, cid(1)), argv=["train"])
    node.add(200, ppid=10, nspid=(200, 1), cgroup=cg(2, cid(2)), argv=["train"])
    (node.root / "200" / "stat").write_text("garbage")
    pods = [
        pod("fine", 1, {"a": {"gpu": "nvidia.com/gpu", "id": cid(1)}}),
        pod("bad", 2, {"a": {"gpu": "nvidia.com/gpu", "id": cid(2)}}),
    ]
    got = scan_node(pods, node.root, POLICY, IS_GPU, now=0)
    assert isinstance(got.containers[key("fine", 1, "a")], Seen)
    assert got.containers[key("bad", 2, "a")] == Unseen.PROC_UNREADABLE


def test_a_failure_in_a_shared_pods_other_container_fails_the_pods_listing(node: FakeProc) -> None:
    node.add(100, ppid=10, nspid=(100, 1), cgroup=cg(1, cid(1)), argv=["train"])
    node.add(101, ppid=10, nspid=(101, 2), cgroup=cg(1, cid(9)), argv=["side"])
    (node.root / "101" / "stat").write_text("garbage")
    gpu = {"gpu": "nvidia.com/gpu", "id": cid(1)}
    pods = [pod("shared", 1, {"a": gpu, "s": {"id": cid(9)}}, shared=True)]
    got = scan_node(pods, node.root, POLICY, IS_GPU, now=0)
    assert got.containers[key("shared", 1, "a")] == Unseen.PROC_UNREADABLE


def test_a_container_over_the_process_cap_is_unseen(node: FakeProc, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("ghostgpu.agent.procfs.MAX_PROCESSES", 3)
    for pid in range(100, 105):
        node.add(pid, ppid=10, nspid=(pid, pid - 99), cgroup=cg(1, cid(1)), argv=["sleep", "1"])
    node.add(200, ppid=10, nspid=(200, 1), cgroup=cg(2, cid(2)), argv=["train"])
    pods = [
        pod("forks", 1, {"a": {"gpu": "nvidia.com/gpu", "id": cid(1)}}),
        pod("fine", 2, {"a": {"gpu": "nvidia.com/gpu", "id": cid(2)}}),
    ]
    got = scan_node(pods, node.root, POLICY, IS_GPU, now=0)
    assert got.containers[key("forks", 1, "a")] == Unseen.TOO_MANY_PROCESSES
    assert isinstance(got.containers[key("fine", 2, "a")], Seen)


def test_a_process_that_cannot_be_placed_makes_every_container_unseen(node: FakeProc) -> None:
    node.add(100, ppid=10, nspid=(100, 1), cgroup=cg(1, cid(1)), argv=["train"])
    (node.root / "600").mkdir()
    (node.root / "600" / "cgroup").mkdir()  # present, unreadable: it may be this container's
    pods = [pod("p", 1, {"a": {"gpu": "nvidia.com/gpu", "id": cid(1)}})]
    got = scan_node(pods, node.root, POLICY, IS_GPU, now=0)
    assert got.containers == {key("p", 1, "a"): Unseen.PROC_UNREADABLE}


def test_an_unlistable_proc_root_makes_every_container_unseen(tmp_path: Path) -> None:
    pods = [pod("p", 1, {"a": {"gpu": "nvidia.com/gpu", "id": cid(1)}})]
    got = scan_node(pods, tmp_path / "gone", POLICY, IS_GPU, now=0)
    assert got.containers == {key("p", 1, "a"): Unseen.PROC_UNREADABLE}
    assert got.scanned_pids == 0


# --- the series ---------------------------------------------------------------------------------


def series(exporter: AgentExporter) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(generate_latest(exporter.registry).decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def labels(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kw.items()))


def test_the_series_of_a_scan() -> None:
    seen_key = ContainerKey("team", "trainer-0", "u-1", "main")
    unseen_key = ContainerKey("team", "other-0", "u-2", "gpu")
    counts = ProcessCounts(work=2, session=1, programs=("bash", "python3"))
    held = ContainerKey("team", "held-0", "u-3", "main")
    exporter = AgentExporter("node-a")
    exporter.publish(
        ScanResult(
            1700000000.5,
            {
                seen_key: Seen(counts, ()),
                unseen_key: Unseen.NO_CGROUP_MATCH,
                held: Seen(ProcessCounts(holder=1, wrapper=1), ()),
            },
            scanned_pids=321,
            duration_s=0.02,
        )
    )
    got = series(exporter)
    # The tracked container under label names of the agent's own: no scrape's target label
    # (namespace, pod, container) can overwrite them, so its ServiceMonitor needs no honorLabels.
    base = {
        "tracked_namespace": "team",
        "tracked_pod": "trainer-0",
        "tracked_uid": "u-1",
        "tracked_container": "main",
    }
    other = {
        "tracked_namespace": "team",
        "tracked_pod": "other-0",
        "tracked_uid": "u-2",
        "tracked_container": "gpu",
    }
    held_l = base | {"tracked_pod": "held-0", "tracked_uid": "u-3"}
    per_container = {k: v for k, v in got.items() if k[0].startswith("ghostgpu_agent_container_")}
    assert per_container == {
        # the roles with processes only (no zero series); the live roles name the programs
        ("ghostgpu_agent_container_processes", labels(**base, role="work", programs="bash python3")): 2,
        ("ghostgpu_agent_container_processes", labels(**base, role="session", programs="bash python3")): 1,
        # the presence series names the live roles that have a series, so an answer that lost one
        # is told apart from a container without it
        (
            "ghostgpu_agent_container_scan_timestamp_seconds",
            labels(**base, live_roles="session work"),
        ): 1700000000.5,
        ("ghostgpu_agent_container_scan_timestamp_seconds", labels(**other, live_roles="")): 1700000000.5,
        ("ghostgpu_agent_container_unseen", labels(**other, reason="no-cgroup-match")): 1,
        # a container that only waits: its roles name no program (programs="" is no label in
        # Prometheus), and its presence series
        ("ghostgpu_agent_container_processes", labels(**held_l, role="wrapper", programs="")): 1,
        ("ghostgpu_agent_container_processes", labels(**held_l, role="holder", programs="")): 1,
        ("ghostgpu_agent_container_scan_timestamp_seconds", labels(**held_l, live_roles="")): 1700000000.5,
    }
    assert got[("ghostgpu_agent_scanned_pids", ())] == 321
    assert got[("ghostgpu_agent_tracked_containers", ())] == 3
    assert got[("ghostgpu_agent_scan_duration_seconds_count", ())] == 1
    assert got[("ghostgpu_agent_scan_duration_seconds_sum", ())] == pytest.approx(0.02)
    info = [k for k in got if k[0] == "ghostgpu_agent_info"]
    assert len(info) == 1 and dict(info[0][1])["node"] == "node-a" and got[info[0]] == 1


def test_the_next_scan_replaces_the_last() -> None:
    exporter = AgentExporter("node-a")
    gone = ContainerKey("team", "gone", "u-9", "main")
    exporter.publish(ScanResult(1.0, {gone: Seen(ProcessCounts(work=1, programs=("x",)), ())}, 5))
    exporter.publish(ScanResult(2.0, {}, 5))
    got = series(exporter)
    assert not [k for k in got if k[0].startswith("ghostgpu_agent_container_")]
    assert got[("ghostgpu_agent_tracked_containers", ())] == 0
    assert got[("ghostgpu_agent_scan_duration_seconds_count", ())] == 2


def test_before_the_first_scan_only_the_info_series_is_there() -> None:
    got = series(AgentExporter("node-a"))
    assert {k[0] for k in got} == {
        "ghostgpu_agent_info",
        *(f"ghostgpu_agent_scan_duration_seconds_{s}" for s in ("count", "sum", "created", "bucket")),
    }


def test_programs_are_bounded() -> None:
    progs = tuple(sorted(["z" * 100, "a", "b", "c", "d", "e"]))
    assert exported_programs(progs) == ["a", "b", "c", "d"]
    assert exported_programs(("q" * 100,)) == ["q" * 64]


# --- the pod store --------------------------------------------------------------------------------


def _full(p: dict[str, Any]) -> dict[str, Any]:
    """A pod as the apiserver sends it: everything the agent does not read, too."""
    p = {**p, "metadata": {**p["metadata"], "labels": {"app": "x"}, "managedFields": [{"f": "x" * 4000}]}}
    p["metadata"]["annotations"] = {"kubectl.kubernetes.io/last-applied-configuration": "y" * 20000}
    p["spec"] = {**p["spec"], "volumes": [{"name": "v", "emptyDir": {}}]}
    p["spec"]["containers"] = [{**c, "image": "img", "env": [{"name": "SECRET", "value": "s" * 5000}]}
                               for c in p["spec"]["containers"]]  # fmt: skip
    p["status"] = {**p["status"], "conditions": [{"type": "Ready", "status": "True"}], "podIP": "10.0.0.1"}
    return p


SHAPES = [
    pod("mig", 1, {"a": {"gpu": "nvidia.com/mig-1g.10gb", "id": cid(1)}, "side": {"id": cid(2)}}),
    pod("shared", 2, {"a": {"gpu": "nvidia.com/gpu", "id": cid(3)}}, shared=True),
    pod("init-only", 3, {"first": {"id": cid(4)}}, init_gpu=True),
    pod("pending", 4, {"a": {"gpu": "nvidia.com/gpu"}}, phase="Pending"),
    pod("crashing", 5, {"a": {"gpu": "nvidia.com/gpu", "id": cid(5), "state": "waiting"}}),
]


@pytest.mark.parametrize("p", SHAPES, ids=lambda p: p["metadata"]["name"])
def test_the_pod_store_keeps_what_the_scan_reads_and_nothing_else(p: dict[str, Any]) -> None:
    full = _full(p)
    kept = agent_pod(full, "node-a", IS_GPU)
    assert kept is not None
    assert targets_of(kept, IS_GPU) == targets_of(full, IS_GPU)
    assert len(repr(kept)) < 1200 < len(repr(full))
    assert "annotations" not in kept["metadata"] and "env" not in repr(kept)


def test_the_pod_store_drops_pods_that_cannot_run_here_or_ask_for_no_gpu() -> None:
    running = pod("p", 1, {"a": {"gpu": "nvidia.com/gpu", "id": cid(1)}})
    assert agent_pod(running, "node-a", IS_GPU) is not None
    elsewhere = {**running, "spec": {**running["spec"], "nodeName": "node-b"}}
    assert agent_pod(elsewhere, "node-a", IS_GPU) is None
    for phase in ("Succeeded", "Failed"):
        done = pod("done", 2, {"a": {"gpu": "nvidia.com/gpu"}}, phase=phase)
        assert agent_pod(done, "node-a", IS_GPU) is None
    assert agent_pod(pod("cpu", 3, {"a": {"id": cid(3)}}), "node-a", IS_GPU) is None
