"""Every object of the three rendered bundles (policies/, kueue/, controller/) is accepted by the
real apiserver with the real CRDs and admission webhooks (Kueue's and Kyverno's, which validates
policies), by server-side apply as ArgoCD does it."""

from __future__ import annotations

from typing import Any

import pytest

from ghostgpu.devcluster import DevCluster
from ghostgpu.devcluster.bundles import BUNDLES, FIELD_MANAGER, apply_bundles, bundle_docs

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.mark.parametrize("bundle", BUNDLES)
@pytest.mark.kueue
def test_every_rendered_object_is_accepted_by_server_side_apply(
    devcluster: DevCluster, applied_bundles: dict[str, list[str]], bundle: str
) -> None:
    assert applied_bundles[bundle] == [], "\n".join(applied_bundles[bundle])
    for doc in bundle_docs(bundle):
        meta = doc["metadata"]
        live = devcluster.kube.get(doc["apiVersion"], doc["kind"], meta["name"], meta.get("namespace"))
        assert live is not None, f"{doc['kind']}/{meta['name']} not found after apply"
        managers = {m.manager for m in live.metadata.managedFields or []}
        assert FIELD_MANAGER in managers


def _versions(dc: DevCluster, docs: list[dict[str, Any]]) -> dict[tuple[str, str, str], str]:
    # generation moves only on spec changes (controllers may write status); objects without a
    # generation (ConfigMaps, RBAC) have no status writers, so their resourceVersion is the signal.
    out = {}
    for d in docs:
        m = d["metadata"]
        live = dc.kube.get(d["apiVersion"], d["kind"], m["name"], m.get("namespace"))
        gen = live.metadata.generation
        out[(d["kind"], m.get("namespace", ""), m["name"])] = str(
            gen if gen is not None else live.metadata.resourceVersion
        )
    return out


@pytest.mark.kueue
def test_reapplying_the_bundles_changes_nothing(
    devcluster: DevCluster, applied_bundles: dict[str, list[str]]
) -> None:
    """GitOps steady state: a second sync of the same render is a no-op for every object."""
    docs = [d for b in BUNDLES for d in bundle_docs(b)]
    before = _versions(devcluster, docs)
    assert apply_bundles(devcluster.kube) == {b: [] for b in BUNDLES}
    after = _versions(devcluster, docs)
    assert {k: (v, after[k]) for k, v in before.items() if after[k] != v} == {}


@pytest.mark.kueue
def test_rendered_kueue_objects_become_active(
    devcluster: DevCluster, applied_bundles: dict[str, list[str]]
) -> None:
    """Kueue itself (not just the schema) accepts the flavors and queues: every ClusterQueue of the
    bundle reports Active, which needs its ResourceFlavors and Cohort to resolve."""
    import time

    cqs = [d["metadata"]["name"] for d in bundle_docs("kueue") if d["kind"] == "ClusterQueue"]
    assert cqs
    deadline = time.monotonic() + 60
    inactive: list[str] = cqs
    while inactive and time.monotonic() < deadline:
        inactive = []
        for name in cqs:
            cq = devcluster.kube.get("kueue.x-k8s.io/v1beta2", "ClusterQueue", name)
            conds = {c["type"]: c["status"] for c in (cq.to_dict().get("status") or {}).get("conditions", [])}
            if conds.get("Active") != "True":
                inactive.append(name)
        time.sleep(0.5)
    assert inactive == []


def test_kyverno_rejects_a_policy_with_a_cel_error(devcluster: DevCluster) -> None:
    """The acceptance above has teeth: Kyverno's policy webhook compiles the CEL of every policy."""
    from kubernetes.dynamic.exceptions import DynamicApiError

    bad = {
        "apiVersion": "policies.kyverno.io/v1",
        "kind": "MutatingPolicy",
        "metadata": {"name": "ghostgpu-broken-cel"},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "mutations": [
                {
                    "patchType": "ApplyConfiguration",
                    "applyConfiguration": {
                        "expression": "Object{metadata: Object.metadata{labels: {'a': nope}}}"
                    },
                }
            ],
        },
    }
    with pytest.raises(DynamicApiError) as err:
        devcluster.kube.apply(bad)
    assert err.value.status == 400
    assert devcluster.kube.get("policies.kyverno.io/v1", "MutatingPolicy", "ghostgpu-broken-cel") is None
