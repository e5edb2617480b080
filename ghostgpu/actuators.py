"""Actuators: how each kind of workload manager is stopped and restored, as data
(docs/design.md#managers-and-actuators).

A GPU workload's manager is the top of its controller chain (managers.py). A reclaim acts on that
object through its own stop API, never on a child the manager rewrites. Each row of the table says:

- `stop`: `scale` (the scale subresource to 0), `annotation` (set `annotation` to `value`; the
  value `now` is written as the current RFC 3339 time), `field` (merge-patch the JSON pointer
  `field` to `value`) or `none` (the kind's controller honours no stop: its objects are tracked,
  judged and counted, never written; a reclaimable verdict is escalated);
- `requires`: JSON pointer -> value that must hold for the stop to apply (a RayJob is suspended
  only with `shutdownAfterJobFinishes: true`, or KubeRay fails it); an object that does not meet
  them is judged like a `none` row: escalated, never written;
- how restore undoes it: `scale` back to the recorded count; remove the annotation (or put back the
  value it had); set the field back to the recorded value;
- where the record lives: always on the top object, as an annotation
  (`ghostgpu.io/reclaimed-from-replicas` for `scale`, `ghostgpu.io/reclaimed-from` for the others:
  JSON of the previous value at each written pointer, null when it was absent);
- `writes`: the JSON pointers the stop changes (what a GitOps tool or the manager could revert) and
  `is_stopped(obj)`: whether the object is stopped the way this actuator stops it;
- `containers` / `container`: where the object's pod templates keep their containers (JSON pointers,
  `*` = every element of a list): the Kyverno tracking policy and the controller count GPUs there;
  `resources`: pointers to bare resource requirements (a TrainJob's `trainer.resourcesPerNode`);
- `base_risk`: the risk gate's base risk of the stop (the KServe stop deletes a Deployment: higher).

The built-ins cover Deployment/StatefulSet, Kubeflow Notebook and Workspace, KubeRay RayCluster,
LeaderWorkerSet, KServe InferenceService, NVIDIA NIMService and the KEDA ScaledObject; an in-house
operator is added in ghostgpu.yaml under `controller.actuators` without code (docs/managers.md).

The table is plain data and pure functions, below `ghostgpu.config` (which validates its rows) and
`ghostgpu.render` (which renders RBAC and the Kyverno tracking test from it); the controller's act
room stops and restores through it (controller/act/stops.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

RECLAIMED_FROM_RECORD = "ghostgpu.io/reclaimed-from"  # non-scale actuators: {pointer: previous value}
RECLAIMED_AT = "ghostgpu.io/reclaimed-at"  # keys.RECLAIMED_AT (keys imports config, which imports this)
REVERT_MARK = "ghostgpu.io/reclaim-reverted"  # revert_guard.MARK: a stale mark goes with a new stop
NOW = "now"  # an annotation value written as the current time (Kubeflow's culler format)

# The kinds whose pods the controller watches directly (their own watch caches); every other row is
# a manager above them, resolved through owner chains. Both kinds are stopped like any scale row.
POD_CONTROLLERS = ("Deployment", "StatefulSet")

StopKind = Literal["scale", "annotation", "field", "none"]
Verb = Literal["get", "list", "watch", "patch", "update"]


def pointer_escape(token: str) -> str:
    """RFC 6901: `~` -> `~0`, `/` -> `~1` (annotation keys carry slashes)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer_tokens(pointer: str) -> list[str]:
    if not pointer.startswith("/"):
        raise ValueError(f"{pointer!r} is not a JSON pointer (it must start with /)")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


_MISSING = object()


def get_pointer(obj: Any, pointer: str) -> Any:
    """The value at `pointer`, or _MISSING."""
    cur = obj
    for tok in pointer_tokens(pointer):
        if isinstance(cur, Mapping) and tok in cur:
            cur = cur[tok]
        elif isinstance(cur, list) and tok.isdigit() and int(tok) < len(cur):
            cur = cur[int(tok)]
        else:
            return _MISSING
    return cur


