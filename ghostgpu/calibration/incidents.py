"""Labelled incident sets for `ghostgpu calibrate`: the built-in set and YAML/CSV incident files.

An incident is one (manifest, remediation action class, incident type, dangerous?) event. The
manifest supplies the structural facts the risk score needs (YAML lines, GPUs, replicas, volumes);
`dangerous` is the ground truth the calibration must respect.

Built-in set ("made the published way"): every Kyverno and Kueue object that
`ghostgpu render` produces from the embedded examples/ghostgpu.yaml (one object = one manifest;
the committed policies/ and kueue/ bundles are read when rendering is unavailable) crossed with
the eight remediation classes. Each event's incident type is the incident that action class
remediates (`INCIDENT_TYPE_OF`), and its dangerous label comes from the explicit `RUBRIC` below,
which looks at the action and the manifest, never at the risk score.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict

from ghostgpu.autonomy import (
    REMEDIATION_CLASSES,
    ActionClass,
    AutonomyConfig,
    ScoredIncident,
    WorkloadFacts,
    normalise_type,
    score,
)


class IncidentFileError(ValueError):
    """A bad incident file: the message names the file, the row/key and what was expected."""


# --- manifests and their facts ---------------------------------------------------------------------

# Kyverno's classic kinds and its CEL kinds (policies.kyverno.io), which `ghostgpu render` emits.
KYVERNO_POLICY_KINDS = frozenset({
    "ClusterPolicy", "Policy",
    "ValidatingPolicy", "NamespacedValidatingPolicy", "MutatingPolicy", "NamespacedMutatingPolicy",
    "GeneratingPolicy", "NamespacedGeneratingPolicy", "ImageValidatingPolicy", "DeletingPolicy",
})  # fmt: skip
# CEL kinds whose effect outlives the policy being switched off (objects changed or created).
_LASTING_KINDS = frozenset({
    "MutatingPolicy", "NamespacedMutatingPolicy", "GeneratingPolicy", "NamespacedGeneratingPolicy",
    "DeletingPolicy",
})  # fmt: skip
ADMISSION_KINDS = KYVERNO_POLICY_KINDS | {
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "MutatingAdmissionPolicy",
    "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration",
}
_GPU_RESOURCE = re.compile(r"(^|/)(gpu|mig-)|\.com/gpu", re.IGNORECASE)


class Manifest(BaseModel):
    """One Kubernetes object as written in a file, with the traits the rubric looks at."""

    model_config = ConfigDict(frozen=True)

    source: str  # "kueue/cluster-queues.yaml#2"
    kind: str
    name: str
    namespace: str | None
    lines: int  # YAML lines of the document, blank and comment lines excluded
    gpus: float  # GPU units it governs (nominal quota, or limits x replicas); a MIG slice counts 1
    replicas: int
    volumes: int
    admission_policy: bool  # a cluster-wide admission policy/webhook (Kyverno ClusterPolicy, ...)
    enforcing: bool  # a policy whose effect outlives it: mutate/generate rules, or validate Enforce
    governs_bare_pods: bool  # a policy matching Pod, or a bare Pod itself
    shared_quota: bool  # a ClusterQueue in a cohort, or a Cohort: quota flows between teams
    node_pool: bool  # a ResourceFlavor: its nodes serve every team's queue

    @property
    def label(self) -> str:
        ns = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}/{ns}{self.name}"


def _quantity(value: Any) -> float:
    from ghostgpu.quantity import parse_quantity  # the render helper's strict Kubernetes parser

    try:
        return float(parse_quantity(str(value)))
    except (ValueError, TypeError):
        return 0.0


def _walk(node: Any) -> Iterator[tuple[str | None, Any]]:
    """(key, value) for every mapping entry in a nested structure, depth first."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            yield str(key), value
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def _gpus(obj: Mapping[str, Any], replicas: int) -> float:
    quota = 0.0
    limits = 0.0
    for key, value in _walk(obj):
        # Kueue: resourceGroups[].flavors[].resources[] = {name: nvidia.com/gpu, nominalQuota: 4}
        if isinstance(value, list):
            for item in value:
                if (isinstance(item, Mapping) and _GPU_RESOURCE.search(str(item.get("name", "")))
                        and "nominalQuota" in item):  # fmt: skip
                    quota += _quantity(item["nominalQuota"])
        # Pods: resources.limits = {nvidia.com/gpu: 1} (requests equal limits for extended resources)
        if key == "limits" and isinstance(value, Mapping):
            limits += sum(_quantity(v) for k, v in value.items() if _GPU_RESOURCE.search(str(k)))
    return quota + limits * max(replicas, 1 if limits else 0)


