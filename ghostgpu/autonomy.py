"""Risk-gated autonomy: score an action, decide act-alone vs escalate, calibrate the thresholds.

Pure (docs/design.md#rooms-and-doors): no I/O, no clock, no Kubernetes. The controller builds
`WorkloadFacts`, calls `decide_action()` and obeys the `Decision`; `ghostgpu calibrate` feeds
labelled incidents to `calibrate()` and prints the thresholds that go back into `AutonomyConfig`.

The score (after the published safe-autonomy method for Kubernetes remediation) is a
weighted sum of terms that are each normalised to [0, 1]:

    score = w.base_risk        * base risk of the action class (reversibility, config table)
          + w.manifest_lines   * min(1, manifest YAML lines / scale.manifest_lines)
          + w.gpus             * min(1, GPUs touched        / scale.gpus)
          + w.replicas         * min(1, replicas touched    / scale.replicas)
          + w.volumes          * min(1, volumes attached    / scale.volumes)
          + w.admission_policy * [the action touches a cluster-wide admission policy]
          + w.cross_tenant     * [the action crosses a tenant boundary]

With the default weights (they sum to 1) the score lies in [0, 1]. An action runs alone only when
`score < tau`, where tau is the threshold of its verdict/incident type (falling back to the global
tau); everything else is escalated to a person. Scores are rounded to 6 decimals so that a score
and a threshold printed with the same digits compare the way they read.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator, model_validator
from pydantic.alias_generators import to_camel

_ROUND = 6  # decimals kept in scores and thresholds (see module docstring)

UnitFloat = Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]
NonNegFloat = Annotated[float, Field(ge=0.0, allow_inf_nan=False)]
PosFloat = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]


class _Model(BaseModel):
    # camelCase keys in ghostgpu.yaml like the rest of the file (tauByType); snake_case in Python.
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


def normalise_type(name: str) -> str:
    """Canonical spelling of an incident/verdict type key: `Node pressure` -> `node_pressure`.

    Verdict kinds keep their meaning (`FINISHED_IDLE` -> `finished_idle`), so one table
    `tau_by_type` can hold both calibrated incident types and the controller's verdict kinds.
    """
    key = "_".join(name.strip().lower().replace("-", " ").replace("_", " ").split())
    if not key:
        raise ValueError("an incident/verdict type must be a non-empty name")
    return key


# --- the action-class table ---------------------------------------------------------------------


class ActionClass(StrEnum):
    """The remediation actions the gate knows by default (config may add more by name)."""

    ANNOTATE = "annotate"
    EVENT = "event"
    NOTIFY = "notify"
    SCALE_TO_ZERO = "scale_to_zero"
    RESTART_POD = "restart_pod"
    CORDON_NODE = "cordon_node"
    EVICT_POD = "evict_pod"
    PATCH_CLUSTERQUEUE_QUOTA = "patch_clusterqueue_quota"
    DISABLE_ADMISSION_POLICY = "disable_admission_policy"
    PREEMPT_OTHER_TENANT = "preempt_other_tenant"
    DELETE_PVC_POD = "delete_pvc_pod"


# The eight remediation classes of the published incident set.
REMEDIATION_CLASSES: tuple[ActionClass, ...] = (
    ActionClass.SCALE_TO_ZERO,
    ActionClass.EVICT_POD,
    ActionClass.RESTART_POD,
    ActionClass.CORDON_NODE,
    ActionClass.DELETE_PVC_POD,
    ActionClass.PATCH_CLUSTERQUEUE_QUOTA,
    ActionClass.DISABLE_ADMISSION_POLICY,
    ActionClass.PREEMPT_OTHER_TENANT,
)


class ActionClassSpec(_Model):
    """One row of the action-class table.

    `base_risk` grades reversibility: 0 = leaves no trace a person would need to undo,
    1 = cannot be undone and destroys data. `touches_admission_policy` / `crosses_tenant` mark
    classes that always do so, whatever the target (the facts can add either per action).
    `observational` classes (annotate, Event, notify) do not change the target's behaviour.
    """

    base_risk: UnitFloat = Field(
        description="How hard the action is to undo: 0 leaves nothing a person must undo, 1 cannot "
        "be undone and destroys data.",
    )
    touches_admission_policy: bool = Field(
        False,
        description="The class always touches a cluster-wide admission policy (adds that term to the score).",
    )
    crosses_tenant: bool = Field(
        False,
        description="The class always crosses a tenant boundary (adds that term to the score).",
    )
    observational: bool = Field(
        False,
        description="The class does not change the target's behaviour (annotate, Event, notify): it "
        "may run for any verdict.",
    )
    description: str = Field(
        "",
        description="What the action does, for people.",
    )


def default_action_classes() -> dict[str, ActionClassSpec]:
    """The documented default table (docs/autonomy.md)."""
    s = ActionClassSpec
    return {
        ActionClass.ANNOTATE: s(
            base_risk=0.0, observational=True, description="write ghostgpu.io/* annotations; trivially undone"
        ),
        ActionClass.EVENT: s(
            base_risk=0.0,
            observational=True,
            description="emit a Kubernetes Event; no effect on the workload",
        ),
        ActionClass.NOTIFY: s(
            base_risk=0.0, observational=True, description="message the owner; no effect on the workload"
        ),
        ActionClass.SCALE_TO_ZERO: s(
            base_risk=0.15,
            description=(
                "scale a Deployment/StatefulSet to 0; previous replicas recorded, `ghostgpu restore` "
                "undoes it"
            ),
        ),
        ActionClass.RESTART_POD: s(
            base_risk=0.3,
            description=("delete a controller-owned pod so it is recreated; in-memory state is lost"),
        ),
        ActionClass.CORDON_NODE: s(
            base_risk=0.35,
            description=(
                "cordon a GPU node; uncordon undoes it but every tenant's scheduling on it is affected"
            ),
        ),
        ActionClass.EVICT_POD: s(
            base_risk=0.5,
            description=("evict a pod; a bare pod is not recreated, so for bare pods this is irreversible"),
        ),
        ActionClass.PATCH_CLUSTERQUEUE_QUOTA: s(
            base_risk=0.5,
            touches_admission_policy=True,
            description=(
                "patch a ClusterQueue's nominal quota; GitOps re-sync restores it, admissions and "
                "preemptions made meanwhile stay"
            ),
        ),
        ActionClass.DISABLE_ADMISSION_POLICY: s(
            base_risk=0.7,
            touches_admission_policy=True,
            description=(
                "disable a cluster-wide Kyverno/Kueue admission rule; objects admitted while it is "
                "off are never re-checked"
            ),
        ),
        ActionClass.PREEMPT_OTHER_TENANT: s(
            base_risk=0.8,
            crosses_tenant=True,
            description=("preempt another tenant's workload; its progress since the last checkpoint is gone"),
        ),
        ActionClass.DELETE_PVC_POD: s(
            base_risk=0.9,
            description=("delete a pod backed by a PersistentVolumeClaim together with its claim: data loss"),
        ),
    }


# --- weights, scales, the config model -----------------------------------------------------------


class RiskWeights(_Model):
    """Weights of the score terms. The defaults sum to 1, so scores lie in [0, 1]."""

    base_risk: NonNegFloat = Field(
        0.45,
        description="Weight of the action class's base risk (how hard it is to undo).",
    )
    manifest_lines: NonNegFloat = Field(
        0.10,
        description="Weight of the target's manifest size (its YAML line count).",
    )
    gpus: NonNegFloat = Field(
        0.10,
        description="Weight of the GPUs the action touches.",
    )
    replicas: NonNegFloat = Field(
        0.05,
        description="Weight of the replicas the action touches.",
    )
    volumes: NonNegFloat = Field(
        0.05,
        description="Weight of the volumes attached to the target.",
    )
    admission_policy: NonNegFloat = Field(
        0.10,
        description="Weight of touching a cluster-wide admission policy.",
    )
    cross_tenant: NonNegFloat = Field(
        0.15,
        description="Weight of crossing a tenant boundary.",
    )

    @model_validator(mode="after")
    def _some_weight(self) -> RiskWeights:
        if sum(self.model_dump().values()) <= 0:
            raise ValueError("autonomy.weights: at least one weight must be positive")
        return self


class BlastScale(_Model):
    """The count at which each blast-radius term saturates at 1 (`min(1, count / scale)`).

    manifest_lines: 200 lines is a large Deployment/ClusterQueue/ClusterPolicy (the publication
    normalises the blast radius by the manifest's YAML line count); gpus: 8 = one full GPU node;
    replicas: 8; volumes: 4 attached volumes (PVCs, volumeClaimTemplates).
    """

    manifest_lines: PosFloat = Field(
        200.0,
        description="Manifest lines that count as a full blast radius (200: a large Deployment or "
        "ClusterPolicy).",
    )
    gpus: PosFloat = Field(
        8.0,
        description="GPUs that count as a full blast radius (8: one full GPU node).",
    )
    replicas: PosFloat = Field(
        8.0,
        description="Replicas that count as a full blast radius.",
    )
    volumes: PosFloat = Field(
        4.0,
        description="Attached volumes (PVCs, volumeClaimTemplates) that count as a full blast radius.",
    )


class CalibrationSettings(_Model):
    """Inputs of `ghostgpu calibrate` (published values as defaults)."""

    ceiling: UnitFloat = Field(
        0.02,
        description="The highest tolerated rate of dangerous incidents handled without a person; "
        "calibrate picks the thresholds that keep to it.",
    )
    # pooled: the ceiling bounds the whole per-type policy, like the global tau (never worse than it);
    # each: every incident type must keep to the ceiling on its own (stricter: no type may spend the
    # budget of the others, but per-type can then lose to the global tau).
    per_type_ceiling: Literal["pooled", "each"] = Field(
        "pooled",
        description="pooled: the ceiling bounds the per-type thresholds together (never worse than "
        "the global tau); each: every incident type keeps to it on its own (stricter).",
    )
    autonomous_latency_seconds: PosFloat = Field(
        40.0,
        description="Time to repair when the controller acts alone, for the MTTR calibrate reports.",
    )
    escalation_latency_seconds: PosFloat = Field(
        1200.0,
        description="Time to repair when a person is paged; at least autonomousLatencySeconds.",
    )
    tau_step: PosFloat = Field(
        0.025,
        description="Step of the threshold grid calibrate sweeps.",
    )
    tau_max: PosFloat = Field(
        1.0,
        description="Top of the threshold grid (extended past the largest score if needed).",
    )

    @model_validator(mode="after")
    def _latencies(self) -> CalibrationSettings:
        if self.autonomous_latency_seconds > self.escalation_latency_seconds:
            raise ValueError(
                "autonomy.calibration: autonomous_latency_seconds must not exceed escalation_latency_seconds"
            )
        return self


class EscalationSettings(_Model):
    """Where escalations go besides the Event and the `ghostgpu.io/escalated` annotation."""

    webhook_url: str | None = Field(
        None,
        description="Alertmanager v2 base URL or full /api/v2/alerts URL that escalations are "
        "POSTed to; none: no webhook.",
    )
    timeout_seconds: PosFloat = Field(
        5.0,
        description="Timeout of one webhook POST; a failed POST never stops the controller, and the "
        "Event and annotation remain.",
    )
    extra_labels: dict[str, str] = Field(
        default_factory=dict,
        description="Labels added to every escalation alert, e.g. {cluster: prod-a}.",
    )  # e.g. {"cluster": "prod-a"}


class AutonomyConfig(_Model):
    """The `controller.autonomy` section of ghostgpu.yaml.

    tau: global threshold, used for every type without its own entry. The default 0.275 is the
    global tau that `ghostgpu calibrate` yields on the built-in incident set with the default
    weights and a 2 % ceiling (docs/autonomy.md; the publication's own set gave 0.325).
    tau_by_type: per verdict kind (FINISHED_IDLE, ZOMBIE_CRASHED, ...) or incident type
    (node_pressure, ...); keys are normalised (`normalise_type`).
    autonomous_verdicts: verdict kinds for which a non-observational action may run alone at all;
    for any other verdict (ACTIVE, IDLE_HELD, UNKNOWN) only annotate/Event/notify can.
    """

    tau: NonNegFloat = Field(
        0.275,
        description="The global threshold: an action runs without a person only when its risk score "
        "is below it. The default is what `ghostgpu calibrate` yields on the built-in "
        "incident set with a 2 % ceiling.",
    )
    tau_by_type: dict[str, NonNegFloat] = Field(
        default_factory=lambda: {"idle_held": 0.25},
        description="A threshold per verdict kind (FINISHED_IDLE, ...) or incident type, which "
        "takes the place of tau for that type; keys are normalised (node_pressure). The default "
        "holds idle_held, the stop of an idle session (controller.idleSessions): 0.25, what "
        "`ghostgpu calibrate` yields on its idle-session set; a table given here replaces it.",
    )
    weights: RiskWeights = Field(
        default_factory=RiskWeights,
        description="Weights of the score terms.",
    )
    scale: BlastScale = Field(
        default_factory=BlastScale,
        description="The count at which each blast-radius term saturates at 1.",
    )
    action_classes: dict[str, ActionClassSpec] = Field(
        default_factory=default_action_classes,
        description="The action-class table (name -> row); a row given here replaces the built-in "
        "row of that name or adds a class.",
    )
    autonomous_verdicts: list[str] = Field(
        default_factory=lambda: ["FINISHED_IDLE", "ZOMBIE_CRASHED"],
        description="Verdict kinds for which an action that changes the workload may run without a "
        "person at all; for any other (ACTIVE, IDLE_HELD, UNKNOWN) only observational "
        "actions can.",
    )
    calibration: CalibrationSettings = Field(
        default_factory=CalibrationSettings,
        description="Inputs of `ghostgpu calibrate`.",
    )
    escalation: EscalationSettings = Field(
        default_factory=EscalationSettings,
        description="Where escalations go besides the Event and the ghostgpu.io/escalated annotation.",
    )

    @field_validator("tau_by_type")
    @classmethod
    def _normalise_keys(cls, value: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, tau in value.items():
            norm = normalise_type(key)
            if norm in out:
                raise ValueError(f"autonomy.tau_by_type: {key!r} duplicates another key once normalised")
            out[norm] = tau
        return out

    @field_validator("action_classes")
    @classmethod
    def _known_defaults_present(cls, value: dict[str, ActionClassSpec]) -> dict[str, ActionClassSpec]:
        # A partial table in ghostgpu.yaml overrides rows; the other defaults stay.
        merged = dict(default_action_classes())
        merged.update({str(k): v for k, v in value.items()})
        return merged

    def spec(self, action: str) -> ActionClassSpec:
        try:
            return self.action_classes[str(action)]
        except KeyError:
            known = ", ".join(sorted(self.action_classes))
            raise ValueError(f"unknown action class {str(action)!r}; known: {known}") from None

    def threshold(self, type_key: str | None) -> tuple[float, str]:
        """(tau, where it came from) for a verdict/incident type; global tau when not listed."""
        if type_key:
            key = normalise_type(type_key)
            if key in self.tau_by_type:
                return self.tau_by_type[key], f"tau_by_type[{key}]"
        return self.tau, "tau (global)"


# --- facts, score, decision ----------------------------------------------------------------------


class WorkloadFacts(_Model):
    """What the gate needs to know about the target of an action (the controller fills it in).

    namespace: None for cluster-scoped targets. manifest_lines: line count of the target's YAML
    (`len(yaml.safe_dump(obj).splitlines())` of the live object minus status/managedFields, or of
    the rendered manifest). gpus/replicas/volumes: what the action touches (for a Deployment:
    GPUs per pod x replicas; volumes = PVCs + volumeClaimTemplates). workload_tenant: tenant that
    owns the target (namespace's `ghostgpu.io/team`); action_tenant: tenant on whose behalf the
    action is taken (None = the platform itself, crosses nothing). admission_policy: the target
    itself is a cluster-wide admission policy (Kyverno ClusterPolicy, ClusterQueue, webhook).
    """

    kind: str = "Pod"
    name: str = ""
    namespace: str | None = None
    gpus: NonNegFloat = 0
    replicas: Annotated[int, Field(ge=0)] = 1
    volumes: Annotated[int, Field(ge=0)] = 0
    manifest_lines: Annotated[int, Field(ge=0)] = 0
    workload_tenant: str | None = None
    action_tenant: str | None = None
    admission_policy: bool = False


_SERVER_METADATA = ("managedFields", "uid", "resourceVersion", "generation", "creationTimestamp", "selfLink")
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"


def manifest_lines(obj: Mapping[str, Any]) -> int:
    """YAML line count of a live object as its owner wrote it, for `WorkloadFacts.manifest_lines`.

    Drops what the API server adds (status, managedFields, uid, resourceVersion, generation,
    creationTimestamp, selfLink, the last-applied annotation) so that the count does not grow
    with the object's history. A dump has no blank or comment lines, which is how the
    calibration counts rendered manifests too.
    """
    clean = {k: v for k, v in obj.items() if k != "status"}
    meta = dict(clean.get("metadata") or {})
    for key in _SERVER_METADATA:
        meta.pop(key, None)
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != _LAST_APPLIED}
    if annotations:
        meta["annotations"] = annotations
    else:
        meta.pop("annotations", None)
    if meta:
        clean["metadata"] = meta
    return len(yaml.safe_dump(clean, sort_keys=False, default_flow_style=False).splitlines())


class RiskTerm(_Model):
    name: str
    value: float  # normalised input in [0, 1]
    weight: float
    contribution: float  # value * weight
    detail: str


class RiskScore(_Model):
    action: str
    score: float
    terms: tuple[RiskTerm, ...]

    def explain(self) -> str:
        parts = [f"{t.name}={t.value:.3g}x{t.weight:g}" for t in self.terms if t.contribution]
        return f"{self.score:.3f} = " + (" + ".join(parts) if parts else "0")


class Decision(_Model):
    """The gate's answer. `autonomous` is the only field the controller needs to obey."""

    outcome: Literal["autonomous", "escalate"]
    action: str
    verdict: str | None
    score: float
    tau: float
    tau_source: str
    breakdown: RiskScore
    reason: str

    @computed_field  # type: ignore[prop-decorator]
    @property
    def autonomous(self) -> bool:
        return self.outcome == "autonomous"

    @property
    def escalate(self) -> bool:
        return self.outcome == "escalate"

    def summary(self) -> str:
        """One line for shadow-mode reports and Events: what would happen and why."""
        what = "act alone" if self.autonomous else "escalate"
        cmp = "<" if self.autonomous else ">="
        return f"{what}: {self.action} (score {self.score:.3f} {cmp} tau {self.tau:.3f}, {self.tau_source})"


def _saturate(count: float, scale: float) -> float:
    return min(1.0, count / scale)


def score(action: str, facts: WorkloadFacts, config: AutonomyConfig | None = None) -> RiskScore:
    """The transparent risk score of one action on one target (module docstring has the formula)."""
    cfg = config or AutonomyConfig()
    spec = cfg.spec(action)
    w, sc = cfg.weights, cfg.scale
    touches_policy = spec.touches_admission_policy or (facts.admission_policy and not spec.observational)
    other_tenant = (
        facts.workload_tenant is not None
        and facts.action_tenant is not None
        and facts.workload_tenant != facts.action_tenant
    )
    crosses = spec.crosses_tenant or (other_tenant and not spec.observational)
    # Observational actions touch nothing, so blast radius does not apply to them.
    blast = 0.0 if spec.observational else 1.0
    rows = [
        ("base_risk", spec.base_risk, w.base_risk, f"action class {action}"),
        (
            "manifest_lines",
            blast * _saturate(facts.manifest_lines, sc.manifest_lines),
            w.manifest_lines,
            f"{facts.manifest_lines} YAML lines / {sc.manifest_lines:g}",
        ),
        ("gpus", blast * _saturate(facts.gpus, sc.gpus), w.gpus, f"{facts.gpus:g} GPUs / {sc.gpus:g}"),
        (
            "replicas",
            blast * _saturate(facts.replicas, sc.replicas),
            w.replicas,
            f"{facts.replicas} replicas / {sc.replicas:g}",
        ),
        (
            "volumes",
            blast * _saturate(facts.volumes, sc.volumes),
            w.volumes,
            f"{facts.volumes} volumes / {sc.volumes:g}",
        ),
        (
            "admission_policy",
            float(touches_policy),
            w.admission_policy,
            "touches a cluster-wide admission policy" if touches_policy else "no admission policy",
        ),
        (
            "cross_tenant",
            float(crosses),
            w.cross_tenant,
            "crosses a tenant boundary" if crosses else "same tenant",
        ),
    ]
    terms = tuple(
        RiskTerm(name=n, value=round(v, _ROUND), weight=wt, contribution=round(v * wt, _ROUND), detail=d)
        for n, v, wt, d in rows
    )
    total = round(sum(v * wt for _, v, wt, _ in rows), _ROUND)
    return RiskScore(action=str(action), score=total, terms=terms)


def decide(risk: RiskScore, type_key: str | None, config: AutonomyConfig | None = None) -> Decision:
    """Autonomous iff `risk.score < tau(type_key)`; otherwise escalate. Strict `<`: tau = 0 never acts."""
    cfg = config or AutonomyConfig()
    tau, source = cfg.threshold(type_key)
    alone = risk.score < tau
    cmp = "<" if alone else ">="
    reason = f"score {risk.score:.3f} {cmp} {source} {tau:.3f}: " + (
        "cheap enough to act alone" if alone else "escalated to a person"
    )
    return Decision(
        outcome="autonomous" if alone else "escalate",
        action=risk.action,
        verdict=type_key,
        score=risk.score,
        tau=tau,
        tau_source=source,
        breakdown=risk,
        reason=reason,
    )


def decide_action(
    verdict: str, action: str, facts: WorkloadFacts, config: AutonomyConfig | None = None
) -> Decision:
    """The controller's one call: gate `action` on the target described by `facts`.

    `verdict` is the verdict kind (`VerdictKind` value, e.g. "FINISHED_IDLE"); its tau comes from
    `tau_by_type[verdict]`, else the global tau. Belt and braces for docs/design.md#action: for a
    verdict not in `autonomous_verdicts` (ACTIVE, IDLE_HELD, UNKNOWN) a non-observational action is
    always escalated, whatever its score. Raises ValueError only for an unknown action class.
    """
    cfg = config or AutonomyConfig()
    risk = score(action, facts, cfg)
    decision = decide(risk, str(verdict), cfg)
    allowed = {normalise_type(v) for v in cfg.autonomous_verdicts}
    if (
        decision.autonomous
        and not cfg.spec(action).observational
        and normalise_type(str(verdict)) not in allowed
    ):
        return decision.model_copy(
            update={
                "outcome": "escalate",
                "reason": f"verdict {verdict} is not in autonomous_verdicts, a person decides "
                f"({decision.reason})",
            }
        )
    return decision


# --- calibration ---------------------------------------------------------------------------------


class ScoredIncident(_Model):
    """One labelled event for calibration: its type, its risk score, and whether it is dangerous."""

    incident_type: str
    score: NonNegFloat
    dangerous: bool
    label: str = ""  # e.g. "ClusterQueue/team-a x evict_pod", for tables and errors


class SweepPoint(_Model):
    tau: float
    events: int
    dangerous: int
    autonomous: int
    dangerous_autonomous: int
    catastrophic_rate: float  # dangerous_autonomous / dangerous (0 when there is no dangerous event)
    mttr_reduction: float  # 1 - mean(latency under the policy) / escalation latency


class Threshold(_Model):
    """The chosen tau for one scope (global or one incident type) and what it yields there."""

    scope: str
    tau: float | None  # None for the combined per-type policy (each type has its own tau)
    events: int
    dangerous: int
    autonomous: int
    dangerous_autonomous: int
    catastrophic_rate: float
    mttr_reduction: float


class FrontierPoint(_Model):
    tau: float
    catastrophic_rate: float
    mttr_reduction: float
    strict: bool  # also strictly Pareto-optimal (no point at least as good on both, better on one)


class CalibrationResult(_Model):
    settings: CalibrationSettings
    grid: tuple[float, ...]
    global_threshold: Threshold
    global_sweep: tuple[SweepPoint, ...]
    per_type: tuple[Threshold, ...]  # sorted by type name
    per_type_sweeps: dict[str, tuple[SweepPoint, ...]]
    per_type_overall: Threshold  # the per-type taus together, over all events
    per_type_mean_mttr_reduction: float  # unweighted mean over types (how the publication reports it)
    frontier: tuple[FrontierPoint, ...]  # global sweep, from always-escalate to always-autonomous

    def tau_by_type(self) -> dict[str, float]:
        return {t.scope: t.tau for t in self.per_type}


def tau_grid(settings: CalibrationSettings, max_score: float = 0.0) -> tuple[float, ...]:
    """0, step, 2*step, ... up to tau_max, extended until one tau lies strictly above `max_score`,
    so the grid always contains always-escalate (tau = 0) and always-autonomous."""
    taus: list[float] = []
    i = 0
    while True:
        tau = round(i * settings.tau_step, _ROUND)
        taus.append(tau)
        if tau >= settings.tau_max - 1e-12 and tau > max_score:
            return tuple(taus)
        i += 1


def _point(tau: float, events: Sequence[ScoredIncident], s: CalibrationSettings) -> SweepPoint:
    dangerous = sum(e.dangerous for e in events)
    alone = [e for e in events if e.score < tau]
    d_alone = sum(e.dangerous for e in alone)
    return SweepPoint(
        tau=tau,
        events=len(events),
        dangerous=dangerous,
        autonomous=len(alone),
        dangerous_autonomous=d_alone,
        catastrophic_rate=d_alone / dangerous if dangerous else 0.0,
        mttr_reduction=_mttr_reduction(len(alone), len(events), s),
    )


def _mttr_reduction(autonomous: int, events: int, s: CalibrationSettings) -> float:
    if events == 0:
        return 0.0
    mean = (
        autonomous * s.autonomous_latency_seconds + (events - autonomous) * s.escalation_latency_seconds
    ) / events
    return 1.0 - mean / s.escalation_latency_seconds


def _within(d_alone: int, dangerous: int, ceiling: float) -> bool:
    # Integer form of d_alone / dangerous <= ceiling, tolerant of binary fractions like 0.02.
    return dangerous == 0 or d_alone <= ceiling * dangerous + 1e-9


def sweep(
    events: Sequence[ScoredIncident], grid: Sequence[float], s: CalibrationSettings
) -> tuple[SweepPoint, ...]:
    return tuple(_point(tau, events, s) for tau in grid)


def _threshold(scope: str, p: SweepPoint) -> Threshold:
    return Threshold(scope=scope, **p.model_dump())


def choose(points: Sequence[SweepPoint], ceiling: float) -> SweepPoint:
    """Among points with catastrophic rate <= ceiling, the highest MTTR reduction; ties -> lowest
    tau (the most conservative threshold that achieves it). tau = 0 is always feasible."""
    feasible = [p for p in points if _within(p.dangerous_autonomous, p.dangerous, ceiling)]
    if not feasible:  # cannot happen when the grid holds tau = 0
        raise ValueError("no threshold meets the ceiling; the tau grid must start at 0")
    return min(feasible, key=lambda p: (-p.autonomous, p.tau))


def pareto_frontier(points: Sequence[SweepPoint]) -> tuple[FrontierPoint, ...]:
    """Weak Pareto frontier of (catastrophic rate down, MTTR reduction up) over the sweep.

    A point is on it unless another point is strictly better on both objectives; duplicates keep
    their lowest tau. Sorted by rate then MTTR reduction, so it runs from always-escalate (tau = 0:
    0 % / 0 %) to always-autonomous (max MTTR reduction, every dangerous event handled alone).
    `strict` marks the corners that are also strictly Pareto-optimal.
    """
    unique: dict[tuple[float, float], SweepPoint] = {}
    for p in sorted(points, key=lambda p: p.tau):
        unique.setdefault((p.catastrophic_rate, p.mttr_reduction), p)
    pts = list(unique.values())

    def beats(a: SweepPoint, b: SweepPoint, strictly_both: bool) -> bool:
        if strictly_both:
            return a.catastrophic_rate < b.catastrophic_rate and a.mttr_reduction > b.mttr_reduction
        return (
            a.catastrophic_rate <= b.catastrophic_rate
            and a.mttr_reduction >= b.mttr_reduction
            and (a.catastrophic_rate, a.mttr_reduction) != (b.catastrophic_rate, b.mttr_reduction)
        )

    out = [
        FrontierPoint(
            tau=p.tau,
            catastrophic_rate=p.catastrophic_rate,
            mttr_reduction=p.mttr_reduction,
            strict=not any(beats(q, p, False) for q in pts),
        )
        for p in pts
        if not any(beats(q, p, True) for q in pts)
    ]
    return tuple(sorted(out, key=lambda f: (f.catastrophic_rate, f.mttr_reduction, f.tau)))


def _joint_per_type(
    sweeps: dict[str, tuple[SweepPoint, ...]], dangerous_total: int, ceiling: float
) -> dict[str, SweepPoint]:
    """Per-type taus under the SAME ceiling as the global tau: the ceiling bounds the catastrophic
    rate of the whole policy (dangerous handled alone / all dangerous events).

    Multiple-choice knapsack by dynamic programming over the budget of dangerous events that may
    be handled alone. Setting every type to the global tau is one candidate, so the per-type
    policy can never yield less MTTR reduction than the global one. Objective, in order: most
    autonomous events, fewest dangerous handled alone, lowest taus (most conservative).
    """
    budget = 0 if dangerous_total == 0 else math.floor(ceiling * dangerous_total + 1e-9)
    # best[b] = (objective tuple, choice per type) using at most b dangerous-autonomous events
    best: list[tuple[tuple[int, int, float], dict[str, SweepPoint]] | None] = [((0, 0, 0.0), {})] * (
        budget + 1
    )
    for name, points in sweeps.items():
        nxt: list[tuple[tuple[int, int, float], dict[str, SweepPoint]] | None] = [None] * (budget + 1)
        for b in range(budget + 1):
            prev = best[b]
            if prev is None:
                continue
            for p in points:
                cost = p.dangerous_autonomous if dangerous_total else 0
                if b + cost > budget:
                    continue
                obj = (prev[0][0] + p.autonomous, prev[0][1] - p.dangerous_autonomous, prev[0][2] - p.tau)
                cur = nxt[b + cost]
                if cur is None or obj > cur[0]:
                    nxt[b + cost] = (obj, {**prev[1], name: p})
        best = nxt
    winner = max((x for x in best if x is not None), key=lambda x: x[0])
    return winner[1]


def calibrate(
    events: Iterable[ScoredIncident], settings: CalibrationSettings | None = None
) -> CalibrationResult:
    """Sweep the tau grid and choose the global tau and one tau per incident type.

    catastrophic rate = dangerous events handled autonomously / dangerous events. The denominator
    is the dangerous events (not all events) because the question is "of the actions that must not
    run alone, how many did": it does not shrink when safe events are added, and always-autonomous
    reads 100 %. MTTR reduction = 1 - mean(latency under the policy) / escalation latency, i.e.
    against always-escalate; always-autonomous reaches 1 - autonomous/escalation latency.
    """
    s = settings or CalibrationSettings()
    evs = list(events)
    if not evs:
        raise ValueError("calibrate: the incident set is empty")
    grid = tau_grid(s, max(e.score for e in evs))
    global_sweep = sweep(evs, grid, s)
    global_pick = _threshold("global", choose(global_sweep, s.ceiling))

    by_type: dict[str, list[ScoredIncident]] = {}
    for e in evs:
        by_type.setdefault(normalise_type(e.incident_type), []).append(e)
    types = sorted(by_type)
    sweeps = {t: sweep(by_type[t], grid, s) for t in types}
    dangerous_total = sum(e.dangerous for e in evs)
    if s.per_type_ceiling == "each":
        picks = {t: choose(points, s.ceiling) for t, points in sweeps.items()}
    else:
        picks = _joint_per_type(sweeps, dangerous_total, s.ceiling)
    per_type = tuple(_threshold(t, picks[t]) for t in types)
    alone = sum(t.autonomous for t in per_type)
    d_alone = sum(t.dangerous_autonomous for t in per_type)
    overall = Threshold(
        scope="per-type",
        tau=None,
        events=len(evs),
        dangerous=dangerous_total,
        autonomous=alone,
        dangerous_autonomous=d_alone,
        catastrophic_rate=d_alone / dangerous_total if dangerous_total else 0.0,
        mttr_reduction=_mttr_reduction(alone, len(evs), s),
    )
    return CalibrationResult(
        settings=s,
        grid=grid,
        global_threshold=global_pick,
        global_sweep=global_sweep,
        per_type=per_type,
        per_type_sweeps=sweeps,
        per_type_overall=overall,
        per_type_mean_mttr_reduction=sum(t.mttr_reduction for t in per_type) / len(per_type),
        frontier=pareto_frontier(global_sweep),
    )
