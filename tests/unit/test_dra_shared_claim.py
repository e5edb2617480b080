"""A workload whose pod uses a ResourceClaim that another pod also uses (status.reservedFor) is
never reclaimed while that pod is there: stopping it frees no GPU. The verdict stays what the
signals say; the decision is `shared-claim`, and an Event names the claim and the other pod."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from test_controller_reconciler import FINISHED, NS, Harness
from test_dra_count import CLASSES, IS_GPU, claim, dra_pod, exactly

from ghostgpu.config import ControllerConfig
from ghostgpu.controller.books.decisions import Decision, parse_lines
from ghostgpu.controller.claims import DraCounter, claim_view
from ghostgpu.controller.inventory import WorkloadRef, pod_view
from ghostgpu.controller.judge.planner import plan, shared_claim
from ghostgpu.controller.reconciler import Snapshot
from ghostgpu.verdict import Reason, Rule, Verdict, VerdictKind

GPU = [exactly("gpu", "gpu.nvidia.com")]
NIC = [exactly("nic", "nic.example.com")]


def views(pods: list[dict[str, Any]], claims: list[dict[str, Any]]) -> dict[str, Any]:
    store = {(c.namespace, c.name): c for c in map(claim_view, claims)}
    return {v.name: v for v in DraCounter(CLASSES).pods([pod_view(p, IS_GPU) for p in pods], store)}


def test_the_reason_names_the_claim_and_the_other_pod_but_not_the_workloads_own_pods() -> None:
    c = claim("shared", [("gpu", "gpu-0")], GPU, ["u1", "u2", "u3"])
    v = views([dra_pod(n, u, shared={"g": "shared"}) for n, u in (("a", "u1"), ("b", "u2"))], [c])
    why = shared_claim([v["a"]], [v["a"]])
    assert why == "shared-claim: gpu claim team-a/shared is also used by pod p-u2 (and 1 more)"
    # the workload's own pods are no other consumer: only u3 is
    assert (
        shared_claim([v["a"]], [v["a"], v["b"]])
        == "shared-claim: gpu claim team-a/shared is also used by pod p-u3"
    )


def test_a_claim_only_this_pod_uses_or_a_shared_nic_claim_holds_nothing_back() -> None:
    own = claim("own", [("gpu", "gpu-0")], GPU, ["u1"])
    nic = claim("nic", [("nic", "nic-0")], NIC, ["u1", "u2"])
    v = views([dra_pod("a", "u1", shared={"g": "own", "n": "nic"})], [own, nic])["a"]
    assert v.claim_peers == () and shared_claim([v], [v]) is None


def _idle() -> Verdict:
    return Verdict(kind=VerdictKind.FINISHED_IDLE, rule=Rule.GHOSTGPU, reasons=(Reason.NO_PROCESS,))


def test_a_held_reclaim_is_neither_taken_nor_pretended_in_shadow_mode() -> None:
    from test_controller_report import _wl

    why = "shared-claim: gpu claim ns/c is also used by pod p"
    for mode in ("enforce", "shadow"):
        p = plan(_wl(), _idle(), None, ControllerConfig(mode=mode), shared=why)
        assert p.action == "shared-claim" and p.note == why and p.record
    assert plan(_wl(), _idle(), None, ControllerConfig(mode="enforce")).action == "scale-to-zero"


class ClaimHarness(Harness):
    """The reconciler harness with its pods counted against a claims cache (as app.py does)."""

    claims: list[dict[str, Any]]

    def snapshot(self) -> Snapshot:
        snap = super().snapshot()
        store = {(c.namespace, c.name): c for c in map(claim_view, self.claims)}
        return dataclasses.replace(snap, pods=DraCounter(CLASSES).pods(snap.pods, store))


async def test_a_ghost_on_a_shared_claim_is_held_until_the_other_pod_leaves(tmp_path: Path) -> None:
    h = ClaimHarness(tmp_path, mode="enforce")
    h.add("done", table=FINISHED)
    pod = h.pods[-1]
    pod["spec"]["resourceClaims"] = [{"name": "g", "resourceClaimName": "team-gpu"}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "g"}]
    uid = pod["metadata"]["uid"]
    h.claims = [claim("team-gpu", [("gpu", "gpu-0")], GPU, [uid, "uid-nb"])]
    await h.polls(7)
    ref = WorkloadRef("Deployment", NS, "done")
    assert h.cluster.scaled == [] and h.verdict("done") == "FINISHED_IDLE"
    assert (ref.name, "ReclaimHeld") in h.cluster.events
    lines = parse_lines(h.log.read_bytes().decode().splitlines())
    rows = [r for r in lines if isinstance(r, Decision) and r.workload == f"Deployment/{NS}/done"]
    assert rows[-1].verdict == "FINISHED_IDLE" and rows[-1].action == "shared-claim"
    # the other consumer is gone from reservedFor: the next poll reclaims it
    h.claims = [claim("team-gpu", [("gpu", "gpu-0")], GPU, [uid])]
    await h.polls(1)
    assert h.cluster.scaled == [(ref, 0)]