def expand(obj: Any, pointer: str) -> Iterator[Any]:
    """Every value at `pointer`, where a `*` token walks every element of a list."""
    toks = pointer_tokens(pointer)

    def walk(cur: Any, i: int) -> Iterator[Any]:
        if i == len(toks):
            yield cur
            return
        tok = toks[i]
        if tok == "*":
            for item in cur if isinstance(cur, list) else []:
                yield from walk(item, i + 1)
        elif isinstance(cur, Mapping) and tok in cur:
            yield from walk(cur[tok], i + 1)

    yield from walk(obj, 0)


def merge_patch_for(pointer: str, value: Any) -> dict[str, Any]:
    """The JSON merge patch that sets `pointer` to `value` (None removes it)."""
    toks = pointer_tokens(pointer)
    patch: dict[str, Any] = {}
    cur = patch
    for tok in toks[:-1]:
        cur = cur.setdefault(tok, {})
    cur[toks[-1]] = value
    return patch


def deep_merge(a: dict[str, Any], b: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(a)
    for k, v in b.items():
        out[k] = deep_merge(out[k], v) if isinstance(out.get(k), dict) and isinstance(v, Mapping) else v
    return out


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


class Actuator(_Model):
    """One row of the table (see the module docstring). camelCase in ghostgpu.yaml."""

    group: str = Field(description='API group ("" for core, "apps", "ray.io", ...)')
    version: str = Field(
        description="The kind's API version (v1, v1beta1, ...).",
    )
    kind: str = Field(
        pattern=r"^[A-Z][A-Za-z0-9]*$",
        description="The manager kind this row stops (RayCluster, Notebook, ...); a row of a "
        "built-in kind replaces the built-in row.",
    )
    plural: str = Field(
        pattern=r"^[a-z][a-z0-9]*$",
        description="The kind's resource name in the API (rayclusters): for RBAC and the API paths.",
    )
    stop: StopKind = Field(
        description="How the kind is stopped: scale (the scale subresource to 0), annotation (set "
        "`annotation` to `value`), field (set the JSON pointer `field` to `value`) or "
        "none (its controller honours no stop: tracked, escalated, never written).",
    )
    annotation: str | None = Field(None, description="stop: annotation -- the annotation key")
    field: str | None = Field(None, description="stop: field -- the JSON pointer, e.g. /spec/suspend")
    value: str | bool | int | None = Field(
        None, description="the stopped value (annotation: a string, `now` for the current time)"
    )
    restore_value: str | bool | int | None = Field(
        None, description="stop: field -- set on restore when the record has no previous value"
    )
    containers: list[str] = Field(default_factory=list, description="JSON pointers to container lists")
    container: list[str] = Field(default_factory=list, description="JSON pointers to single containers")
    resources: list[str] = Field(
        default_factory=list, description="JSON pointers to resource requirements ({limits, requests})"
    )
    requires: dict[str, str | bool | int] = Field(
        default_factory=dict, description="JSON pointer -> the value it must have for the stop to apply"
    )
    replicas: str | None = Field(
        None, description="JSON pointer of the replica count (`*`: summed over a list), when there is one"
    )
    base_risk: float = Field(
        0.15,
        ge=0.0,
        le=1.0,
        description="The risk gate's base risk of this stop (0 to 1): higher for a stop that is "
        "harder to undo.",
    )
    track: bool = Field(True, description="the Kyverno policy labels objects of this kind")
    note: str = Field(
        "",
        description="Free text for people: why the kind is stopped this way.",
    )

    @field_validator("containers", "container", "resources", "field", "replicas", "requires")
    @classmethod
    def _pointers(cls, v: Any) -> Any:
        for p in v if isinstance(v, list | dict) else [v] if v else []:
            pointer_tokens(p)
        return v

    @model_validator(mode="after")
    def _complete(self) -> Actuator:
        where = f"actuator {self.kind}"
        if self.stop == "annotation":
            if not self.annotation or not isinstance(self.value, str):
                raise ValueError(f"{where}: stop annotation needs `annotation` and a string `value`")
        elif self.stop == "field":
            if not self.field or self.value is None:
                raise ValueError(f"{where}: stop field needs `field` (a JSON pointer) and `value`")
            if not self.field.startswith("/spec/"):
                raise ValueError(f"{where}: `field` must be under /spec/ (got {self.field})")
        elif self.stop == "none":
            if self.annotation or self.field or self.value is not None or self.requires:
                raise ValueError(
                    f"{where}: stop none writes nothing: no `annotation`, `field`, `value`, `requires`"
                )
        elif self.annotation or self.field:
            raise ValueError(f"{where}: stop scale takes no `annotation` or `field`")
        elif self.replicas and "*" in pointer_tokens(self.replicas):
            raise ValueError(f"{where}: a scale stop needs one replica count, not {self.replicas}")
        return self

    # --- identity ---------------------------------------------------------------------------------

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def action_class(self) -> str:
        """The risk gate's action class of this stop (autonomy.actionClasses may override it)."""
        return "scale_to_zero" if self.kind in POD_CONTROLLERS else f"stop_{self.kind.lower()}"

    # --- what the stop writes (consumed by the GitOps pre-flight and the revert guard) -------------

    @cached_property
    def writes(self) -> list[str]:
        """The JSON pointers the stop changes on the top object."""
        if self.stop == "none":
            return []
        if self.stop == "scale":
            return [self.replicas or "/spec/replicas"]
        if self.stop == "annotation":
            assert self.annotation is not None
            return [f"/metadata/annotations/{pointer_escape(self.annotation)}"]
        assert self.field is not None
        return [self.field]

    def is_stopped(self, obj: Mapping[str, Any]) -> bool:
        """Whether `obj` is stopped the way this actuator stops it."""
        if self.stop == "none":
            return False
        if self.stop == "scale":
            got = get_pointer(obj, self.writes[0])
            return got is not _MISSING and got == 0
        if self.stop == "annotation":
            ann = (obj.get("metadata") or {}).get("annotations") or {}
            assert self.annotation is not None
            if self.annotation not in ann:
                return False
            return self.value == NOW or ann[self.annotation] == self.value
        assert self.field is not None
        return get_pointer(obj, self.field) == self.value

    def can_stop(self, obj: Mapping[str, Any]) -> bool:
        """Whether the stop applies to `obj`: the kind has one and `obj` meets its `requires`."""
        return self.stop != "none" and all(get_pointer(obj, p) == v for p, v in self.requires.items())

    # --- the writes --------------------------------------------------------------------------------

    def record_of(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """What the stop overwrites: {pointer: previous value or None when absent}."""
        out: dict[str, Any] = {}
        for p in self.writes:
            got = get_pointer(obj, p)
            out[p] = None if got is _MISSING else got
        return out

    def stop_patch(self, obj: Mapping[str, Any], *, now: datetime | None = None) -> dict[str, Any]:
        """One merge patch (annotation/field actuators): the stop and its record, together, so the
        object is never stopped without the record restore needs."""
        assert self.stop != "scale"
        record = json.dumps(self.record_of(obj), sort_keys=True, separators=(",", ":"))
        value: Any = self.value
        if self.stop == "annotation" and value == NOW:
            value = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        stop = merge_patch_for(self.writes[0], value)
        at = (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")
        # reclaimed-at: when the record was written (the revert guard compares a revert's time to it)
        ann = {RECLAIMED_FROM_RECORD: record, RECLAIMED_AT: at, REVERT_MARK: None}
        return deep_merge({"metadata": {"annotations": ann}}, stop)

    def restore_patch(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """The merge patch that undoes stop_patch from the record on `obj`. Raises ValueError
        when there is no readable record."""
        ann = (obj.get("metadata") or {}).get("annotations") or {}
        raw = ann.get(RECLAIMED_FROM_RECORD)
        if raw is None:
            raise ValueError(f"no {RECLAIMED_FROM_RECORD} annotation: not reclaimed")
        try:
            record = json.loads(raw)
        except ValueError as exc:
            raise ValueError(f"{RECLAIMED_FROM_RECORD}={raw!r} is not JSON") from exc
        if not isinstance(record, dict) or set(record) != set(self.writes):
            raise ValueError(f"{RECLAIMED_FROM_RECORD}={raw!r} does not record {self.writes}")
        patch: dict[str, Any] = {
            "metadata": {"annotations": {RECLAIMED_FROM_RECORD: None, RECLAIMED_AT: None}}
        }
        for p, previous in record.items():
            if previous is None and self.stop == "field" and self.restore_value is not None:
                previous = self.restore_value
            patch = deep_merge(patch, merge_patch_for(p, previous))
        return patch

    # --- GPUs in the object's pod templates --------------------------------------------------------

    def container_specs(self, obj: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        out: list[Mapping[str, Any]] = []
        for p in self.containers:
            for lst in expand(obj, p):
                out.extend(c for c in lst or [] if isinstance(c, Mapping))
        for p in self.container:
            out.extend(c for c in expand(obj, p) if isinstance(c, Mapping))
        for p in self.resources:  # bare requirements, seen as a container that asks for them
            out.extend({"resources": r} for r in expand(obj, p) if isinstance(r, Mapping))
        return out

    # --- RBAC -------------------------------------------------------------------------------------

    def rbac_rules(self) -> list[dict[str, Any]]:
        """What the controller needs in an opted-in namespace: read and patch the object (verdict
        annotations, the record, annotation/field stops); the scale subresource for `scale`; nothing
        for `none`, which is never written."""
        if self.stop == "none":
            return []
        rules = [{"apiGroups": [self.group], "resources": [self.plural], "verbs": ["get", "patch"]}]
        if self.stop == "scale":
            rules.append(
                {"apiGroups": [self.group], "resources": [f"{self.plural}/scale"], "verbs": ["get", "patch"]}
            )
        return rules


def describe_stop(a: Actuator) -> str:
    """The stop in a few words, for Events and the risk gate's description."""
    if a.stop == "annotation":
        return f"annotation {a.annotation}={a.value}"
    if a.stop == "field":
        return f"{a.field}={a.value}"
    if a.stop == "none":
        return "no stop its controller honours"
    return "scale to 0"


# Container lists of the common pod-template shapes.
_TEMPLATE = ["/spec/template/spec/containers", "/spec/template/spec/initContainers"]


def builtin_actuators() -> list[Actuator]:
    """The documented built-ins (docs/managers.md), from each project's own stop API."""
    a = Actuator
    return [
        a(group="apps", version="v1", kind="Deployment", plural="deployments", stop="scale",
          replicas="/spec/replicas", containers=_TEMPLATE, base_risk=0.15,
          note="an HPA above it stops scaling at 0: ScalingDisabled"),
        a(group="apps", version="v1", kind="StatefulSet", plural="statefulsets", stop="scale",
          replicas="/spec/replicas", containers=_TEMPLATE, base_risk=0.15),
        a(group="kubeflow.org", version="v1", kind="Notebook", plural="notebooks", stop="annotation",
          annotation="kubeflow-resource-stopped", value=NOW, containers=_TEMPLATE, base_risk=0.15,
          note="what Kubeflow's own culler writes; the Notebook controller scales its StatefulSet to 0"),
        a(group="kubeflow.org", version="v1beta1", kind="Workspace", plural="workspaces", stop="field",
          field="/spec/paused", value=True, restore_value=False, base_risk=0.15, track=False,
          note="Kubeflow Notebooks 2.0; the GPU is in its WorkspaceKind, so the StatefulSet is tracked"),
        a(group="ray.io", version="v1", kind="RayCluster", plural="rayclusters", stop="field",
          field="/spec/suspend", value=True, restore_value=False, base_risk=0.15,
          replicas="/spec/workerGroupSpecs/*/replicas",
          containers=["/spec/headGroupSpec/template/spec/containers",
                      "/spec/workerGroupSpecs/*/template/spec/containers"],
          note="KubeRay deletes every pod of a suspended RayCluster and keeps the object"),
        a(group="leaderworkerset.x-k8s.io", version="v1", kind="LeaderWorkerSet",
          plural="leaderworkersets", stop="scale", replicas="/spec/replicas", base_risk=0.15,
          containers=["/spec/leaderWorkerTemplate/leaderTemplate/spec/containers",
                      "/spec/leaderWorkerTemplate/workerTemplate/spec/containers"]),
        a(group="serving.kserve.io", version="v1beta1", kind="InferenceService",
          plural="inferenceservices", stop="annotation", annotation="serving.kserve.io/stop",
          value="true", containers=["/spec/predictor/containers"], container=["/spec/predictor/model"],
          base_risk=0.3, note="KServe deletes the predictor's Deployment (restore re-creates it)"),
        a(group="apps.nvidia.com", version="v1alpha1", kind="NIMService", plural="nimservices",
          stop="field", field="/spec/replicas", value=0, restore_value=1, container=["/spec"],
          replicas="/spec/replicas", base_risk=0.15),
        a(group="ray.io", version="v1", kind="RayJob", plural="rayjobs", stop="field",
          field="/spec/suspend", value=True, restore_value=False, base_risk=0.3,
          requires={"/spec/shutdownAfterJobFinishes": True},
          replicas="/spec/rayClusterSpec/workerGroupSpecs/*/replicas",
          containers=["/spec/rayClusterSpec/headGroupSpec/template/spec/containers",
                      "/spec/rayClusterSpec/workerGroupSpecs/*/template/spec/containers"],
          note="KubeRay deletes the RayJob's RayCluster and submitter and submits the job again from "
               "the start on resume; it fails a suspended RayJob without shutdownAfterJobFinishes"),
        a(group="ray.io", version="v1", kind="RayService", plural="rayservices", stop="none",
          replicas="/spec/rayClusterConfig/workerGroupSpecs/*/replicas",
          containers=["/spec/rayClusterConfig/headGroupSpec/template/spec/containers",
                      "/spec/rayClusterConfig/workerGroupSpecs/*/template/spec/containers"],
          note="KubeRay has no stop for a RayService: tracked, counted and escalated"),
        a(group="jobset.x-k8s.io", version="v1alpha2", kind="JobSet", plural="jobsets", stop="field",
          field="/spec/suspend", value=True, restore_value=False, base_risk=0.15,
          replicas="/spec/replicatedJobs/*/replicas",
          containers=["/spec/replicatedJobs/*/template/spec/template/spec/containers",
                      "/spec/replicatedJobs/*/template/spec/template/spec/initContainers"],
          note="the JobSet controller suspends its Jobs (their pods go) and resumes them"),
        a(group="trainer.kubeflow.org", version="v1alpha1", kind="TrainJob", plural="trainjobs",
          stop="field", field="/spec/suspend", value=True, restore_value=False, base_risk=0.15,
          replicas="/spec/trainer/numNodes", resources=["/spec/trainer/resourcesPerNode"],
          note="Kubeflow Trainer v2 suspends the TrainJob's JobSet; the GPU may also live in its runtime"),
        a(group="kubeflow.org", version="v1", kind="PyTorchJob", plural="pytorchjobs", stop="field",
          field="/spec/runPolicy/suspend", value=True, restore_value=False, base_risk=0.15,
          replicas="/spec/pytorchReplicaSpecs/Worker/replicas",
          containers=["/spec/pytorchReplicaSpecs/Master/template/spec/containers",
                      "/spec/pytorchReplicaSpecs/Worker/template/spec/containers"],
          note="the Training Operator deletes a suspended job's pods and services"),
        a(group="serving.kserve.io", version="v1alpha2", kind="LLMInferenceService",
          plural="llminferenceservices", stop="annotation", annotation="serving.kserve.io/stop",
          value="true", base_risk=0.3, replicas="/spec/replicas",
          containers=["/spec/template/containers", "/spec/worker/containers",
                      "/spec/prefill/template/containers", "/spec/prefill/worker/containers"],
          note="KServe deletes the workloads of a stopped LLMInferenceService (restore re-creates them)"),
        a(group="keda.sh", version="v1alpha1", kind="ScaledObject", plural="scaledobjects",
          stop="annotation", annotation="autoscaling.keda.sh/paused-replicas", value="0",
          base_risk=0.15, track=False,
          note="KEDA scales its target to 0 and holds it there; the target is tracked"),
    ]  # fmt: skip


class ActuatorTable:
    """The built-ins plus the ones from `controller.actuators` (a user row replaces a built-in of
    the same kind). Kinds are unique: the pod cache knows an owner by kind."""

    def __init__(self, extra: Iterable[Actuator] = ()) -> None:
        rows = {a.kind: a for a in builtin_actuators()}
        for a in extra:
            rows[a.kind] = a
        self.by_kind: dict[str, Actuator] = dict(sorted(rows.items()))

    def get(self, kind: str) -> Actuator | None:
        return self.by_kind.get(kind)

    @property
    def managers(self) -> list[Actuator]:
        """Kinds above Deployment/StatefulSet (the controller watches them; Kyverno tracks them)."""
        return [a for a in self.by_kind.values() if a.kind not in POD_CONTROLLERS]

    def rbac_rules(self) -> list[dict[str, Any]]:
        """One rule per (group, resources, verbs), merged and sorted: deterministic output."""
        merged: dict[tuple[str, tuple[str, ...]], set[str]] = {}
        for a in self.by_kind.values():
            for r in a.rbac_rules():
                merged.setdefault((r["apiGroups"][0], tuple(r["verbs"])), set()).update(r["resources"])
        return [
            {"apiGroups": [g], "resources": sorted(res), "verbs": list(verbs)}
            for (g, verbs), res in sorted(merged.items())
        ]

    def read_rules(self) -> list[dict[str, Any]]:
        """Cluster-wide read of the manager kinds (the controller watches them to resolve owners)."""
        by_group: dict[str, set[str]] = {}
        for a in self.managers:
            by_group.setdefault(a.group, set()).add(a.plural)
        return [
            {"apiGroups": [g], "resources": sorted(res), "verbs": ["get", "list", "watch"]}
            for g, res in sorted(by_group.items())
        ]

    def tracked(self) -> list[Actuator]:
        return [a for a in self.managers if a.track and (a.containers or a.container or a.resources)]


_TABLES: dict[int, tuple[Sequence[Actuator], ActuatorTable]] = {}


def table_from(extra: Sequence[Actuator] | None) -> ActuatorTable:
    """The table for `controller.actuators` (built once per config object: the planner asks for
    it per workload)."""
    extra = extra or []
    hit = _TABLES.get(id(extra))
    if hit is not None and hit[0] is extra:
        return hit[1]
    table = ActuatorTable(extra)
    _TABLES[id(extra)] = (extra, table)
    return table


# --- the Kyverno tracking policy's GPU test, from the same pointers -------------------------------


def _cel_path(root: str, tokens: Sequence[str]) -> str:
    return root + "".join(f".?{t}" for t in tokens)


def _cel_for(pointer: str, gpu: str, *, single: bool, depth: int = 0) -> str:
    """CEL: some container at `pointer` (from `object`) satisfies `gpu` (a CEL predicate of `c`)."""
    toks = pointer_tokens(pointer)
    root = "object" if depth == 0 else f"x{depth - 1}"
    if "*" in toks:
        i = toks.index("*")
        rest = "/" + "/".join(toks[i + 1 :]) if i + 1 < len(toks) else ""
        if rest:
            inner = _cel_for(rest, gpu, single=single, depth=depth + 1)
        else:  # the list's elements are the containers themselves
            inner = gpu.replace("c.", f"x{depth}.")
        return f"{_cel_path(root, toks[:i])}.orValue([]).exists(x{depth}, {inner})"
    if single:
        return f"[{_cel_path(root, toks)}.orValue({{}})].exists(c, {gpu})"
    return f"{_cel_path(root, toks)}.orValue([]).exists(c, {gpu})"


def gpu_cel(a: Actuator, resources_cel: str) -> str:
    """True when an object of this kind requests a GPU in one of its pod templates."""
    gpu = (
        f"{resources_cel}.exists(r, r in c.?resources.?limits.orValue({{}}) "
        "|| r in c.?resources.?requests.orValue({}))"
    )
    parts = [_cel_for(p, gpu, single=False) for p in a.containers]
    parts += [_cel_for(p, gpu, single=True) for p in a.container]
    bare = f"{resources_cel}.exists(r, r in c.?limits.orValue({{}}) || r in c.?requests.orValue({{}}))"
    parts += [_cel_for(p, bare, single=True) for p in a.resources]
    return " || ".join(parts) if parts else "false"


# Container lists live in a PodSpec: their parent is where the pod names its ResourceClaims.
_POD_SPEC_LISTS = ("containers", "initContainers")


def pod_spec_pointers(a: Actuator) -> list[str]:
    """The pod specs of this kind's templates: the parents of its container lists, in table order.
    A single container (`container`) or bare requirements (`resources`) name no pod spec."""
    out: list[str] = []
    for p in a.containers:
        parent, _, last = p.rpartition("/")
        if last in _POD_SPEC_LISTS and parent and parent not in out:
            out.append(parent)
    return out


def claim_cel(a: Actuator, claim: str) -> str:
    """True when a `resourceClaims` entry (`c`) of one of this kind's pod specs satisfies `claim`."""
    parts = [_cel_for(f"{s}/resourceClaims", claim, single=False) for s in pod_spec_pointers(a)]
    return " || ".join(parts) if parts else "false"
