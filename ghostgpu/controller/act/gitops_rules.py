"""The GitOps pre-flight's rules (gitops.py), pure: who manages an object, from its markers, and
whether that manager's spec (an Argo CD Application, a Flux Kustomization or HelmRelease) would
put back what a stop writes, with the exact change that makes it keep the stop. See gitops.py for
when each manager reverts."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

import yaml

ARGOCD_TRACKING_ID = "argocd.argoproj.io/tracking-id"
ARGOCD_INSTANCE_LABEL = "app.kubernetes.io/instance"
RESPECT_IGNORE = "RespectIgnoreDifferences=true"
FLUX_KS_NAME = "kustomize.toolkit.fluxcd.io/name"
FLUX_KS_NAMESPACE = "kustomize.toolkit.fluxcd.io/namespace"
FLUX_HR_NAME = "helm.toolkit.fluxcd.io/name"
FLUX_HR_NAMESPACE = "helm.toolkit.fluxcd.io/namespace"
FLUX_SSA = "kustomize.toolkit.fluxcd.io/ssa"
FLUX_RECONCILE = "kustomize.toolkit.fluxcd.io/reconcile"


class ManagerKind(StrEnum):
    APPLICATION = "Application"  # argoproj.io
    KUSTOMIZATION = "Kustomization"  # kustomize.toolkit.fluxcd.io
    HELMRELEASE = "HelmRelease"  # helm.toolkit.fluxcd.io


class ResourceId(NamedTuple):
    """Where a manager kind is served: (group/version, plural)."""

    version: str
    plural: str


RESOURCES: dict[ManagerKind, ResourceId] = {
    ManagerKind.APPLICATION: ResourceId("argoproj.io/v1alpha1", "applications"),
    ManagerKind.KUSTOMIZATION: ResourceId("kustomize.toolkit.fluxcd.io/v1", "kustomizations"),
    ManagerKind.HELMRELEASE: ResourceId("helm.toolkit.fluxcd.io/v2", "helmreleases"),
}


@dataclass(frozen=True, slots=True)
class Target:
    """The object a stop writes, as GitOps tools name it."""

    group: str  # "" for the core group
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> Target:
        api_version = str(obj.get("apiVersion") or "")
        meta = obj.get("metadata") or {}
        group = api_version.rpartition("/")[0]
        return cls(
            group, str(obj.get("kind") or ""), str(meta.get("namespace") or ""), str(meta.get("name") or "")
        )

    @property
    def short(self) -> str:
        return f"{self.group or 'core'}/{self.kind} {self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class ManagerRef:
    kind: ManagerKind
    namespace: str | None  # None: Argo CD's control-plane namespace (an unprefixed app name)
    name: str
    marker: str  # the marker that named it, for messages
    confirmed: bool = True  # False: Argo CD label tracking, a manager only if the Application exists

    def where(self, default_ns: str) -> str:
        return f"{self.kind.value} {self.namespace or default_ns}/{self.name}"


class Outcome(StrEnum):
    CLEAR = "clear"  # no manager, or none that would put the stop back
    REVERTS = "reverts"  # the manager would undo the stop: escalate with `fix`
    UNKNOWN = "unknown"  # the manager could not be read: fail safe, no action
    UNSEEN = "unseen"  # a marker names a manager this cluster does not have (a hub's): no action


@dataclass(frozen=True, slots=True)
class Preflight:
    outcome: Outcome
    reason: str
    manager: ManagerRef | None = None
    fix: str = ""  # YAML to merge into the manager object so that it keeps the stop

    @property
    def blocks(self) -> bool:
        return self.outcome is not Outcome.CLEAR


# --- markers ------------------------------------------------------------------------------------


class TrackingId(NamedTuple):
    app_namespace: str | None
    app: str
    target: Target


def parse_tracking_id(value: str) -> TrackingId | None:
    """`<app>:<group>/<kind>:<namespace>/<name>` (group empty for the core group; namespace empty
    for a cluster-scoped object); `<app>` may be `<namespace>_<name>`. None when malformed."""
    parts = value.split(":")
    if len(parts) != 3 or not parts[0]:
        return None
    app, gk, nn = parts
    group, sep1, kind = gk.partition("/")
    ns, sep2, name = nn.partition("/")
    if not (sep1 and sep2 and kind and name):
        return None
    app_ns, sep, app_name = app.partition("_")
    if sep and app_ns and app_name:
        return TrackingId(app_ns, app_name, Target(group, kind, ns, name))
    return TrackingId(None, app, Target(group, kind, ns, name))


def managers_of(obj: Mapping[str, Any]) -> list[ManagerRef]:
    """Every GitOps manager the object's markers name (in a fixed order: Argo CD, then Flux)."""
    meta = obj.get("metadata") or {}
    ann: Mapping[str, str] = meta.get("annotations") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    target = Target.of(obj)
    out: list[ManagerRef] = []
    tid = parse_tracking_id(ann[ARGOCD_TRACKING_ID]) if ARGOCD_TRACKING_ID in ann else None
    if tid is not None and tid.target == target:
        out.append(ManagerRef(ManagerKind.APPLICATION, tid.app_namespace, tid.app, ARGOCD_TRACKING_ID))
    elif ARGOCD_TRACKING_ID not in ann and labels.get(ARGOCD_INSTANCE_LABEL):
        app_ns, sep, app = labels[ARGOCD_INSTANCE_LABEL].partition("_")
        ref_ns, ref_name = (app_ns, app) if sep and app_ns and app else (None, labels[ARGOCD_INSTANCE_LABEL])
        out.append(
            ManagerRef(ManagerKind.APPLICATION, ref_ns, ref_name, ARGOCD_INSTANCE_LABEL, confirmed=False)
        )
    if labels.get(FLUX_KS_NAME):
        ns = labels.get(FLUX_KS_NAMESPACE) or target.namespace
        out.append(ManagerRef(ManagerKind.KUSTOMIZATION, ns, labels[FLUX_KS_NAME], FLUX_KS_NAME))
    if labels.get(FLUX_HR_NAME):
        ns = labels.get(FLUX_HR_NAMESPACE) or target.namespace
        out.append(ManagerRef(ManagerKind.HELMRELEASE, ns, labels[FLUX_HR_NAME], FLUX_HR_NAME))
    return out


