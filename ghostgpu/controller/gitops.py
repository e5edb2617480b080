"""GitOps pre-flight: before a reclaim writes anything, find out whether a GitOps manager syncs the
object from Git and would put what the stop writes straight back.

A stop that its manager reverts frees nothing: the GPU is held again within seconds (Argo CD's
self-heal) or at the next interval (Flux), and a controller that keeps acting would fight it every
window. So the reclaim is escalated instead, with the exact change that makes the manager keep
the stop, and nothing is written.

Who manages an object, from its markers:
- Argo CD: annotation `argocd.argoproj.io/tracking-id: <app>:<group>/<kind>:<ns>/<name>` (the
  default tracking method since Argo CD 3.0; `<app>` is `<namespace>_<name>` for an Application
  outside the control-plane namespace). A tracking id naming another object was copied with a
  manifest and Argo CD ignores it, so do we. Label tracking (`app.kubernetes.io/instance: <app>`)
  is trusted only when an Application of that name exists: Helm sets the same label.
- Flux: labels `kustomize.toolkit.fluxcd.io/name` + `/namespace` (a Kustomization),
  `helm.toolkit.fluxcd.io/name` + `/namespace` (a HelmRelease).

When it reverts (read from the manager object, read-only):
- Argo CD Application: automated sync (not `enabled: false`) with `selfHeal: true`, unless an
  `ignoreDifferences` entry matching the object covers every written pointer (`jsonPointers`, a
  plain `jqPathExpressions` path, or `managedFieldsManagers` naming ghostgpu's field manager) AND
  `syncOptions` holds `RespectIgnoreDifferences=true` (without it any sync applies the whole
  manifest again). Automated sync without selfHeal syncs only on a new Git revision; that later
  revert is the revert guard's to record.
- Flux Kustomization: every interval (server-side apply with force), unless suspended, the object
  opts out (`kustomize.toolkit.fluxcd.io/ssa: IfNotPresent|Ignore`,
  `kustomize.toolkit.fluxcd.io/reconcile: disabled`), or a `.spec.ignore` rule whose target
  matches the object covers every written pointer (the field exists in kustomize-controller v1.9).
- Flux HelmRelease: only with `spec.driftDetection.mode: enabled`, unless suspended or a
  `driftDetection.ignore` rule covers every written pointer.

Fail safe: a manager object that cannot be read (403, timeout, 5xx) gives UNKNOWN, which blocks the
stop like a revert does. A manager object that does not exist syncs nothing.
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

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
    uncovered = _flux_uncovered(spec.get("ignore") or [], obj, writes)
    target = Target.of(obj)
    if not uncovered:
        return Preflight(Outcome.CLEAR, f"{where} ignores {', '.join(writes)}", ref)
    return Preflight(
        Outcome.REVERTS,
        f"{where} applies the object every interval and would put {', '.join(uncovered)} back: "
        f"no spec.ignore rule for {target.short} covers it",
        ref,
        flux_ignore_fix(target, uncovered, helm=False),
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
    uncovered = _flux_uncovered(drift.get("ignore") or [], obj, writes)
    target = Target.of(obj)
    if not uncovered:
        return Preflight(Outcome.CLEAR, f"{where} ignores {', '.join(writes)} in drift detection", ref)
    return Preflight(
        Outcome.REVERTS,
        f"{where} corrects drift and would put {', '.join(uncovered)} back: no driftDetection.ignore "
        f"rule for {target.short} covers it",
        ref,
        flux_ignore_fix(target, uncovered, helm=True),
    )


# --- reading the manager (the only I/O) ----------------------------------------------------------


class ManagerReader(Protocol):
    async def get(self, rid: ResourceId, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None when it (or its resource type) does not exist; raises otherwise."""
        ...

    async def find(self, rid: ResourceId, name: str) -> list[dict[str, Any]]:
        """Every object of that name in any namespace ([] when the resource type does not exist)."""
        ...


