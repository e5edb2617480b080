"""examples/argocd/applicationset.yaml against Argo CD's own CRDs (Application, ApplicationSet,
AppProject of hack/versions.env's ARGOCD_VERSION, installed by the devcluster): a server-side
dry run validates every field against the CRD schema and stores nothing. A misspelled or
mistyped field is refused, so the test can fail."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kubernetes.dynamic.exceptions import DynamicApiError

from ghostgpu.devcluster import DevCluster
from ghostgpu.devcluster.argocd import generated_applications, load_example

pytestmark = [pytest.mark.e2e]

ARGOCD_NS = "argocd"


@pytest.fixture(scope="module")
def argocd_namespace(devcluster: DevCluster) -> str:
    devcluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ARGOCD_NS}})
    return ARGOCD_NS


def _dry_run(devcluster: DevCluster, doc: dict[str, Any]) -> dict[str, Any]:
    return devcluster.kube.apply(doc, field_manager="argocd-example-test", dry_run=True).to_dict()


def _refusal(devcluster: DevCluster, doc: dict[str, Any]) -> str:
    with pytest.raises(DynamicApiError) as err:
        _dry_run(devcluster, doc)
    body = str(err.value.body)
    # A structural mismatch (unknown field, list vs string) fails building the typed apply patch,
    # which kube-apiserver reports as 500 "failed to create typed patch object"; a value the
    # OpenAPI validation refuses is a 422.
    assert err.value.status == 422 or "failed to create typed patch object" in body, body
    return body


def test_applicationset_validates_against_the_crd(devcluster: DevCluster, argocd_namespace: str) -> None:
    appset = load_example()
    out = _dry_run(devcluster, appset)
    # What the apiserver would store keeps the ordering: a pruned (unknown) field would vanish here.
    assert out["spec"]["strategy"] == appset["spec"]["strategy"]
    assert out["spec"]["template"]["metadata"]["labels"]["ghostgpu.io/bundle"] == "{{ .bundle }}"
    assert devcluster.kube.get("argoproj.io/v1alpha1", "ApplicationSet", "ghostgpu", argocd_namespace) is None


def test_generated_applications_and_their_project_validate(
    devcluster: DevCluster, argocd_namespace: str
) -> None:
    # Argo CD creates the `default` AppProject itself; the example's Applications name it.
    project = {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "AppProject",
        "metadata": {"name": "default", "namespace": argocd_namespace},
        "spec": {
            "sourceRepos": ["*"],
            "destinations": [{"server": "*", "namespace": "*"}],
            "clusterResourceWhitelist": [{"group": "*", "kind": "*"}],
        },
    }
    _dry_run(devcluster, project)
    for app in generated_applications(load_example()):
        out = _dry_run(devcluster, app)
        assert out["spec"]["syncPolicy"] == app["spec"]["syncPolicy"]
        assert out["metadata"]["labels"]["ghostgpu.io/bundle"] == app["spec"]["source"]["path"]


def test_a_misspelled_field_is_refused(devcluster: DevCluster, argocd_namespace: str) -> None:
    appset = load_example()
    broken = copy.deepcopy(appset)
    broken["spec"]["strategy"]["rollingSnyc"] = broken["spec"]["strategy"].pop("rollingSync")
    body = _refusal(devcluster, broken)
    assert ".spec.strategy.rollingSnyc: field not declared in schema" in body, body


def test_a_mistyped_field_is_refused(devcluster: DevCluster, argocd_namespace: str) -> None:
    broken = load_example()
    broken["spec"]["strategy"]["rollingSync"]["steps"] = "kueue, policies, controller"
    body = _refusal(devcluster, broken)
    assert ".spec.strategy.rollingSync.steps: expected list" in body, body
    app = generated_applications(load_example())[0]
    app["spec"]["syncPolicy"]["automated"]["prune"] = "yes"
    body = _refusal(devcluster, app)
    assert ".spec.syncPolicy.automated.prune: expected boolean" in body, body
