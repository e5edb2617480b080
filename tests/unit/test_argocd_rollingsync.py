"""examples/argocd/applicationset.yaml orders the bundles the way Argo CD actually orders the
Applications of one ApplicationSet: RollingSync steps, not sync-wave annotations. The schema side
(the apiserver with Argo CD's CRDs) is tests/e2e/test_argocd_example.py."""

from __future__ import annotations

import copy

import pytest

from ghostgpu.devcluster.argocd import generated_applications, load_example, rolling_sync_steps
from ghostgpu.devcluster.bundles import BUNDLES
from ghostgpu.devcluster.paths import REPO_ROOT


def test_rolling_sync_steps_select_kueue_then_policies_then_controller() -> None:
    appset = load_example()
    assert appset["spec"]["strategy"]["type"] == "RollingSync"
    apps = generated_applications(appset)
    by_bundle = {a["metadata"]["labels"]["ghostgpu.io/bundle"]: a["metadata"]["name"] for a in apps}
    steps = rolling_sync_steps(appset, apps)
    # One Application per step, each selected once, in the order the bundles depend on each other.
    assert (
        steps
        == [[by_bundle[b]] for b in BUNDLES]
        == [["ghostgpu-kueue"], ["ghostgpu-policies"], ["ghostgpu-controller"]]
    )
    assert appset["spec"]["strategy"]["deletionOrder"] == "Reverse"


def test_generated_applications_point_at_the_rendered_bundles() -> None:
    for app in generated_applications(load_example()):
        path = app["spec"]["source"]["path"]
        assert (REPO_ROOT / path / "kustomization.yaml").is_file(), path
        assert app["metadata"]["namespace"] == "argocd"


def test_no_sync_wave_annotations_left_to_mislead() -> None:
    # Argo CD ignores them between generated Applications (argoproj/argo-cd#18268).
    text = (REPO_ROOT / "examples" / "argocd" / "applicationset.yaml").read_text()
    assert "argocd.argoproj.io/sync-wave:" not in text
    for app in generated_applications(load_example()):
        assert "argocd.argoproj.io/sync-wave" not in (app["metadata"].get("annotations") or {})


def test_prune_survives_rolling_sync() -> None:
    # RollingSync disables automated sync on the Applications but takes `prune` for its own
    # syncs from automated.prune (applicationset/progressivesync, v3.5): dropping the block
    # would silently stop pruning.
    policy = load_example()["spec"]["template"]["spec"]["syncPolicy"]
    assert policy["automated"]["prune"] is True
    assert policy["automated"].get("enabled", True) is True


def test_step_matching_follows_argo_cd() -> None:
    appset = load_example()
    apps = generated_applications(appset)
    broken = copy.deepcopy(appset)
    # A label typo: no step selects the controller, so Argo CD would never sync it.
    broken["spec"]["strategy"]["rollingSync"]["steps"][2]["matchExpressions"][0]["values"] = ["controler"]
    assert rolling_sync_steps(broken, apps)[2] == []
    # NotIn selects Applications without the label key too; two steps may select one Application.
    broken["spec"]["strategy"]["rollingSync"]["steps"][2]["matchExpressions"] = [
        {"key": "ghostgpu.io/bundle", "operator": "NotIn", "values": ["kueue"]}
    ]
    assert rolling_sync_steps(broken, apps)[2] == ["ghostgpu-policies", "ghostgpu-controller"]
    broken["spec"]["strategy"]["rollingSync"]["steps"][2]["matchExpressions"][0]["operator"] = "Exists"
    with pytest.raises(ValueError, match="In and NotIn"):
        rolling_sync_steps(broken, apps)


def test_missing_template_key_is_an_error() -> None:
    appset = load_example()
    del appset["spec"]["generators"][0]["list"]["elements"][0]["namespace"]
    with pytest.raises(KeyError, match=r"\.namespace"):
        generated_applications(appset)