class ApiReader:
    """ManagerReader on kr8s's `Api.call_api` (the controller's client)."""

    def __init__(self, api: Any) -> None:
        self.api = api

    async def get(self, rid: ResourceId, namespace: str, name: str) -> dict[str, Any] | None:
        from kr8s._exceptions import ServerError

        try:
            async with self.api.call_api(
                "GET", version=rid.version, namespace=namespace, url=f"{rid.plural}/{name}"
            ) as resp:
                return dict(resp.json())
        except ServerError as exc:
            if exc.response is not None and exc.response.status_code == 404:
                return None
            raise

    async def find(self, rid: ResourceId, name: str) -> list[dict[str, Any]]:
        from kr8s._exceptions import ServerError

        try:
            async with self.api.call_api(
                "GET", version=rid.version, url=rid.plural, params={"fieldSelector": f"metadata.name={name}"}
            ) as resp:
                return list(resp.json().get("items") or [])
        except ServerError as exc:
            if exc.response is not None and exc.response.status_code == 404:
                return []
            raise


class GitOpsPreflight:
    """Reads the managers an object's markers name and says whether the stop would stick.

    Blocking answers (REVERTS, UNKNOWN) are kept for `cache_seconds` per (manager, object, writes):
    a blocked reclaim is planned again every poll, and its manager needs reading once a minute, not
    once a poll. A clear answer is never cached: the manager is read right before every stop."""

    def __init__(
        self,
        reader: ManagerReader,
        *,
        argocd_namespace: str = "argocd",
        field_manager: str = "ghostgpu-controller",
        timeout: float = 5.0,
        cache_seconds: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.reader = reader
        self.argocd_namespace = argocd_namespace
        self.field_manager = field_manager
        self.timeout = timeout
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._blocked: dict[tuple[ManagerRef, Target, tuple[str, ...]], tuple[float, Preflight]] = {}

    async def check(self, obj: Mapping[str, Any], writes: Sequence[str]) -> Preflight:
        target = Target.of(obj)
        clear: list[str] = []
        for ref in managers_of(obj):
            key = (ref, target, tuple(writes))
            cached = self._blocked.get(key)
            if cached is not None and self.clock() - cached[0] < self.cache_seconds:
                return cached[1]
            result = await self._check(ref, obj, target, writes)
            if result.blocks:
                self._blocked[key] = (self.clock(), result)
                return result
            self._blocked.pop(key, None)
            clear.append(result.reason)
        return Preflight(Outcome.CLEAR, "; ".join(clear) or "no GitOps manager")

    async def _read(self, ref: ManagerRef) -> dict[str, Any] | None:
        rid = RESOURCES[ref.kind]
        if ref.namespace is not None:
            return await self.reader.get(rid, ref.namespace, ref.name)
        # An unprefixed Argo CD app name: the control-plane namespace, else the only Application of
        # that name (the configured namespace may be wrong; two candidates are not guessed between).
        obj = await self.reader.get(rid, self.argocd_namespace, ref.name)
        if obj is not None:
            return obj
        found = await self.reader.find(rid, ref.name)
        if len(found) > 1:
            spots = sorted(str((f.get("metadata") or {}).get("namespace")) for f in found)
            raise LookupError(f"{len(found)} Applications named {ref.name} ({', '.join(spots)})")
        return found[0] if found else None

    async def _check(
        self, ref: ManagerRef, obj: Mapping[str, Any], target: Target, writes: Sequence[str]
    ) -> Preflight:
        where = ref.where(self.argocd_namespace)
        try:
            manager = await asyncio.wait_for(self._read(ref), self.timeout)
        except Exception as exc:  # 403, timeout, 5xx, ambiguity: fail safe
            detail = (
                "timed out" if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {str(exc)[:200]}"
            )
            return Preflight(
                Outcome.UNKNOWN,
                f"{target.short} carries {ref.marker}, but {where} cannot be read ({detail}); not "
                "stopping what may be synced back",
                ref,
            )
        if manager is None:
            why = "a Helm label, not Argo CD" if not ref.confirmed else "nothing syncs it"
            return Preflight(Outcome.CLEAR, f"{where} does not exist ({why})", ref)
        if ref.kind is ManagerKind.APPLICATION:
            return argocd_preflight(manager, target, writes, field_manager=self.field_manager, ref=ref)
        if ref.kind is ManagerKind.KUSTOMIZATION:
            return kustomization_preflight(manager, obj, writes, ref=ref)
        return helmrelease_preflight(manager, obj, writes, ref=ref)