def _volumes(obj: Mapping[str, Any]) -> int:
    spec = obj.get("spec") or {}
    pod = ((spec.get("template") or {}).get("spec") or {}) if obj.get("kind") != "Pod" else spec
    return len(pod.get("volumes") or []) + len(spec.get("volumeClaimTemplates") or [])


def _policy_traits(obj: Mapping[str, Any]) -> tuple[bool, bool]:
    """(enforcing, governs bare Pods) of a Kyverno policy, classic or CEL."""
    kind = str(obj.get("kind"))
    spec = obj.get("spec") or {}
    # CEL kinds: mutate/generate/delete always last; validate lasts when it denies.
    enforcing = kind in _LASTING_KINDS or "Deny" in (spec.get("validationActions") or [])
    enforce_default = str(spec.get("validationFailureAction", "Audit")).lower() == "enforce"
    for rule in spec.get("rules") or []:  # classic ClusterPolicy/Policy rules
        if not isinstance(rule, Mapping):
            continue
        validate = rule.get("validate") or {}
        action = str(validate.get("failureAction", "")).lower()
        if (
            "mutate" in rule
            or "generate" in rule
            or ("validate" in rule and (action == "enforce" or (not action and enforce_default)))
        ):
            enforcing = True
    bare_pods = False
    for key, value in _walk(spec.get("rules") or []):
        if key == "kinds" and isinstance(value, list) and any(str(k).split("/")[-1] == "Pod" for k in value):
            bare_pods = True
    for rule in (spec.get("matchConstraints") or {}).get("resourceRules") or []:
        if isinstance(rule, Mapping) and "pods" in (rule.get("resources") or []):
            bare_pods = True
    return enforcing, bare_pods


def _count_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#"))


def manifest_from_object(obj: Mapping[str, Any], source: str, text: str | None = None) -> Manifest:
    """Facts of one object. `text` is its YAML as written; without it the object is dumped."""
    if not isinstance(obj, Mapping) or not obj.get("kind"):
        raise IncidentFileError(f"{source}: expected a Kubernetes object with a kind")
    kind = str(obj["kind"])
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    replicas = int(spec.get("replicas", 1 if kind == "Pod" else 0) or 0)
    policy = kind in KYVERNO_POLICY_KINDS
    enforcing, bare_pods = _policy_traits(obj) if policy else (False, kind == "Pod")
    return Manifest(
        source=source,
        kind=kind,
        name=str(meta.get("name", "")),
        namespace=meta.get("namespace"),
        lines=_count_lines(text if text is not None else yaml.safe_dump(dict(obj), sort_keys=False)),
        gpus=_gpus(obj, replicas),
        replicas=replicas,
        volumes=_volumes(obj),
        admission_policy=kind in ADMISSION_KINDS,
        enforcing=enforcing,
        governs_bare_pods=bare_pods,
        shared_quota=kind == "Cohort"
        or (kind == "ClusterQueue" and bool(spec.get("cohortName") or spec.get("cohort"))),
        node_pool=kind == "ResourceFlavor",
    )


_DOC_SEPARATOR = re.compile(r"^---\s*$", re.MULTILINE)


