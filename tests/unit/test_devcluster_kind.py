"""The kind provider's pieces that need no cluster: its kind config, podman limits, image rewrites,
and the refusals of `ghostgpu devcluster up --provider kind`."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.devcluster import kind


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
