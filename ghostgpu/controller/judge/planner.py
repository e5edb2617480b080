"""What to do about one verdict (pure): record it, and whether to reclaim, only pretend (shadow),
leave it alone, or hand it to a person. Every reclaim passes the risk gate of `ghostgpu.autonomy`
and the per-verdict switch of the config; nothing here ever plans a delete.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import yaml

from ghostgpu.actuators import Actuator, ActuatorTable, describe_stop, table_from
from ghostgpu.autonomy import (
    ActionClass,
    ActionClassSpec,
    AutonomyConfig,
    Decision,
    WorkloadFacts,
    decide_action,
)
from ghostgpu.config import ControllerConfig
from ghostgpu.controller.inventory import PodView, Workload
from ghostgpu.verdict import RECLAIMABLE_KINDS, Reason, Verdict, VerdictKind

PLAIN_ACTIVE = (Reason.UTILIZATION_NONZERO,)

ActionKind = Literal[
    "none", "would-reclaim", "scale-to-zero", "evict", "escalate", "disabled", "shared-claim"
]


@dataclass(frozen=True)
class Plan:
    record: bool  # the verdict changed (warm-up UNKNOWN aside): write annotations, emit an Event
    action: ActionKind
    decision: Decision | None = None
    note: str = ""


def shared_claim(pods: Sequence[PodView], own: Iterable[PodView]) -> str | None:
    """Why stopping these pods frees no GPU: a ResourceClaim of theirs that holds GPU devices is also
    used by a pod that is not the workload's (`status.reservedFor`, claims.py `ClaimPeer`; the
    claim controller drops a pod from it once the pod is done). None when no such pod."""
    mine = {p.uid for p in own} | {p.uid for p in pods}
    others = sorted(
        {
            (p.namespace, peer.claim, peer.pod_name or peer.pod_uid)
            for p in pods
            for peer in p.claim_peers
            if peer.pod_uid not in mine
        }
    )
    if not others:
        return None
    ns, claim, pod = others[0]
    more = f" (and {len(others) - 1} more)" if len(others) > 1 else ""
    return f"shared-claim: gpu claim {ns}/{claim} is also used by pod {pod}{more}"


def action_class(workload: Workload) -> ActionClass:
    return ActionClass.EVICT_POD if workload.ref.kind == "Pod" else ActionClass.SCALE_TO_ZERO


def gate_for(
    workload: Workload, autonomy: AutonomyConfig, table: ActuatorTable
) -> tuple[str, AutonomyConfig, Actuator | None]:
    """(action class, the gate's config, actuator) for reclaiming `workload`. A manager's stop is
    scored as its own class, `stop_<kind>` with the actuator's base risk (the KServe stop deletes a
    Deployment: riskier than a scale); a row of that name in autonomy.actionClasses wins."""
    a = None if workload.ref.kind == "Pod" or workload.no_actuator else table.for_ref(workload.ref)
    if a is None:
        return action_class(workload).value, autonomy, None
    name = a.action_class
    if name not in autonomy.action_classes:
        spec = ActionClassSpec(base_risk=a.base_risk, description=f"stop a {a.kind}: {describe_stop(a)}")
        autonomy = autonomy.model_copy(update={"action_classes": {**autonomy.action_classes, name: spec}})
    return name, autonomy, a


def manifest_lines(workload: Workload) -> int:
    obj = {k: v for k, v in workload.raw.items() if k != "status"}
    meta = dict(obj.get("metadata") or {})
    meta.pop("managedFields", None)
    obj["metadata"] = meta
    return len(yaml.safe_dump(obj, sort_keys=True).splitlines())


def facts_for(workload: Workload, team: str | None, dra_gpus: float = 0.0) -> WorkloadFacts:
    """`dra_gpus`: the DRA devices its pods hold (inventory.dra_gpus_of): its template names
    ResourceClaimTemplates, not GPUs, so they are counted from its pods' claims."""
    gpus_per_pod = sum(workload.gpus_per_pod.values())
    return WorkloadFacts(
        kind=workload.ref.kind,
        name=workload.ref.name,
        namespace=workload.ref.namespace,
        gpus=gpus_per_pod * workload.replicas + dra_gpus,
        replicas=workload.replicas,
        volumes=workload.volumes,
        manifest_lines=manifest_lines(workload),
        workload_tenant=team,
        action_tenant=None,  # the platform acts for itself, on behalf of no other tenant
    )


def silent_first(verdict: Verdict, previous: VerdictKind | None) -> bool:
    """A first verdict that is plainly busy: not written (see plan)."""
    return previous is None and verdict.kind is VerdictKind.ACTIVE and verdict.reasons == PLAIN_ACTIVE