# --- a marker whose manager is not in this cluster -----------------------------------------------

ORPHAN_MARKERS_KEY = "controller.gitops.orphanMarkers"

# Where else the manager may run, per kind, and how it would undo the stop from there.
_ELSEWHERE = {
    ManagerKind.APPLICATION: ("Argo CD", "a hub Argo CD managing this cluster", "self-heal"),
    ManagerKind.KUSTOMIZATION: ("Flux", "a Flux Kustomization with spec.kubeConfig", "its next apply"),
    ManagerKind.HELMRELEASE: ("Flux", "a Flux HelmRelease with spec.kubeConfig", "drift correction"),
}


def unseen_preflight(ref: ManagerRef, target: Target, writes: Sequence[str], *, where: str) -> Preflight:
    """A marker naming a manager object this cluster does not have (`where`: what was looked up).
    The marker is the manager's own (written when it applied the object), so either the manager
    lives in another cluster, where this controller cannot read it, or it is gone and the marker is
    stale; only the configuration can tell which (ORPHAN_MARKERS_KEY). Blocks, with the three ways
    out; `fix` is the entry for the manager where it runs."""
    tool, remote, undo = _ELSEWHERE[ref.kind]
    if ref.kind is ManagerKind.APPLICATION:
        fix = argocd_fix(target, writes, respect=False)
    else:
        fix = flux_ignore_fix(target, writes, helm=ref.kind is ManagerKind.HELMRELEASE)
    return Preflight(
        Outcome.UNSEEN,
        f"{target.short} carries {ref.marker}, but this cluster has no {where}: it may live in another "
        f"cluster ({remote}), where {undo} would put {', '.join(writes)} back. Ways out: make the "
        f"{ref.kind.value} readable here; or merge the entry below into it where it runs and set "
        f"{ORPHAN_MARKERS_KEY}: stale (that copy cannot be checked from here); or, if no {tool} outside "
        f"this cluster manages it, set {ORPHAN_MARKERS_KEY}: stale",
        ref,
        fix,
    )


# --- JSON pointers ------------------------------------------------------------------------------


class InvalidPointer(ValueError):
    pass


