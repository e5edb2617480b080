"""Seeded generator of raw signal traces, one `Evidence` per synthetic workload.

The generator only produces what signal sources would observe (readings, process tables, artifact
sizes, fault events); it never decides. Verdicts come from `ghostgpu.verdict.decide`, the same
function the controller calls.

GPU memory is not part of the published model: it is derived from what was already drawn (no
extra random draw, so the published fleet is the same draw for draw): a live job holds a CUDA
context per process, a finished or crashed one holds none.
"""

from __future__ import annotations

import random

from ghostgpu.sim.model import FleetModel, SimInstance, TruthClass
from ghostgpu.verdict import (
    ArtifactSizes,
    ArtifactsNotDeclared,
    ContainerRestart,
    Evidence,
    FaultEvidence,
    GpuMemory,
    ProcessInfo,
    XidEvent,
)

# XIDs that come with a dead CUDA context (graphics exception, MMU fault, GPU stopped, ECC DBE,
# fallen off the bus): the kind of fault that leaves a crashed job behind.
CRASH_XIDS = (13, 31, 43, 48, 79)
BENIGN_XID = 63  # page retirement notice; ignored by the default policy
LIVE_STATES = ("R", "S", "Sl", "D")
CONTEXT_BYTES = 6 << 30  # framebuffer a live training process holds (model, optimizer, cache)
NO_MEMORY = GpuMemory(used_bytes=0)
WORKER_COMMANDS = (
    "python train.py --config run.yaml",
    "python -m torch.utils.data.worker",
    "python -m torch.distributed.run --nproc-per-node 1 train.py",
    "python -c from multiprocessing.spawn import spawn_main",
)


def class_counts(instances: int, model: FleetModel) -> tuple[int, int, int]:
    """Exact class counts per seed (60/30/10 of 2,000 = 1,200/600/200), so denominators match."""
    active = round(instances * model.share_active)
    finished = round(instances * model.share_finished)
    return active, finished, instances - active - finished


def _active(rng: random.Random, model: FleetModel, samples: int) -> tuple[bool, Evidence]:
    in_gap = rng.random() < model.gap_prob
    readings: list[float] = []
    for _ in range(samples):
        if in_gap:
            readings.append(float(rng.randint(1, 30)) if rng.random() < model.gap_nonzero_prob else 0.0)
        else:
            readings.append(float(rng.randint(15, 100)))
    n = rng.randint(model.active_min_processes, model.active_max_processes)
    processes = tuple(
        ProcessInfo(pid=1 + i * 7, state=rng.choice(LIVE_STATES), command=WORKER_COMMANDS[i])
        for i in range(n)
    )
    start = rng.randint(1 << 20, 1 << 34)
    grows = (not in_gap) or rng.random() < model.gap_artifact_growth_prob
    artifacts = (
        ArtifactSizes(start_bytes=start, end_bytes=start + (rng.randint(4096, 1 << 28) if grows else 0))
        if rng.random() < model.artifacts_declared_prob
        else ArtifactsNotDeclared()
    )
    restarts = (
        (ContainerRestart(container="main", reason="OOMKilled", exit_code=137),)
        if rng.random() < model.active_past_restart_prob
        else ()
    )
    return in_gap, Evidence(
        utilization=tuple(readings),
        processes=processes,
        artifacts=artifacts,
        faults=FaultEvidence(restarts=restarts),
        memory=GpuMemory(used_bytes=n * CONTEXT_BYTES),
    )


def _finished(rng: random.Random, model: FleetModel, samples: int) -> Evidence:
    size = rng.randint(1 << 20, 1 << 34)
    artifacts = (
        ArtifactSizes(
            start_bytes=size, end_bytes=size, completion_marker=rng.random() < model.finished_marker_prob
        )
        if rng.random() < model.artifacts_declared_prob
        else ArtifactsNotDeclared()
    )
    faults = FaultEvidence()
    if rng.random() < model.finished_benign_fault_prob:
        faults = (
            FaultEvidence(restarts=(ContainerRestart(container="main", reason="Completed", exit_code=0),))
            if rng.random() < 0.5
            else FaultEvidence(xid_events=(XidEvent(code=BENIGN_XID, gpu="GPU-0"),))
        )
    return Evidence(
        utilization=(0.0,) * samples, processes=(), artifacts=artifacts, faults=faults, memory=NO_MEMORY
    )


def _zombie(rng: random.Random, model: FleetModel, samples: int) -> tuple[bool, bool, Evidence]:
    defunct = rng.random() < model.zombie_defunct_prob
    processes = (ProcessInfo(pid=23, state="Z", command="[python] <defunct>"),) if defunct else ()
    size = rng.randint(1 << 20, 1 << 34)
    artifacts = (
        ArtifactSizes(start_bytes=size, end_bytes=size)
        if rng.random() < model.artifacts_declared_prob
        else ArtifactsNotDeclared()
    )
    crash = rng.random() < model.zombie_fault_prob
    faults = FaultEvidence()
    if crash:
        faults = (
            FaultEvidence(xid_events=(XidEvent(code=rng.choice(CRASH_XIDS), gpu="GPU-0"),))
            if rng.random() < 0.5
            else FaultEvidence(
                restarts=(
                    ContainerRestart(
                        container="main", reason=rng.choice(("OOMKilled", "Error")), exit_code=137
                    ),
                )
            )
        )
    evidence = Evidence(
        utilization=(0.0,) * samples,
        processes=processes,
        artifacts=artifacts,
        faults=faults,
        memory=NO_MEMORY,
    )
    return defunct, crash, evidence


def generate_fleet(
    seed: int, instances: int, samples: int, model: FleetModel | None = None
) -> list[SimInstance]:
    """`instances` workloads for one seed, each with `samples` utilization readings.

    Deterministic: the same (seed, instances, samples, model) always yields the same fleet.
    """
    model = model or FleetModel()
    rng = random.Random(seed)
    n_active, n_finished, n_zombie = class_counts(instances, model)
    truths = (
        [TruthClass.ACTIVE] * n_active
        + [TruthClass.FINISHED_IDLE] * n_finished
        + [TruthClass.ZOMBIE_CRASHED] * n_zombie
    )
    rng.shuffle(truths)
    fleet: list[SimInstance] = []
    for index, truth in enumerate(truths):
        in_gap = defunct = crash = False
        if truth is TruthClass.ACTIVE:
            in_gap, evidence = _active(rng, model, samples)
        elif truth is TruthClass.FINISHED_IDLE:
            evidence = _finished(rng, model, samples)
        else:
            defunct, crash, evidence = _zombie(rng, model, samples)
        fleet.append(SimInstance(seed, index, truth, in_gap, defunct, crash, evidence))
    return fleet
