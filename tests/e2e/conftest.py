"""Fixtures for end-to-end tests against the local devcluster (ghostgpu.devcluster).

One cluster serves the whole session. If `GHOSTGPU_DEVCLUSTER_STATE` names the state directory of a
cluster that `ghostgpu devcluster up` already started, the tests use it and leave it running;
otherwise the session starts its own cluster in a temporary directory and stops it at the end.
Tests are skipped (with the reason) only when hack/testbin has not built the binaries; hack/test
runs hack/testbin first, so CI never skips. The cluster runs Kueue KUEUE_VERSION, or
$GHOSTGPU_KUEUE_VERSION (hack/test's second pass of the tests marked `kueue`, once per
KUEUE_EXTRA_VERSIONS release); `devcluster.state.kueue_version` says which.

Fixtures other parts use:
  devcluster      DevCluster: .kubeconfig, .state.prometheus_url, .process_tables, .dcgm, .kube,
                  .state.real_node (the real node's name, or None and .state.real_node_error:
                  tests/e2e/test_real_node.py fails with that reason, never skips)
  kubeconfig      Path of the admin kubeconfig
  namespace       a fresh namespace per test (deleted afterwards); `make_namespace(labels)` for more
  process_tables  ProcessTables: .set(ns, pod, [ProcessRow(...)]) scripts what `ps` prints in a pod
  dcgm            FakeDcgmClient: .set(ns, pod, util=..., fb_used_mib=..., xid=...); cleared per test
  prometheus_url  base URL of the real Prometheus that scrapes the fake dcgm-exporter every second
  applied_bundles the three rendered bundles server-side applied once per session ({bundle: errors})
"""

from __future__ import annotations

import os
import time
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kubernetes import client

from ghostgpu.devcluster import DevCluster, FakeDcgmClient, ProcessTables
from ghostgpu.devcluster.bundles import apply_bundles
from ghostgpu.devcluster.paths import Toolchain