def pointer_tokens(pointer: str) -> tuple[str, ...]:
    """RFC 6901: "" is the whole document, otherwise "/"-separated tokens with ~1 -> / and ~0 -> ~."""
    if pointer == "":
        return ()
    if not pointer.startswith("/"):
        raise InvalidPointer(f"JSON pointer {pointer!r} must start with '/'")
    return tuple(t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/"))


def covers(prefix: str, pointer: str) -> bool:
    """Ignoring `prefix` ignores `pointer`: the same path or one inside it (never a sibling that
    merely shares a string prefix: /spec/replica does not cover /spec/replicas)."""
    try:
        p, q = pointer_tokens(prefix), pointer_tokens(pointer)
    except InvalidPointer:
        return False
    return q[: len(p)] == p


_JQ_SEGMENT = re.compile(r'\.([A-Za-z_][A-Za-z0-9_]*)|\["((?:[^"\\]|\\.)*)"\]')


def jq_pointer(expr: str) -> str | None:
    """A jq path made only of field accesses (`.spec.replicas`, `.metadata.annotations["a/b"]`) as
    a JSON pointer; None for anything else (filters, wildcards): those are not read as cover."""
    expr = expr.strip()
    pos, tokens = 0, []
    while pos < len(expr):
        m = _JQ_SEGMENT.match(expr, pos)
        if m is None:
            return None
        tokens.append(m.group(1) if m.group(1) is not None else json.loads(f'"{m.group(2)}"'))
        pos = m.end()
    if not tokens:
        return None
    return "".join("/" + t.replace("~", "~0").replace("/", "~1") for t in tokens)


# --- Argo CD ------------------------------------------------------------------------------------


def _argocd_rule_matches(rule: Mapping[str, Any], target: Target) -> bool:
    # Argo CD matches group and kind as globs, name and namespace exactly when set.
    group, kind = str(rule.get("group") or ""), str(rule.get("kind") or "")
    return (
        fnmatch.fnmatchcase(target.group, group)
        and fnmatch.fnmatchcase(target.kind, kind)
        and (not rule.get("name") or rule.get("name") == target.name)
        and (not rule.get("namespace") or rule.get("namespace") == target.namespace)
    )


def _argocd_rule_covers(rule: Mapping[str, Any], pointer: str, field_manager: str) -> bool:
    if field_manager in (rule.get("managedFieldsManagers") or []):
        return True
    if any(covers(str(p), pointer) for p in rule.get("jsonPointers") or []):
        return True
    for expr in rule.get("jqPathExpressions") or []:
        p = jq_pointer(str(expr))
        if p is not None and covers(p, pointer):
            return True
    return False


def argocd_preflight(
    app: Mapping[str, Any], target: Target, writes: Sequence[str], *, field_manager: str, ref: ManagerRef
) -> Preflight:
    spec = app.get("spec") or {}
    policy = spec.get("syncPolicy") or {}
    automated = policy.get("automated")
    where = f"Application {(app.get('metadata') or {}).get('namespace', '')}/{ref.name}"
    if automated is None or automated.get("enabled") is False:
        return Preflight(Outcome.CLEAR, f"{where} has no automated sync", ref)
    if not automated.get("selfHeal"):
        return Preflight(Outcome.CLEAR, f"{where} syncs automatically but without selfHeal", ref)
    rules = [r for r in spec.get("ignoreDifferences") or [] if _argocd_rule_matches(r, target)]
    uncovered = [w for w in writes if not any(_argocd_rule_covers(r, w, field_manager) for r in rules)]
    respect = RESPECT_IGNORE in (policy.get("syncOptions") or [])
    if not uncovered and respect:
        return Preflight(Outcome.CLEAR, f"{where} ignores {', '.join(writes)} and respects it on sync", ref)
    missing = []
    if uncovered:
        missing.append(f"no ignoreDifferences entry for {target.short} covers {', '.join(uncovered)}")
    if not respect:
        missing.append(f"syncOptions lacks {RESPECT_IGNORE}")
    return Preflight(
        Outcome.REVERTS,
        f"{where} self-heals and would put {', '.join(writes)} back: " + "; ".join(missing),
        ref,
        argocd_fix(target, uncovered, respect=respect),
    )


def argocd_fix(target: Target, uncovered: Sequence[str], *, respect: bool) -> str:
    """What to merge into the Application (ignoreDifferences and syncOptions are lists: add these
    entries to the ones it has)."""
    spec: dict[str, Any] = {}
    if uncovered:
        spec["ignoreDifferences"] = [
            {
                "group": target.group,
                "kind": target.kind,
                "name": target.name,
                "namespace": target.namespace,
                "jsonPointers": list(uncovered),
            }
        ]
    if not respect:
        spec["syncPolicy"] = {"syncOptions": [RESPECT_IGNORE]}
    return yaml.safe_dump({"spec": spec}, sort_keys=False)


# --- Flux ---------------------------------------------------------------------------------------


def _selector_matches(selector: str, values: Mapping[str, str]) -> bool | None:
    """Equality-based label selector (`a=b,c!=d,e,!f`); None when it uses anything else (set-based
    expressions are not read here, and an unread selector never counts as a match)."""
    for term in (t.strip() for t in selector.split(",")):
        if not term:
            continue
        if re.search(r"\s(in|notin)\s|\(", term):
            return None
        if "!=" in term:
            k, v = (s.strip() for s in term.split("!=", 1))
            if values.get(k) == v:
                return False
        elif "=" in term:
            k, v = (s.strip() for s in term.replace("==", "=").split("=", 1))
            if values.get(k) != v:
                return False
        elif term.startswith("!"):
            if term[1:].strip() in values:
                return False
        elif term not in values:
            return False
    return True


def _anchored(pattern: str, value: str) -> bool:
    # kustomize selectors match group, version, kind, name and namespace as anchored regexes.
    try:
        return re.fullmatch(pattern, value) is not None
    except re.error:
        return False


def flux_target_matches(target_sel: Mapping[str, Any] | None, obj: Mapping[str, Any]) -> bool:
    """A Flux ignore rule's `target` (none: every object of the Kustomization)."""
    if not target_sel:
        return True
    t = Target.of(obj)
    version = str(obj.get("apiVersion") or "").rpartition("/")[2]
    meta = obj.get("metadata") or {}
    for key, value in (("group", t.group), ("version", version), ("kind", t.kind), ("name", t.name),
                       ("namespace", t.namespace)):  # fmt: skip
        pattern = target_sel.get(key)
        if pattern and not _anchored(str(pattern), value):
            return False
    for key, values in (
        ("labelSelector", meta.get("labels") or {}),
        ("annotationSelector", meta.get("annotations") or {}),
    ):
        sel = target_sel.get(key)
        if sel and _selector_matches(str(sel), values) is not True:
            return False
    return True


def _flux_uncovered(
    rules: Sequence[Mapping[str, Any]], obj: Mapping[str, Any], writes: Sequence[str]
) -> list[str]:
    matching = [r for r in rules if flux_target_matches(r.get("target"), obj)]
    return [w for w in writes if not any(covers(str(p), w) for r in matching for p in r.get("paths") or [])]


def flux_ignore_fix(target: Target, uncovered: Sequence[str], *, helm: bool) -> str:
    sel = {"group": target.group} if target.group else {}  # the core group is left out
    sel |= {"kind": target.kind, "name": target.name, "namespace": target.namespace}
    rule = {"paths": list(uncovered), "target": sel}
    spec = {"driftDetection": {"ignore": [rule]}} if helm else {"ignore": [rule]}
    return yaml.safe_dump({"spec": spec}, sort_keys=False)


def kustomization_preflight(
    ks: Mapping[str, Any], obj: Mapping[str, Any], writes: Sequence[str], *, ref: ManagerRef
) -> Preflight:
    spec = ks.get("spec") or {}
    ann = (obj.get("metadata") or {}).get("annotations") or {}
    where = f"Kustomization {ref.namespace}/{ref.name}"
    if spec.get("suspend"):
        return Preflight(Outcome.CLEAR, f"{where} is suspended", ref)
    if str(ann.get(FLUX_SSA, "")).lower() in ("ifnotpresent", "ignore"):
        return Preflight(
            Outcome.CLEAR, f"the object opts out of Flux's apply ({FLUX_SSA}: {ann[FLUX_SSA]})", ref
        )
    if str(ann.get(FLUX_RECONCILE, "")).lower() == "disabled":
        return Preflight(Outcome.CLEAR, f"the object opts out of Flux ({FLUX_RECONCILE}: disabled)", ref)
    return _flux_rules_cover(
        spec.get("ignore") or [],
        obj,
        writes,
        ref,
        helm=False,
        clear=f"{where} ignores {', '.join(writes)}",
        reverts=f"{where} applies the object every interval and would put {{}} back: no spec.ignore rule "
        "for {} covers it",
    )


def helmrelease_preflight(
    hr: Mapping[str, Any], obj: Mapping[str, Any], writes: Sequence[str], *, ref: ManagerRef
) -> Preflight:
    spec = hr.get("spec") or {}
    where = f"HelmRelease {ref.namespace}/{ref.name}"
    if spec.get("suspend"):
        return Preflight(Outcome.CLEAR, f"{where} is suspended", ref)
    drift = spec.get("driftDetection") or {}
    if drift.get("mode") != "enabled":
        return Preflight(
            Outcome.CLEAR, f"{where} does not correct drift (driftDetection.mode is not enabled)", ref
        )
    return _flux_rules_cover(
        drift.get("ignore") or [],
        obj,
        writes,
        ref,
        helm=True,
        clear=f"{where} ignores {', '.join(writes)} in drift detection",
        reverts=f"{where} corrects drift and would put {{}} back: no driftDetection.ignore rule for {{}} "
        "covers it",
    )


def _flux_rules_cover(
    rules: Sequence[Mapping[str, Any]],
    obj: Mapping[str, Any],
    writes: Sequence[str],
    ref: ManagerRef,
    *,
    helm: bool,
    clear: str,
    reverts: str,
) -> Preflight:
    """CLEAR when Flux's ignore rules cover every path the stop writes; else REVERTS with the rule
    that would (`reverts` is formatted with the uncovered paths and the target's short name)."""
    uncovered = _flux_uncovered(rules, obj, writes)
    if not uncovered:
        return Preflight(Outcome.CLEAR, clear, ref)
    target = Target.of(obj)
    return Preflight(
        Outcome.REVERTS,
        reverts.format(", ".join(uncovered), target.short),
        ref,
        flux_ignore_fix(target, uncovered, helm=helm),
    )
