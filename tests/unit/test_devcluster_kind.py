"""The kind provider's pieces that need no cluster: its kind config, podman limits, image rewrites,
the kind demo's ghost and how it reads the cluster, and the refusals of `ghostgpu devcluster up
--provider kind` and `ghostgpu devcluster demo --provider kind`."""

from __future__ import annotations

import io
import json
import resource
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.devcluster import kind, kind_demo


def test_cgroup_v1_host_gets_the_kubelet_patch_and_v2_does_not() -> None:
    v1 = kind.kind_config(cgroup_v1=True)
    patches = [yaml.safe_load(p) for p in v1["kubeadmConfigPatches"]]
    assert patches == [{"kind": "KubeletConfiguration", "failCgroupV1": False}]
    assert "kubeadmConfigPatches" not in kind.kind_config(cgroup_v1=False)
    assert [n["role"] for n in v1["nodes"]] == ["control-plane"]


def test_podman_limits_never_exceed_the_hosts_hard_limits() -> None:
    conf = kind.containers_conf()
    limits = dict(
        item.split("=") for item in conf.split("[", 2)[2].rstrip("]\n").replace('"', "").split(", ")
    )
    nofile_hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc_hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    soft, hard = map(int, limits["nofile"].split(":"))
    assert soft == hard and (nofile_hard == resource.RLIM_INFINITY or hard <= nofile_hard)
    soft, hard = map(int, limits["nproc"].split(":"))
    assert soft == hard <= kind.NPROC_LIMIT
    assert nproc_hard == resource.RLIM_INFINITY or hard <= nproc_hard


def test_set_images_replaces_named_images_in_init_and_main_containers_only() -> None:
    deploy = {
        "kind": "Deployment",
        "spec": {
            "template": {
                "spec": {
                    "initContainers": [{"name": "pre", "image": "reg.kyverno.io/kyverno/kyvernopre:latest"}],
                    "containers": [
                        {"name": "kyverno", "image": "reg.kyverno.io/kyverno/kyverno:latest"},
                        {"name": "sidecar", "image": "example.com/other:1.0", "imagePullPolicy": "Always"},
                    ],
                }
            }
        },
    }
    (out,) = kind.set_images([deploy], {"kyverno": "localhost/k:1", "kyvernopre": "localhost/p:1"})
    spec = out["spec"]["template"]["spec"]
    assert spec["initContainers"][0] == {"name": "pre", "image": "localhost/p:1", "imagePullPolicy": "Never"}
    assert spec["containers"][0]["image"] == "localhost/k:1"
    assert spec["containers"][0]["imagePullPolicy"] == "Never"
    assert spec["containers"][1] == {
        "name": "sidecar",
        "image": "example.com/other:1.0",
        "imagePullPolicy": "Always",
    }


def test_parse_kv_reads_only_key_value_lines() -> None:
    out = "[build] noise\nIMAGE=localhost/x:1\nKUEUE_TAR=/a/b=c.tar\nnot a key=1\n"
    assert kind.parse_kv(out) == {"IMAGE": "localhost/x:1", "KUEUE_TAR": "/a/b=c.tar"}


