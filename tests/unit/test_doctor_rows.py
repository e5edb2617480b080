"""The pure parts of `ghostgpu doctor`: the grants read from the rendered bundle, the rows about
namespaces, leases and versions. tests/e2e/test_doctor.py runs it against the devcluster."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from ghostgpu.config import load_default_config
from ghostgpu.devcluster.paths import VERSIONS_ENV, read_versions
from ghostgpu.doctor import cluster_checks as cc
from ghostgpu.doctor.prometheus_checks import tracked_gpu_pods
from ghostgpu.doctor.rbac_checks import Grant, grants
from ghostgpu.doctor.reads import lease_is_live
from ghostgpu.doctor.report import Row, exit_code
from ghostgpu.render import render_objects


def test_grants_follow_the_bundles_bindings() -> None:
    cfg = load_default_config()
    exec_mode = cfg.model_copy(
        update={"controller": cfg.controller.model_copy(update={"process_source": "exec"})}
    )
    exec_grants = grants(render_objects(exec_mode), ["team-a"])
    assert Grant("team-a", "", "pods/exec", "create") in exec_grants
    assert Grant("team-a", "", "pods/exec", "get") in exec_grants  # the websocket upgrade is a GET
    got = set(grants(render_objects(cfg), ["team-a"]))
    ctrl_ns = cfg.controller.namespace
    assert Grant("", "", "pods", "watch") in got  # ClusterRoleBinding: cluster-wide
    assert Grant("team-a", "", "pods", "patch") in got  # Kyverno's RoleBinding: opted-in only
    # the example's agent mode: no exec; the node agent's own ServiceAccount is not the controller's
    assert not any(g.resource == "pods/exec" for g in got)
    assert Grant("", "", "pods", "patch") not in got
    assert Grant(ctrl_ns, "coordination.k8s.io", "leases", "update") in got  # RoleBinding in its ns
    assert not any(g.verb == "delete" for g in got)  # the bundle grants no delete (reservation off)
    # Kyverno's own aggregated ClusterRoles (policies/kyverno-rbac.yaml) are not the controller's.
    assert not any(g.resource == "localqueues" and g.verb == "create" for g in got)


def test_grants_without_opted_in_namespaces_are_only_the_bound_ones() -> None:
    got = grants(render_objects(load_default_config()), [])
    assert got and all(g.namespace in ("", "ghostgpu-system") for g in got)


def test_supported_kueue_minors_cover_the_tested_releases() -> None:
    versions = read_versions(VERSIONS_ENV)
    tested = [versions["KUEUE_VERSION"], *versions.get("KUEUE_EXTRA_VERSIONS", "").split()]
    for v in tested:
        major, minor, _ = v.lstrip("v").split(".")
        assert (int(major), int(minor)) in cc.SUPPORTED_KUEUE_MINORS, v


def _ns(name: str, **labels: str) -> dict:
    return {"metadata": {"name": name, "labels": labels}}


def test_namespaces_row() -> None:
    cfg = load_default_config()
    team = cfg.teams[0].name
    good = _ns("a", **{cc.RECLAIM_LABEL: "enabled", cc.TEAM_LABEL: team})
    bad = _ns("b", **{cc.RECLAIM_LABEL: "enabled", cc.TEAM_LABEL: "nosuch"})
    bare = _ns("c", **{cc.RECLAIM_LABEL: "enabled"})
    assert cc.check_namespaces([good], cfg).status == "ok"
    row = cc.check_namespaces([good, bad, bare], cfg)
    assert row.status == "fail" and "b (ghostgpu.io/team=nosuch)" in row.found and "c (" in row.found
    assert team in row.fix
    assert cc.check_namespaces([], cfg).status == "warn"
    assert cc.namespaces_with_known_team([good, bad, bare], cfg) == ["a"]


def test_lease_liveness() -> None:
    now = datetime(2026, 1, 1, tzinfo=UTC)

    def lease(holder: str | None, ago: float) -> dict:
        at = (now - timedelta(seconds=ago)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        return {"spec": {"holderIdentity": holder, "leaseDurationSeconds": 15, "renewTime": at}}

    assert lease_is_live(lease("a", 3), now)
    assert not lease_is_live(lease("a", 60), now)
    assert not lease_is_live(lease(None, 1), now)
    assert not lease_is_live(None, now)


def test_tracked_gpu_pods_are_running_gpu_pods_of_opted_in_namespaces() -> None:
    def pod(ns: str, name: str, phase: str, gpu: bool) -> dict:
        limits = {"nvidia.com/gpu": "1"} if gpu else {"cpu": "1"}
        return {
            "metadata": {"namespace": ns, "name": name},
            "spec": {"containers": [{"resources": {"limits": limits}}]},
            "status": {"phase": phase},
        }

    pods = [
        pod("a", "p1", "Running", True),
        pod("a", "p2", "Pending", True),
        pod("a", "p3", "Running", False),
    ]
    pods.append(pod("z", "p4", "Running", True))
    assert tracked_gpu_pods(pods, ["a"]) == [("a", "p1")]


def test_exit_code_fails_only_on_fail() -> None:
    assert (
        exit_code([Row(check="x", status="warn", found="", fix="f"), Row(check="y", status="skip", found="")])
        == 0
    )
    assert (
        exit_code([Row(check="x", status="ok", found=""), Row(check="y", status="fail", found="", fix="f")])
        == 1
    )


class _Deployments:
    """A Reads stand-in holding a list of Deployments (deployment_images only lists them)."""

    def __init__(self, *items: tuple[str, str, list[str]]) -> None:
        self.deployments = [
            {
                "metadata": {"namespace": "kyverno", "name": name},
                "spec": {"template": {"spec": {"containers": [{"image": image, "args": args}]}}},
            }
            for name, image, args in items
        ]

    async def items(self, version: str, url: str, namespace: str | None = None) -> list[dict]:
        assert (version, url) == ("apps/v1", "deployments")
        return self.deployments


def test_crd_watcher_row_reads_the_helm_charts_controllers() -> None:
    import asyncio

    watching = ["--crdWatcher=true"]
    admission = ("kyverno-admission-controller", "reg.kyverno.io/kyverno/kyverno:v1.19.1", watching)
    cleanup = ("kyverno-cleanup-controller", "reg.kyverno.io/kyverno/cleanup-controller:v1.19.1", [])
    background = ("kyverno-background-controller", "reg.kyverno.io/kyverno/background-controller:v1.19.1", [])
    row = asyncio.run(cc.check_kyverno_crd_watcher(_Deployments(admission, cleanup, background)))
    assert row.status == "fail" and "kyverno/kyverno-background-controller" in row.found
    assert "cleanup" not in row.found
    fixed = (background[0], background[1], watching)
    assert asyncio.run(cc.check_kyverno_crd_watcher(_Deployments(admission, cleanup, fixed))).status == "ok"
    assert asyncio.run(cc.check_kyverno_crd_watcher(_Deployments())).status == "warn"


def test_kueue_version_from_the_image_tag() -> None:
    import asyncio

    def dep(image: str) -> _Deployments:
        return _Deployments(("kueue-controller-manager", image, []))

    assert (
        asyncio.run(cc.check_kueue_version(dep("registry.k8s.io/kueue/kueue:v0.19.2"), None)).status == "ok"
    )
    old = asyncio.run(cc.check_kueue_version(dep("registry.k8s.io/kueue/kueue:v0.14.1"), None))
    assert old.status == "fail" and "v0.14.1" in old.found
    assert asyncio.run(cc.check_kueue_version(_Deployments(), "v0.18.3")).status == "ok"
    assert asyncio.run(cc.check_kueue_version(_Deployments(), None)).status == "warn"


def test_a_refused_read_fails_its_row_and_a_bug_is_raised() -> None:
    import httpx
    import pytest

    from ghostgpu.doctor.command import _failed

    request = httpx.Request("GET", "https://127.0.0.1:6443/api/v1/namespaces")
    response = httpx.Response(403, json={"message": 'cannot list resource "namespaces"'}, request=request)
    row = _failed("namespaces: opted in", httpx.HTTPStatusError("403", request=request, response=response))
    assert (
        row.status == "fail"
        and "403 Forbidden to list namespaces" in row.found
        and row.fix.startswith("grant")
    )
    with pytest.raises(RuntimeError):
        _failed("x", RuntimeError("a bug"))


class _DaemonSetReads:
    def __init__(self, live: dict[str, Any] | None) -> None:
        self.live = live
        self.asked: list[tuple[str, str, str | None]] = []

    async def get(self, version: str, url: str, namespace: str | None = None) -> dict[str, Any] | None:
        self.asked.append((version, url, namespace))
        return self.live


async def test_agent_row_checks_the_daemonset_in_agent_mode_and_skips_with_exec() -> None:
    cfg = load_default_config()  # processSource: agent
    exec_mode = cfg.model_copy(
        update={"controller": cfg.controller.model_copy(update={"process_source": "exec"})}
    )
    assert (await cc.check_agent(_DaemonSetReads(None), exec_mode)).status == "skip"  # type: ignore[arg-type]
    reads = _DaemonSetReads(None)
    row = await cc.check_agent(reads, cfg)  # type: ignore[arg-type]
    assert row.status == "fail" and "does not exist" in row.found
    assert reads.asked == [("apps/v1", "daemonsets/ghostgpu-agent", "ghostgpu-agent")]
    for status, want, words in (
        ({"desiredNumberScheduled": 0, "numberReady": 0}, "fail", "scheduled on no node"),
        ({"desiredNumberScheduled": 4, "numberReady": 3}, "fail", "3/4 agent pods ready"),
        ({"desiredNumberScheduled": 4, "numberReady": 4}, "ok", "4/4 agent pods ready"),
    ):
        row = await cc.check_agent(_DaemonSetReads({"status": status}), cfg)  # type: ignore[arg-type]
        assert row.status == want and words in row.found, row