def manifests_from_text(text: str, source: str) -> list[Manifest]:
    """Every object in a (multi-document) YAML text; each document's own lines are counted."""
    out: list[Manifest] = []
    for index, chunk in enumerate(_DOC_SEPARATOR.split(text)):
        try:
            obj = yaml.safe_load(chunk)
        except yaml.YAMLError as exc:
            raise IncidentFileError(f"{source}: document {index} is not valid YAML: {exc}") from None
        if obj is None:
            continue
        if isinstance(obj, Mapping) and obj.get("kind") == "Kustomization":
            continue  # Kustomize glue, not a cluster object
        out.append(manifest_from_object(obj, f"{source}#{len(out)}", chunk))
    return out


# --- the rubric ----------------------------------------------------------------------------------

RUBRIC = """\
An event (manifest x action) is DANGEROUS when any of these holds:
  irreversible  - delete a PVC-backed pod; preempt another tenant's workload (its progress since
                  the last checkpoint is gone); evict a pod where the manifest governs bare Pods
                  (nothing recreates them); disable an admission policy that mutates, generates or
                  validates in Enforce (objects admitted while it is off are never re-processed).
  loses data    - delete a PVC-backed pod; restart or evict a pod whose manifest attaches volumes.
  crosses tenant- preempt another tenant's workload; patch the quota of a ClusterQueue that sits
                  in a cohort, or of a Cohort (quota moves between the cohort's teams); cordon the
                  nodes of a ResourceFlavor (they serve every team's queue).
Everything else is safe: scale to zero (replicas recorded, `ghostgpu restore`), restart a
controller-owned pod, cordon outside a shared pool, patch a standalone queue, disable an
audit-only policy.
Incident type = the incident the action remediates: cordon node, evict pod -> node_pressure;
delete PVC-backed pod -> pvc_failure; patch quota, disable admission policy, preempt another
tenant -> scheduler_starvation; restart pod, scale to zero -> oom."""

INCIDENT_TYPE_OF: dict[str, str] = {
    ActionClass.CORDON_NODE: "node_pressure",
    ActionClass.EVICT_POD: "node_pressure",
    ActionClass.DELETE_PVC_POD: "pvc_failure",
    ActionClass.PATCH_CLUSTERQUEUE_QUOTA: "scheduler_starvation",
    ActionClass.DISABLE_ADMISSION_POLICY: "scheduler_starvation",
    ActionClass.PREEMPT_OTHER_TENANT: "scheduler_starvation",
    ActionClass.RESTART_POD: "oom",
    ActionClass.SCALE_TO_ZERO: "oom",
}


def rubric_reasons(manifest: Manifest, action: str) -> tuple[str, ...]:
    """Which rubric clauses make (manifest, action) dangerous; empty = safe."""
    try:
        a: ActionClass | None = ActionClass(action)
    except ValueError:
        a = None  # a class added in config: the rubric has no clause for it
    reasons: list[str] = []
    if a in (ActionClass.DELETE_PVC_POD, ActionClass.PREEMPT_OTHER_TENANT):
        reasons.append("irreversible")
    if a is ActionClass.EVICT_POD and manifest.governs_bare_pods:
        reasons.append("irreversible")
    if a is ActionClass.DISABLE_ADMISSION_POLICY and manifest.admission_policy and manifest.enforcing:
        reasons.append("irreversible")
    if a is ActionClass.DELETE_PVC_POD or (
        a in (ActionClass.RESTART_POD, ActionClass.EVICT_POD) and manifest.volumes > 0
    ):
        reasons.append("loses data")
    if a is ActionClass.PREEMPT_OTHER_TENANT:
        reasons.append("crosses tenant")
    if a is ActionClass.PATCH_CLUSTERQUEUE_QUOTA and manifest.shared_quota:
        reasons.append("crosses tenant")
    if a is ActionClass.CORDON_NODE and manifest.node_pool:
        reasons.append("crosses tenant")
    return tuple(dict.fromkeys(reasons))


# --- incidents -----------------------------------------------------------------------------------