def test_up_without_a_container_engine_says_why(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(kind.os, "geteuid", lambda: 0)
    monkeypatch.setattr(kind.KindTools, "missing", lambda self: [])
    monkeypatch.setattr(kind, "engine", lambda: (None, "no `docker` on PATH; no `podman` on PATH"))
    res = CliRunner().invoke(app, ["devcluster", "up", "--provider", "kind", "--state-dir", str(tmp_path)])
    assert res.exit_code == 2
    assert "no container engine for kind: no `docker` on PATH; no `podman` on PATH" in res.output
    assert not (tmp_path / "kubeconfig").exists()


def test_up_names_the_missing_binaries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(kind.os, "geteuid", lambda: 0)
    monkeypatch.setattr(kind.KindTools, "missing", lambda self: ["/cache/kind-v0/bin/kind"])
    res = CliRunner().invoke(app, ["devcluster", "up", "--provider", "kind", "--state-dir", str(tmp_path)])
    assert res.exit_code == 2 and "not built: /cache/kind-v0/bin/kind" in res.output
    assert "hack/testbin kind kind-node kyverno-init" in res.output


def test_an_unknown_provider_is_refused(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["devcluster", "up", "--provider", "minikube", "--state-dir", str(tmp_path)]
    )
    assert res.exit_code == 2 and "'minikube': unknown" in res.output


# ----- `ghostgpu devcluster demo --provider kind`: its pure pieces and its refusals -----


def test_the_ghost_asks_for_one_gpu_and_is_never_pulled() -> None:
    d = kind_demo.ghost_deployment("localhost/w:1")
    (box,) = d["spec"]["template"]["spec"]["containers"]
    assert (box["image"], box["imagePullPolicy"]) == ("localhost/w:1", "Never")
    assert box["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert d["metadata"]["namespace"] == kind_demo.GHOST_NS
    # No queue name: it bypasses Kueue, as ghosts do; no ghostgpu label: Kyverno's opt-in adds it.
    assert d["metadata"]["labels"] == {"app": kind_demo.GHOST}


def _pod(name: str, phase: str = "Running", ready: bool = True, deleting: bool = False) -> dict:
    meta = {"name": name, **({"deletionTimestamp": "now"} if deleting else {})}
    return {"metadata": meta, "status": {"phase": phase, "containerStatuses": [{"ready": ready}]}}


def test_running_pod_is_the_one_ready_pod_not_being_deleted() -> None:
    assert kind_demo.running_pod([_pod("a")]) == "a"
    assert kind_demo.running_pod([_pod("a", deleting=True), _pod("b")]) == "b"
    assert kind_demo.running_pod([_pod("a", ready=False)]) is None
    assert kind_demo.running_pod([_pod("a", phase="Pending")]) is None
    assert kind_demo.running_pod([_pod("a"), _pod("b")]) is None  # a rollout: not yet one


def test_reclaimed_reads_the_controllers_json_log_lines() -> None:
    logs = "\n".join(
        [
            '{"msg":"poll","poll":3}',
            '{"msg":"reclaimed","workload":"Deployment/team-kind/notebook","verdict":"FINISHED_IDLE"}',
            '{"msg":"reclaimed","workload":"Deployment/x/y"',  # cut by the log's tail
            "plain text line",
        ]
    )
    assert kind_demo.reclaimed(logs) == [("Deployment/team-kind/notebook", "FINISHED_IDLE")]


def test_ledger_replicas_reads_the_entry_of_the_ghost() -> None:
    data = {kind_demo.LEDGER_KEY: json.dumps({"replicas": 1, "stoppedAt": "t"})}
    assert kind_demo.ledger_replicas(data) == 1
    assert kind_demo.ledger_replicas({}) is None
    assert kind_demo.ledger_replicas(None) is None


def test_result_table_says_stopped_and_restored_only_when_both_happened() -> None:
    from rich.console import Console

    def row(run: kind_demo.GhostRun) -> str:
        console = Console(width=140, record=True, file=io.StringIO())
        console.print(kind_demo.result_table(run))
        return console.export_text()

    caught = [(f"Deployment/{kind_demo.GHOST_NS}/{kind_demo.GHOST}", "FINISHED_IDLE")]
    assert "stopped, restored" in row(kind_demo.GhostRun(reclaimed=caught, replicas=1))
    assert "not stopped" in row(kind_demo.GhostRun(reclaimed=[], replicas=1))


def test_demo_on_kind_without_a_container_engine_says_why_and_exits_2(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(kind.os, "geteuid", lambda: 0)
    monkeypatch.setattr(kind.KindTools, "missing", lambda self: [])
    monkeypatch.setattr(kind, "engine", lambda: (None, "no `docker` on PATH; no `podman` on PATH"))
    monkeypatch.setattr(kind, "up", lambda *a, **k: pytest.fail("nothing may start"))
    res = CliRunner().invoke(app, ["devcluster", "demo", "--provider", "kind", "--state-dir", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert "error: devcluster demo: no container engine for kind: no `docker` on PATH" in res.output
    assert "fix: hack/testbin kind kind-node kyverno-init" in res.output
    assert "Traceback" not in res.output


def test_demo_on_kind_names_the_missing_binaries(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(kind.os, "geteuid", lambda: 0)
    monkeypatch.setattr(kind.KindTools, "missing", lambda self: ["/cache/kind-v0/bin/kind"])
    res = CliRunner().invoke(app, ["devcluster", "demo", "--provider", "kind", "--state-dir", str(tmp_path)])
    assert res.exit_code == 2 and "not built: /cache/kind-v0/bin/kind" in res.output


def test_demo_leaves_a_kind_cluster_it_did_not_create(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cluster of the same name is the user's: kind.up refuses it, and the demo deletes nothing."""
    monkeypatch.setattr(kind_demo, "preflight", lambda: None)

    def refuse(*_a: object, **_k: object) -> None:
        raise kind.KindError("a kind cluster named 'ghostgpu' already exists")

    monkeypatch.setattr(kind, "up", refuse)
    monkeypatch.setattr(kind, "down", lambda *a, **k: pytest.fail("the user's cluster was deleted"))
    res = CliRunner().invoke(app, ["devcluster", "demo", "--provider", "kind", "--state-dir", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert "already exists" in res.output and "cleaned up" not in res.output


def test_demo_refuses_an_unknown_provider(tmp_path: Path) -> None:
    res = CliRunner().invoke(app, ["devcluster", "demo", "--provider", "minikube"])
    assert res.exit_code == 2 and "'minikube': unknown" in res.output


def test_wait_tries_a_failing_kubectl_again_and_says_its_last_error() -> None:
    calls = iter([kind.KindError("kubectl get\nNotFound: rolebinding"), "ok"])

    def cond() -> str:
        got = next(calls)
        if isinstance(got, Exception):
            raise got
        return got

    assert kind_demo.wait(cond, 5, "the RoleBinding") == "ok"

    def never() -> str:
        raise kind.KindError("kubectl get\nNotFound: rolebinding")

    with pytest.raises(kind_demo.DemoError) as e:
        kind_demo.wait(never, 0.1, "the RoleBinding")
    assert "waiting for the RoleBinding (last: NotFound: rolebinding)" in str(e.value)
    assert "fix: the lines above say what failed; `ghostgpu devcluster demo --provider kind --keep`" in str(
        e.value
    )