# A module whose traces outlive it in its worker's devcluster runs after the module they would upset,
# in that module's worker: the forged series stay in Prometheus for its 5-minute lookback and the
# out-of-order samples they caused in doctor's 10-minute window, which would fail doctor's
# all-ok test on the same cluster.
AFTER = {"tests/e2e/test_forged_series.py": "tests/e2e/test_doctor.py"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (hack/test runs `--dist loadgroup`), a module whose tests share a fixture it
    defines at module or session scope (a KubeRay operator, a Kueue restarted with other settings,
    the controller image) runs in one worker, so that fixture is set up once; every other e2e test
    goes to whichever worker is free. Each worker has a devcluster of its own."""
    here = Path(__file__).parent
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if here not in Path(item.path).parents:
            continue
        if module in AFTER:  # in the group of the module it must follow, which collection runs first
            item.add_marker(pytest.mark.xdist_group(AFTER[module]))
            continue
        defs = getattr(item, "_fixtureinfo", None)
        shared = defs is not None and any(
            d.scope in ("module", "session") and d.baseid == module
            for fixturedefs in defs.name2fixturedefs.values()
            for d in fixturedefs
        )
        if shared:
            item.add_marker(pytest.mark.xdist_group(module))


def _skip_reason() -> str | None:
    try:
        missing = Toolchain.locate().missing()
    except FileNotFoundError as e:
        return str(e)
    if missing:
        return "devcluster binaries not built (run hack/testbin): " + ", ".join(missing)
    return None


@pytest.fixture(scope="session")
def devcluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    shared = os.environ.get("GHOSTGPU_DEVCLUSTER_STATE")
    if shared:
        if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
            # Tests assume a cluster of their own (leases, Kueue's configuration, GPU capacity).
            pytest.fail("GHOSTGPU_DEVCLUSTER_STATE shares one cluster: run it with `-n 0`, not in parallel")
        cluster = DevCluster.attach(Path(shared))
        if cluster is None:
            pytest.fail(f"GHOSTGPU_DEVCLUSTER_STATE={shared}: no running devcluster there")
        yield cluster
        return
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    cluster = DevCluster.up(tmp_path_factory.mktemp("devcluster"))
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture(scope="session")
def kubeconfig(devcluster: DevCluster) -> Path:
    return devcluster.kubeconfig


@pytest.fixture
def make_namespace(devcluster: DevCluster) -> Iterator[Callable[..., str]]:
    created: list[str] = []

    def make(labels: dict[str, str] | None = None, prefix: str = "t") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:8]}"
        devcluster.kube.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        )
        created.append(name)
        return name

    yield make
    core = client.CoreV1Api(devcluster.kube.api_client)
    for name in created:
        devcluster.kube.delete("v1", "Namespace", name)
        # The namespace controller acts 5 s after the delete; if pods are still there then, it waits
        # half their grace period (16 s) and looks again, often twice. A terminating namespace admits
        # no new pod, so removing its pods now (grace 0: a kwok pod has no kubelet to wait for, and
        # the real node's kubelet stops a removed pod's containers itself) lets the first pass
        # finish the namespace.
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    # Wait until they are gone: their pods hold kwok GPUs that the next test may need.
    deadline = time.monotonic() + 90
    while created and time.monotonic() < deadline:
        created = [n for n in created if devcluster.kube.get("v1", "Namespace", n) is not None]
        time.sleep(0.5)
    if created:  # not a failure of this test, but the likely cause of a later test's surprise
        warnings.warn(f"namespaces still terminating after 90 s: {created}", stacklevel=1)


@pytest.fixture
def namespace(make_namespace: Callable[..., str]) -> str:
    return make_namespace()


@pytest.fixture
def process_tables(devcluster: DevCluster) -> ProcessTables:
    return devcluster.process_tables


@pytest.fixture
def dcgm(devcluster: DevCluster) -> Iterator[FakeDcgmClient]:
    if "prometheus" not in devcluster.state.addons:
        pytest.skip("this devcluster runs without Prometheus and the fake dcgm-exporter")
    client = devcluster.dcgm
    client.clear()
    yield client
    client.clear()


@pytest.fixture
def prometheus_url(devcluster: DevCluster) -> str:
    return devcluster.state.prometheus_url


# ----- the rendered bundles (policies/, kueue/, controller/) -----
@pytest.fixture(scope="session")
def applied_bundles(devcluster: DevCluster) -> dict[str, list[str]]:
    """Every object of the three bundles, server-side applied once per session: {bundle: errors}."""
    try:
        errors = apply_bundles(devcluster.kube)
    except FileNotFoundError as e:
        pytest.fail(str(e))
    if not any(errors.values()):
        _wait_until_tracking_is_live(devcluster)
    return errors


def _wait_until_tracking_is_live(devcluster: DevCluster) -> None:
    """An applied policy is not yet an active one: Kyverno has to see it and (re)configure its
    webhook first. Probe with a dry-run GPU Deployment in an opted-in namespace until it comes back
    labelled, so the first test's create does not race that set-up."""
    from polling import eventually

    ns = f"bundle-probe-{uuid.uuid4().hex[:8]}"
    opted_in = {"name": ns, "labels": {"ghostgpu.io/reclaim": "enabled"}}
    devcluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": opted_in})
    gpu = {"limits": {"nvidia.com/gpu": "1"}}
    probe = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "probe"},
        "spec": {
            "selector": {"matchLabels": {"app": "probe"}},
            "template": {
                "metadata": {"labels": {"app": "probe"}},
                "spec": {"containers": [{"name": "main", "image": "busybox", "resources": gpu}]},
            },
        },
    }
    apps = client.AppsV1Api(devcluster.kube.api_client)
    try:
        eventually(
            lambda: (
                (apps.create_namespaced_deployment(ns, probe, dry_run="All").metadata.labels or {}).get(
                    "ghostgpu.io/tracked"
                )
                == "true"
            ),
            timeout=90,
            what="the tracking policy to label a GPU Deployment at admission",
        )
    finally:
        devcluster.kube.delete("v1", "Namespace", ns)