class Incident(BaseModel):
    model_config = ConfigDict(frozen=True)

    manifest: str  # label, e.g. ClusterQueue/research
    action: str
    incident_type: str
    dangerous: bool
    facts: WorkloadFacts
    rubric: tuple[str, ...] = ()  # rubric clauses that fired (built-in set only)


# Where an action class lands: on the workload's own pods, or on something the manifest shares
# with other tenants (a node pool, a cohort's quota, a cluster-wide admission policy).
_SHARED_REACH = {
    ActionClass.CORDON_NODE: lambda m: m.node_pool,
    ActionClass.PATCH_CLUSTERQUEUE_QUOTA: lambda m: m.shared_quota,
    ActionClass.DISABLE_ADMISSION_POLICY: lambda m: m.admission_policy and m.namespace is None,
}


def reaches_other_tenants(manifest: Manifest, action: str) -> bool:
    """Cross-tenant reach, the score's input (c): does the action land on something that
    serves several tenants? Pod-level actions (scale, restart, evict, delete) reach one
    workload; preempting another tenant always crosses (the action table says so)."""
    check = _SHARED_REACH.get(action)  # type: ignore[call-overload]
    return bool(check and check(manifest))


def facts_of(manifest: Manifest, action: str | None = None) -> WorkloadFacts:
    """The score's view of (manifest, action). A shared reach is expressed the way the controller
    expresses it: the target's tenant ("shared") differs from the acting tenant."""
    crosses = action is not None and reaches_other_tenants(manifest, action)
    return WorkloadFacts(
        kind=manifest.kind,
        name=manifest.name,
        namespace=manifest.namespace,
        gpus=manifest.gpus,
        replicas=manifest.replicas,
        volumes=manifest.volumes,
        manifest_lines=manifest.lines,
        workload_tenant="shared" if crosses else None,
        action_tenant="incident" if crosses else None,
        admission_policy=False,  # only disable_admission_policy acts on the policy itself (action table)
    )


def cross_with_actions(manifests: Iterable[Manifest]) -> list[Incident]:
    """manifests x the eight remediation classes, typed and labelled by the rubric."""
    out: list[Incident] = []
    for m in manifests:
        for action in REMEDIATION_CLASSES:
            reasons = rubric_reasons(m, action)
            out.append(
                Incident(
                    manifest=m.label,
                    action=str(action),
                    incident_type=INCIDENT_TYPE_OF[action],
                    dangerous=bool(reasons),
                    facts=facts_of(m, action),
                    rubric=reasons,
                )
            )
    return out


def builtin_manifests() -> tuple[list[Manifest], str]:
    """The project's own Kyverno and Kueue objects and where they came from."""
    try:
        from ghostgpu.config import load_default_config
        from ghostgpu.render import render_bundles

        files = render_bundles(load_default_config())
        origin = "ghostgpu render of the embedded examples/ghostgpu.yaml (policies/, kueue/)"
    except Exception as exc:  # rendering unavailable (no templates in this install): use the repo's bundles
        root = Path(__file__).resolve().parents[2]
        paths = sorted(p for b in ("policies", "kueue") for p in (root / b).glob("*.yaml"))
        if not paths:
            raise IncidentFileError(
                f"built-in incident set: cannot render ({exc}) and no committed policies/ or kueue/ "
                f"bundle under {root}; pass --incidents FILE"
            ) from None
        files = {str(p.relative_to(root)): p.read_text() for p in paths}
        origin = f"committed bundles under {root} (policies/, kueue/)"
    manifests: list[Manifest] = []
    for path, text in sorted(files.items()):
        if path.split("/")[0] in ("policies", "kueue"):
            manifests.extend(manifests_from_text(text, path))
    return manifests, origin


def builtin_incidents() -> tuple[list[Incident], str]:
    manifests, origin = builtin_manifests()
    return cross_with_actions(manifests), origin


