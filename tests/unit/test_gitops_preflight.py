"""The GitOps pre-flight's pure parts (gitops.py): markers, JSON pointer cover, and whether an Argo
CD Application, a Flux Kustomization or a HelmRelease would put a stop back; the reader-facing part
with a scripted reader (fail safe on errors, lookup of the Application, caching of blocks)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from ghostgpu.controller.act.gitops import GitOpsPreflight
from ghostgpu.controller.act.gitops_rules import (
    ARGOCD_TRACKING_ID,
    RESPECT_IGNORE,
    ManagerKind,
    ManagerRef,
    Outcome,
    ResourceId,
    Target,
    argocd_preflight,
    covers,
    helmrelease_preflight,
    jq_pointer,
    kustomization_preflight,
    managers_of,
    parse_tracking_id,
)

WRITES = ("/spec/replicas",)
FM = "ghostgpu-controller"


def deployment(name: str = "train", ns: str = "team-a", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, **meta},
        "spec": {"replicas": 2},
    }


def app(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "gpu", "namespace": "argocd"}, "spec": spec}


SELF_HEAL = {"automated": {"selfHeal": True, "prune": True}}
APP_REF = ManagerRef(ManagerKind.APPLICATION, None, "gpu", ARGOCD_TRACKING_ID)
TARGET = Target("apps", "Deployment", "team-a", "train")


# --- markers ------------------------------------------------------------------------------------


def test_tracking_id_parses_the_documented_format() -> None:
    tid = parse_tracking_id("gpu:apps/Deployment:team-a/train")
    assert tid is not None and (tid.app_namespace, tid.app, tid.target) == (None, "gpu", TARGET)
    core = parse_tracking_id("team-x_gpu:/Service:team-a/svc")
    assert core is not None and (core.app_namespace, core.app) == ("team-x", "gpu")
    assert core.target == Target("", "Service", "team-a", "svc")
    for bad in ("gpu", "gpu:apps/Deployment", ":apps/Deployment:a/b", "gpu:Deployment:a/b", "gpu:apps/:a/b"):
        assert parse_tracking_id(bad) is None, bad


def test_markers_name_every_manager_and_ignore_a_copied_tracking_id() -> None:
    obj = deployment(
        annotations={ARGOCD_TRACKING_ID: "gpu:apps/Deployment:team-a/train"},
        labels={
            "app.kubernetes.io/instance": "gpu",  # ignored: the tracking id says it all
            "kustomize.toolkit.fluxcd.io/name": "apps",
            "kustomize.toolkit.fluxcd.io/namespace": "flux-system",
            "helm.toolkit.fluxcd.io/name": "trainer",
        },
    )
    refs = managers_of(obj)
    assert [(r.kind, r.namespace, r.name, r.confirmed) for r in refs] == [
        (ManagerKind.APPLICATION, None, "gpu", True),
        (ManagerKind.KUSTOMIZATION, "flux-system", "apps", True),
        (ManagerKind.HELMRELEASE, "team-a", "trainer", True),  # namespace label absent: its own
    ]
    copied = deployment(annotations={ARGOCD_TRACKING_ID: "gpu:apps/Deployment:team-a/other"})
    assert managers_of(copied) == []
    label_only = deployment(labels={"app.kubernetes.io/instance": "gpu"})
    assert [(r.kind, r.confirmed) for r in managers_of(label_only)] == [(ManagerKind.APPLICATION, False)]


# --- JSON pointers --------------------------------------------------------------------------------

TOKEN = st.text(alphabet=st.characters(codec="ascii", exclude_characters="\x00"), max_size=6)


def pointer(tokens: list[str]) -> str:
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


@given(st.lists(TOKEN, max_size=4), st.lists(TOKEN, max_size=3))
def test_a_pointer_covers_exactly_the_paths_inside_it(prefix: list[str], rest: list[str]) -> None:
    assert covers(pointer(prefix), pointer(prefix + rest))
    if rest:
        assert not covers(pointer(prefix + rest), pointer(prefix))


@given(st.lists(TOKEN, min_size=1, max_size=4), TOKEN)
def test_a_sibling_sharing_a_string_prefix_is_not_covered(tokens: list[str], extra: str) -> None:
    if not extra:
        return
    longer = [*tokens[:-1], tokens[-1] + extra]
    assert not covers(pointer(tokens), pointer(longer))


def test_pointer_edge_cases() -> None:
    assert covers("/spec", "/spec/replicas") and covers("", "/spec/replicas")
    assert not covers("/spec/replica", "/spec/replicas")
    assert not covers("spec/replicas", "/spec/replicas")  # not a pointer: never cover
    assert covers("/metadata/annotations/a~1b", "/metadata/annotations/a~1b")
    assert jq_pointer(".spec.replicas") == "/spec/replicas"
    assert jq_pointer('.metadata.annotations["a/b"]') == "/metadata/annotations/a~1b"
    assert jq_pointer('.spec.template.spec.containers[] | select(.name == "x")') is None
    assert jq_pointer("") is None


# --- Argo CD --------------------------------------------------------------------------------------


def test_self_heal_without_ignore_differences_reverts_and_the_fix_is_exact() -> None:
    pre = argocd_preflight(app(syncPolicy=SELF_HEAL), TARGET, WRITES, field_manager=FM, ref=APP_REF)
    assert pre.outcome is Outcome.REVERTS and pre.blocks
    assert "/spec/replicas" in pre.reason and RESPECT_IGNORE in pre.reason
    fix = yaml.safe_load(pre.fix)
    assert fix == {
        "spec": {
            "ignoreDifferences": [
                {
                    "group": "apps",
                    "kind": "Deployment",
                    "name": "train",
                    "namespace": "team-a",
                    "jsonPointers": ["/spec/replicas"],
                }
            ],
            "syncPolicy": {"syncOptions": [RESPECT_IGNORE]},
        }
    }
    # The fix, merged into the Application, clears it.
    fixed = app(
        syncPolicy={
            **SELF_HEAL,
            "syncOptions": ["ServerSideApply=true", *fix["spec"]["syncPolicy"]["syncOptions"]],
        },
        ignoreDifferences=fix["spec"]["ignoreDifferences"],
    )
    assert argocd_preflight(fixed, TARGET, WRITES, field_manager=FM, ref=APP_REF).outcome is Outcome.CLEAR


DEP = {"group": "apps", "kind": "Deployment"}
REPLICAS = {"jsonPointers": ["/spec/replicas"]}


@pytest.mark.parametrize(
    ("rule", "respect", "outcome"),
    [
        ({**DEP, **REPLICAS}, True, Outcome.CLEAR),
        ({**DEP, **REPLICAS}, False, Outcome.REVERTS),
        ({**DEP, "jsonPointers": ["/spec"]}, True, Outcome.CLEAR),
        ({"group": "*", "kind": "*", **REPLICAS}, True, Outcome.CLEAR),
        ({"group": "apps", "kind": "StatefulSet", **REPLICAS}, True, Outcome.REVERTS),
        ({"group": "", "kind": "Deployment", **REPLICAS}, True, Outcome.REVERTS),
        ({**DEP, "name": "other", **REPLICAS}, True, Outcome.REVERTS),
        ({**DEP, "namespace": "team-a", **REPLICAS}, True, Outcome.CLEAR),
        ({**DEP, "jqPathExpressions": [".spec.replicas"]}, True, Outcome.CLEAR),
        ({**DEP, "managedFieldsManagers": [FM]}, True, Outcome.CLEAR),
        ({**DEP, "managedFieldsManagers": ["kube-controller-manager"]}, True, Outcome.REVERTS),
        ({**DEP, "jsonPointers": ["/spec/template"]}, True, Outcome.REVERTS),
    ],
)
def test_ignore_differences_must_match_the_object_and_cover_the_write(
    rule: dict[str, Any], respect: bool, outcome: Outcome
) -> None:
    policy = {**SELF_HEAL, "syncOptions": [RESPECT_IGNORE] if respect else []}
    pre = argocd_preflight(
        app(syncPolicy=policy, ignoreDifferences=[rule]), TARGET, WRITES, field_manager=FM, ref=APP_REF
    )
    assert pre.outcome is outcome, pre.reason


def test_applications_that_do_not_self_heal_keep_the_stop() -> None:
    for policy in (
        {},
        {"automated": {"selfHeal": False}},
        {"automated": {"enabled": False, "selfHeal": True}},
    ):
        pre = argocd_preflight(app(syncPolicy=policy), TARGET, WRITES, field_manager=FM, ref=APP_REF)
        assert pre.outcome is Outcome.CLEAR, policy


def test_every_written_pointer_must_be_covered() -> None:
    writes = ("/spec/suspend", "/metadata/annotations/kubeflow-resource-stopped")
    rule = {"group": "apps", "kind": "Deployment", "jsonPointers": ["/spec/suspend"]}
    policy = {**SELF_HEAL, "syncOptions": [RESPECT_IGNORE]}
    pre = argocd_preflight(
        app(syncPolicy=policy, ignoreDifferences=[rule]), TARGET, writes, field_manager=FM, ref=APP_REF
    )
    assert pre.outcome is Outcome.REVERTS
    # Only what is missing is proposed; syncOptions already right.
    assert yaml.safe_load(pre.fix)["spec"] == {
        "ignoreDifferences": [
            {
                "group": "apps",
                "kind": "Deployment",
                "name": "train",
                "namespace": "team-a",
                "jsonPointers": ["/metadata/annotations/kubeflow-resource-stopped"],
            }
        ]
    }


# --- Flux -----------------------------------------------------------------------------------------

KS_REF = ManagerRef(ManagerKind.KUSTOMIZATION, "flux-system", "apps", "kustomize.toolkit.fluxcd.io/name")


def ks(**spec: Any) -> dict[str, Any]:
    return {
        "spec": {
            "interval": "10m",
            "prune": True,
            "sourceRef": {"kind": "GitRepository", "name": "r"},
            **spec,
        }
    }


def test_a_kustomization_reverts_unless_suspended_ignored_or_opted_out() -> None:
    obj = deployment(labels={"team": "a"})
    pre = kustomization_preflight(ks(), obj, WRITES, ref=KS_REF)
    assert pre.outcome is Outcome.REVERTS
    fix = yaml.safe_load(pre.fix)
    assert fix == {
        "spec": {
            "ignore": [
                {
                    "paths": ["/spec/replicas"],
                    "target": {"group": "apps", "kind": "Deployment", "name": "train", "namespace": "team-a"},
                }
            ]
        }
    }
    assert kustomization_preflight(ks(**fix["spec"]), obj, WRITES, ref=KS_REF).outcome is Outcome.CLEAR
    assert kustomization_preflight(ks(suspend=True), obj, WRITES, ref=KS_REF).outcome is Outcome.CLEAR
    for ann in (
        {"kustomize.toolkit.fluxcd.io/ssa": "IfNotPresent"},
        {"kustomize.toolkit.fluxcd.io/reconcile": "disabled"},
    ):
        opted = deployment(annotations=ann)
        assert kustomization_preflight(ks(), opted, WRITES, ref=KS_REF).outcome is Outcome.CLEAR, ann
    merge = deployment(annotations={"kustomize.toolkit.fluxcd.io/ssa": "Merge"})
    pre = kustomization_preflight(ks(), merge, WRITES, ref=KS_REF)
    assert pre.outcome is Outcome.REVERTS
    assert "would put /spec/replicas back: no spec.ignore rule for " in pre.reason, pre.reason


@pytest.mark.parametrize(
    ("target", "matches"),
    [
        (None, True),
        ({"kind": "Deployment"}, True),
        ({"kind": "Deploy"}, False),  # anchored
        ({"kind": "Deploy.*", "name": "tr.*"}, True),
        ({"group": "apps", "version": "v1", "namespace": "team-a"}, True),
        ({"namespace": "team-b"}, False),
        ({"labelSelector": "team=a"}, True),
        ({"labelSelector": "team!=a"}, False),
        ({"labelSelector": "team in (a,b)"}, False),  # not read: never a match
        ({"annotationSelector": "x"}, False),
        ({"name": "("}, False),  # invalid regex
    ],
)
def test_flux_ignore_targets(target: dict[str, Any] | None, matches: bool) -> None:
    rule: dict[str, Any] = {"paths": ["/spec/replicas"]}
    if target is not None:
        rule["target"] = target
    pre = kustomization_preflight(ks(ignore=[rule]), deployment(labels={"team": "a"}), WRITES, ref=KS_REF)
    assert (pre.outcome is Outcome.CLEAR) is matches


def test_a_helmrelease_reverts_only_with_drift_detection_enabled() -> None:
    ref = ManagerRef(ManagerKind.HELMRELEASE, "team-a", "trainer", "helm.toolkit.fluxcd.io/name")
    obj = deployment()
    assert helmrelease_preflight({"spec": {}}, obj, WRITES, ref=ref).outcome is Outcome.CLEAR
    assert (
        helmrelease_preflight({"spec": {"driftDetection": {"mode": "warn"}}}, obj, WRITES, ref=ref).outcome
        is Outcome.CLEAR
    )
    enabled = {"spec": {"driftDetection": {"mode": "enabled"}}}
    pre = helmrelease_preflight(enabled, obj, WRITES, ref=ref)
    assert pre.outcome is Outcome.REVERTS
    assert (
        "corrects drift and would put /spec/replicas back: no driftDetection.ignore rule for " in pre.reason
    )
    fix = yaml.safe_load(pre.fix)["spec"]["driftDetection"]
    fixed = {"spec": {"driftDetection": {"mode": "enabled", **fix}}}
    assert helmrelease_preflight(fixed, obj, WRITES, ref=ref).outcome is Outcome.CLEAR


# --- reading the manager --------------------------------------------------------------------------


class Reader:
    def __init__(
        self, objects: dict[tuple[str, str, str], dict[str, Any]], error: Exception | None = None
    ) -> None:
        self.objects, self.error, self.calls = objects, error, 0
        self.hang = False

    async def get(self, rid: ResourceId, namespace: str, name: str) -> dict[str, Any] | None:
        self.calls += 1
        if self.hang:
            await asyncio.sleep(10)
        if self.error:
            raise self.error
        return self.objects.get((rid.plural, namespace, name))

    async def find(self, rid: ResourceId, name: str) -> list[dict[str, Any]]:
        return [o for (p, _, n), o in sorted(self.objects.items()) if p == rid.plural and n == name]


TRACKED = deployment(annotations={ARGOCD_TRACKING_ID: "gpu:apps/Deployment:team-a/train"})


async def test_unreadable_application_is_unknown_and_blocks() -> None:
    for reader in (Reader({}, PermissionError("403 Forbidden")), Reader({})):
        if not reader.error:
            reader.hang = True
        pre = await GitOpsPreflight(reader, timeout=0.05).check(TRACKED, WRITES)
        assert pre.outcome is Outcome.UNKNOWN and pre.blocks, pre
        assert "cannot be read" in pre.reason


async def test_application_lookup_and_block_cache() -> None:
    now = [0.0]
    bad = app(syncPolicy=SELF_HEAL)
    reader = Reader({("applications", "gitops", "gpu"): bad})  # not in `argocd`: found by name
    pf = GitOpsPreflight(reader, cache_seconds=60, clock=lambda: now[0])
    assert (await pf.check(TRACKED, WRITES)).outcome is Outcome.REVERTS
    calls = reader.calls
    assert (await pf.check(TRACKED, WRITES)).outcome is Outcome.REVERTS
    assert reader.calls == calls  # cached block: no read
    reader.objects[("applications", "gitops", "gpu")] = app(
        syncPolicy={**SELF_HEAL, "syncOptions": [RESPECT_IGNORE]},
        ignoreDifferences=[{"group": "apps", "kind": "Deployment", "jsonPointers": ["/spec/replicas"]}],
    )
    now[0] = 61.0
    assert (await pf.check(TRACKED, WRITES)).outcome is Outcome.CLEAR
    # Two Applications of one unprefixed name outside `argocd`: not guessed between.
    reader.objects[("applications", "other", "gpu")] = bad
    now[0] = 200.0
    assert (await pf.check(TRACKED, WRITES)).outcome is Outcome.UNKNOWN


async def test_no_marker_or_a_helm_label_is_clear() -> None:
    for orphans in ("escalate", "stale"):
        pf = GitOpsPreflight(Reader({}), orphan_markers=orphans)
        assert (await pf.check(deployment(), WRITES)).outcome is Outcome.CLEAR
        helm = deployment(labels={"app.kubernetes.io/instance": "gpu"})  # Helm's label, no Application
        pre = await pf.check(helm, WRITES)
        assert pre.outcome is Outcome.CLEAR and "Helm" in pre.reason


async def test_a_tracking_id_without_its_application_here_escalates_with_the_fix() -> None:
    """A hub Argo CD keeps its Applications in the hub: the marker is there, the Application is not."""
    reader = Reader({})
    pf = GitOpsPreflight(reader)  # the default: escalate
    pre = await pf.check(TRACKED, WRITES)
    assert pre.outcome is Outcome.UNSEEN and pre.blocks, pre
    assert pre.manager == APP_REF
    assert "this cluster has no Application argocd/gpu (nor an Application gpu in another namespace)" in (
        pre.reason
    )
    assert "hub Argo CD" in pre.reason and "self-heal would put /spec/replicas back" in pre.reason
    assert "make the Application readable here" in pre.reason
    assert pre.reason.count("controller.gitops.orphanMarkers: stale") == 2
    # The entry is the one that makes the hub's Application keep the stop.
    fix = yaml.safe_load(pre.fix)["spec"]
    assert fix["syncPolicy"] == {"syncOptions": [RESPECT_IGNORE]}
    fixed = app(syncPolicy={**SELF_HEAL, **fix["syncPolicy"]}, ignoreDifferences=fix["ignoreDifferences"])
    assert argocd_preflight(fixed, TARGET, WRITES, field_manager=FM, ref=APP_REF).outcome is Outcome.CLEAR
    # A prefixed app name is looked up in its namespace only.
    prefixed = deployment(annotations={ARGOCD_TRACKING_ID: "team-x_gpu:apps/Deployment:team-a/train"})
    pre = await pf.check(prefixed, WRITES)
    assert pre.outcome is Outcome.UNSEEN and "this cluster has no Application team-x/gpu:" in pre.reason
    # Blocked like the other blocking answers: cached, not read again every poll.
    calls = reader.calls
    assert (await pf.check(TRACKED, WRITES)).outcome is Outcome.UNSEEN
    assert reader.calls == calls


async def test_orphan_markers_stale_reclaims_what_has_no_manager_here() -> None:
    pf = GitOpsPreflight(Reader({}), orphan_markers="stale")
    pre = await pf.check(TRACKED, WRITES)
    assert pre.outcome is Outcome.CLEAR and "does not exist" in pre.reason, pre
    # Only the missing manager changes: an Application that is here is still read and obeyed.
    pf = GitOpsPreflight(Reader({("applications", "argocd", "gpu"): app(syncPolicy=SELF_HEAL)}),
                         orphan_markers="stale")  # fmt: skip
    assert (await pf.check(TRACKED, WRITES)).outcome is Outcome.REVERTS
    with pytest.raises(ValueError, match="escalate or stale"):
        GitOpsPreflight(Reader({}), orphan_markers="ignore")  # type: ignore[arg-type]


async def test_flux_markers_without_their_object_here_escalate_too() -> None:
    """A Kustomization or HelmRelease with spec.kubeConfig applies to another cluster: its labels
    land on objects in a cluster that has no such Kustomization."""
    ks = deployment(
        labels={
            "kustomize.toolkit.fluxcd.io/name": "apps",
            "kustomize.toolkit.fluxcd.io/namespace": "flux-system",
        }
    )
    hr = deployment(labels={"helm.toolkit.fluxcd.io/name": "trainer"})
    pre = await GitOpsPreflight(Reader({})).check(ks, WRITES)
    assert pre.outcome is Outcome.UNSEEN and "no Kustomization flux-system/apps" in pre.reason
    assert "spec.kubeConfig" in pre.reason
    fix = yaml.safe_load(pre.fix)["spec"]
    fixed = {"spec": {"interval": "1m", **fix}}
    ref = ManagerRef(ManagerKind.KUSTOMIZATION, "flux-system", "apps", "kustomize.toolkit.fluxcd.io/name")
    assert kustomization_preflight(fixed, ks, WRITES, ref=ref).outcome is Outcome.CLEAR
    pre = await GitOpsPreflight(Reader({})).check(hr, WRITES)
    assert pre.outcome is Outcome.UNSEEN and "no HelmRelease team-a/trainer" in pre.reason
    assert "driftDetection" in pre.fix
    for obj in (ks, hr):
        assert (await GitOpsPreflight(Reader({}), orphan_markers="stale").check(obj, WRITES)).outcome is (
            Outcome.CLEAR
        )


def test_the_argocd_example_for_gpu_workloads_keeps_every_stop() -> None:
    """examples/argocd/gpu-workloads.yaml carries the fix for what ghostgpu writes."""
    from pathlib import Path

    from ghostgpu.controller.act.stopspec import SCALE_TO_ZERO

    example = yaml.safe_load(
        (Path(__file__).resolve().parents[2] / "examples" / "argocd" / "gpu-workloads.yaml").read_text()
    )
    ref = ManagerRef(ManagerKind.APPLICATION, None, example["metadata"]["name"], ARGOCD_TRACKING_ID)
    for kind in ("Deployment", "StatefulSet"):
        target = Target("apps", kind, "team-a", "any")
        pre = argocd_preflight(example, target, SCALE_TO_ZERO.writes, field_manager=FM, ref=ref)
        assert pre.outcome is Outcome.CLEAR, pre.reason
    # And it is the fix: without it, the same Application reverts.
    bare = {**example, "spec": {k: v for k, v in example["spec"].items() if k != "ignoreDifferences"}}
    target = Target("apps", "Deployment", "team-a", "any")
    assert argocd_preflight(bare, target, SCALE_TO_ZERO.writes, field_manager=FM, ref=ref).blocks