def plan(
    workload: Workload,
    verdict: Verdict,
    previous: VerdictKind | None,
    cfg: ControllerConfig,
    *,
    team: str | None = None,
    autonomy: AutonomyConfig | None = None,
    shared: str | None = None,
    dra_gpus: float = 0.0,
) -> Plan:
    """`shared`: the `shared_claim` reason of the workload's pods; a reclaimable verdict is then
    held, in every mode (a shadow "would reclaim" would not be true either). `dra_gpus`: the DRA
    devices the workload's pods hold (facts_for)."""
    # A first verdict of plain ACTIVE (utilization non-zero, nothing else to say) is not recorded:
    # it would change nothing anyone acts on (the controller keeps its verdicts in memory; no
    # annotation still reads as "no finding"), and at fleet scale it was nearly all of a controller
    # start's writes (3 requests per workload: 150,000 at 50,000 pods, two hours at the default
    # apiserver budget). An ACTIVE that says more (a batch gap: zero utilization, live processes;
    # output still growing) is recorded, and so is leaving another recorded verdict for ACTIVE, so a
    # stale finding never stays on a workload.
    record = previous != verdict.kind and not verdict.warming_up and not silent_first(verdict, previous)
    if verdict.kind not in RECLAIMABLE_KINDS:
        return Plan(record, "none")
    if workload.exempt:  # belt and braces: exempt workloads are filtered before judging
        return Plan(record, "none", note="exempt")
    if shared:
        return Plan(record, "shared-claim", note=shared)
    if cfg.mode == "shadow":
        return Plan(record, "would-reclaim", note="shadow mode: nothing touched")
    if not cfg.actions.reclaim.allows(verdict.kind.value):
        return Plan(record, "disabled", note=f"actions.reclaim.{verdict.kind.value} is false")
    return _gated(workload, verdict.kind, record, cfg, team, autonomy or cfg.autonomy, dra_gpus)


def plan_idle_stop(
    workload: Workload,
    cfg: ControllerConfig,
    *,
    team: str | None = None,
    autonomy: AutonomyConfig | None = None,
    dra_gpus: float = 0.0,
) -> Plan:
    """The stop of an idle session whose deadline passed on fresh evidence (`idle_sessions.next_step`
    said stop): the same gate and actuator path as every reclaim, typed IDLE_HELD, so its threshold
    is `autonomy.tauByType.idle_held` (`ghostgpu calibrate` prints it) and a score at or above it
    is escalated. The idle-session policy is the opt-in: only through it may IDLE_HELD act."""
    if workload.exempt:
        return Plan(False, "none", note="exempt")
    if cfg.mode == "shadow":
        return Plan(False, "would-reclaim", note="shadow mode: nothing touched")
    gate = autonomy or cfg.autonomy
    kind = VerdictKind.IDLE_HELD.value
    if kind not in gate.autonomous_verdicts:
        gate = gate.model_copy(update={"autonomous_verdicts": [*gate.autonomous_verdicts, kind]})
    return _gated(workload, VerdictKind.IDLE_HELD, False, cfg, team, gate, dra_gpus)


def _gated(
    workload: Workload,
    kind: VerdictKind,
    record: bool,
    cfg: ControllerConfig,
    team: str | None,
    autonomy: AutonomyConfig,
    dra_gpus: float,
) -> Plan:
    """Score the stop of `workload` and obey the gate: stop, or escalate to a person."""
    cls = action_class(workload)
    name, gate, _ = gate_for(workload, autonomy, table_from(cfg.actuators))
    decision = decide_action(kind.value, name, facts_for(workload, team, dra_gpus), gate)
    if workload.no_actuator:
        # A controller owner ghostgpu cannot stop: writing its child would be undone by it.
        why = (
            f"{_kind_of(workload)} {workload.ref.name} owns these GPU pods and has no actuator "
            "(controller.actuators): ghostgpu does not write its children; stop it by hand or add an "
            "actuator for its kind"
        )
        return Plan(
            record, "escalate", decision.model_copy(update={"outcome": "escalate", "reason": why}), why
        )
    if not decision.autonomous:
        return Plan(record, "escalate", decision, decision.reason)
    return Plan(
        record, "evict" if cls is ActionClass.EVICT_POD else "scale-to-zero", decision, decision.reason
    )


def _kind_of(workload: Workload) -> str:
    """The kind, with its group where the kind alone could mean another group."""
    ref = workload.ref
    return ref.kind if ref.target.startswith(f"{ref.kind.lower()}/") else f"{ref.kind} ({ref.group})"