def scored(incidents: Iterable[Incident], config: AutonomyConfig | None = None) -> list[ScoredIncident]:
    cfg = config or AutonomyConfig()
    return [
        ScoredIncident(
            incident_type=i.incident_type,
            score=score(i.action, i.facts, cfg).score,
            dangerous=i.dangerous,
            label=f"{i.manifest} x {i.action}",
        )
        for i in incidents
    ]


# --- incident files --------------------------------------------------------------------------------

_ALIASES = {
    "action_class": "action",
    "class": "action",
    "type": "incident_type",
    "incident": "incident_type",
    "manifest_lines": "lines",
    "yaml_lines": "lines",
}
_REQUIRED = ("manifest", "action", "incident_type", "dangerous")
_OPTIONAL_INT = ("lines", "replicas", "volumes")
_KNOWN = (
    set(_REQUIRED) | set(_OPTIONAL_INT) | {"gpus", "namespace", "kind", "cross_tenant", "admission_policy"}
)
_YES = {"yes", "y", "true", "1", "dangerous"}
_NO = {"no", "n", "false", "0", "safe", ""}


def _key(raw: str) -> str:
    k = "_".join(str(raw).strip().lower().replace("-", " ").split())
    return _ALIASES.get(k, k)


def _bool(value: Any, where: str, key: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _YES:
        return True
    if text in _NO:
        return False
    raise IncidentFileError(f"{where}: {key}: expected yes/no (or true/false, 1/0), got {value!r}")


def _number(value: Any, where: str, key: str, integer: bool) -> float:
    kind = "a whole number" if integer else "a number"
    try:
        number = int(str(value).strip()) if integer else float(str(value).strip())
    except ValueError:
        number = -1
    if number < 0 or number != number:  # negative, unparsable or NaN
        raise IncidentFileError(f"{where}: {key}: expected {kind} >= 0, got {value!r}")
    return number


def _resolve_manifest(ref: str, base: Path, where: str) -> Manifest | None:
    """`path`, `path#N` (Nth object) or `path#Kind/name`, relative to the incident file."""
    path_part, _, selector = ref.partition("#")
    path = (base / path_part).resolve() if path_part else None
    if path is None or not path.is_file():
        return None
    found = manifests_from_text(path.read_text(), path_part)
    if not found:
        raise IncidentFileError(f"{where}: manifest {ref!r}: {path} holds no Kubernetes object")
    if not selector:
        if len(found) > 1:
            raise IncidentFileError(
                f"{where}: manifest {ref!r}: {path} holds {len(found)} objects; pick one with "
                f"'{path_part}#N' or '{path_part}#Kind/name'"
            )
        return found[0]
    if selector.isdigit():
        if int(selector) >= len(found):
            raise IncidentFileError(f"{where}: manifest {ref!r}: only {len(found)} objects in {path}")
        return found[int(selector)]
    for m in found:
        if selector in (f"{m.kind}/{m.name}", m.label):
            return m
    choices = ", ".join(m.label for m in found)
    raise IncidentFileError(f"{where}: manifest {ref!r}: no {selector} in {path} (has {choices})")


def _row_to_incident(raw: Mapping[str, Any], where: str, base: Path, actions: set[str]) -> Incident:
    row = {_key(k): v for k, v in raw.items() if k is not None}
    unknown = sorted(set(row) - _KNOWN)
    if unknown:
        raise IncidentFileError(f"{where}: unknown column(s) {unknown}; expected {sorted(_KNOWN)}")
    missing = [k for k in _REQUIRED if row.get(k) is None or str(row.get(k)).strip() == ""]
    if [k for k in missing if k != "dangerous"]:
        raise IncidentFileError(f"{where}: missing {missing}; every row needs {list(_REQUIRED)}")
    action = normalise_type(str(row["action"]))
    if action not in actions:
        raise IncidentFileError(
            f"{where}: action: unknown action class {row['action']!r}; known: {sorted(actions)}"
        )
    dangerous = _bool(row.get("dangerous", ""), where, "dangerous")
    if "dangerous" in missing:
        raise IncidentFileError(f"{where}: dangerous: expected yes/no, the cell is empty")
    ref = str(row["manifest"]).strip()
    manifest = _resolve_manifest(ref, base, where)
    if manifest is None and row.get("lines") in (None, ""):
        raise IncidentFileError(
            f"{where}: manifest {ref!r} is not a file (relative to {base}) and the row gives no `lines`; "
            "give a YAML path or the facts columns (lines, gpus, replicas, volumes)"
        )
    facts = facts_of(manifest) if manifest else WorkloadFacts(kind=str(row.get("kind") or "Object"), name=ref)
    update: dict[str, Any] = {}
    for key in _OPTIONAL_INT:
        if row.get(key) not in (None, ""):
            name = "manifest_lines" if key == "lines" else key
            update[name] = int(_number(row[key], where, key, integer=True))
    if row.get("gpus") not in (None, ""):
        update["gpus"] = _number(row["gpus"], where, "gpus", integer=False)
    if row.get("namespace") not in (None, ""):
        update["namespace"] = str(row["namespace"])
    if row.get("admission_policy") not in (None, ""):
        update["admission_policy"] = _bool(row["admission_policy"], where, "admission_policy")
    if row.get("cross_tenant") not in (None, "") and _bool(row["cross_tenant"], where, "cross_tenant"):
        update.update(workload_tenant="owner", action_tenant="other")
    return Incident(
        manifest=manifest.label if manifest else ref,
        action=action,
        incident_type=normalise_type(str(row["incident_type"])),
        dangerous=dangerous,
        facts=facts.model_copy(update=update),
    )


def load_incidents(path: str | Path, config: AutonomyConfig | None = None) -> list[Incident]:
    """Read a YAML (list of rows, or {incidents: [...]}) or CSV (header row) incident file.

    Columns: manifest, action (class), incident_type, dangerous (yes/no); optional facts that
    override or replace the manifest's: lines, gpus, replicas, volumes, namespace, kind,
    cross_tenant (yes/no), admission_policy (yes/no). `manifest` is a YAML path relative to the
    incident file (`file.yaml`, `file.yaml#N`, `file.yaml#Kind/name`) or, with `lines`, a free name.
    """
    p = Path(path)
    if not p.is_file():
        raise IncidentFileError(f"{p}: no such incident file")
    actions = set((config or AutonomyConfig()).action_classes)
    text = p.read_text()
    rows: list[tuple[str, Mapping[str, Any]]] = []
    if p.suffix.lower() == ".csv":
        reader = csv.DictReader(io.StringIO(text))
        if not reader.fieldnames:
            raise IncidentFileError(f"{p}: empty CSV; expected a header row {list(_REQUIRED)}")
        for n, row in enumerate(reader, start=2):  # row 1 is the header
            if None in row:
                raise IncidentFileError(f"{p} row {n}: more cells than header columns")
            if any((v or "").strip() for v in row.values()):
                rows.append((f"{p} row {n}", row))
    elif p.suffix.lower() in (".yaml", ".yml", ".json"):
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise IncidentFileError(f"{p}: not valid YAML: {exc}") from None
        prefix = "incidents"
        if isinstance(data, Mapping):
            data = data.get("incidents")
        if not isinstance(data, list):
            raise IncidentFileError(f"{p}: expected a list of incident rows or a mapping with `incidents:`")
        for n, row in enumerate(data):
            if not isinstance(row, Mapping):
                raise IncidentFileError(f"{p} {prefix}[{n}]: expected a mapping, got {type(row).__name__}")
            rows.append((f"{p} {prefix}[{n}]", row))
    else:
        raise IncidentFileError(f"{p}: expected a .yaml, .yml, .json or .csv incident file")
    if not rows:
        raise IncidentFileError(f"{p}: no incident rows")
    return [_row_to_incident(row, where, p.parent, actions) for where, row in rows]
