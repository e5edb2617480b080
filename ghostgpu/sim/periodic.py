"""A documented extension beside the published fleet: periodic GPU jobs.

The published model (docs/design.md#benchmark) has no job that sleeps between runs. Real clusters
do: an hourly `while true; do python job.py; sleep 3600; done`, a cron daemon that starts a GPU
job every night. Between runs such a job shows zero utilization, no GPU memory, no output growth,
and only a shell and a finite `sleep` (or the cron daemon): the exact shape of a finished job kept
alive, except that the wait ends. Its ground truth is ACTIVE, so reclaiming it is a false reclaim.

These jobs come from their own random stream (`periodic_rng`) and are judged in a second table:
the published fleet and its table are the same draw for draw with or without them.
"""

from __future__ import annotations

import random

from pydantic import BaseModel, ConfigDict, Field

from ghostgpu.sim.model import SimInstance, TruthClass
from ghostgpu.verdict import (
    ArtifactSizes,
    ArtifactsNotDeclared,
    Evidence,
    FaultEvidence,
    GpuMemory,
    ProcessInfo,
)

# (weight, the processes a job of that shape shows between two runs)
ASLEEP_SHAPES: tuple[tuple[float, tuple[tuple[int, int, str, str], ...]], ...] = (
    (
        0.5,
        (
            (1, 0, "Ss", "/bin/sh -c while true; do python job.py; sleep 3600; done"),
            (40, 1, "S", "sleep 3600"),
        ),
    ),
    (
        0.2,
        ((1, 0, "S", "/bin/ash -c while :; do python3 run.py; sleep 15m; done"), (17, 1, "S", "sleep 15m")),
    ),
    (0.15, ((1, 0, "S", "crond -f -l 2"),)),
    (0.15, ((1, 0, "Ssl", "/usr/local/bin/supercronic /etc/crontab"),)),
)
RUNNING_JOB = (52, 1, "Rl", "python job.py --shard 3")
JOB_MEMORY = 4 << 30


class PeriodicModel(BaseModel):
    """Periodic jobs added to each seed's fleet, as a share of its published instances."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    share: float = Field(0.2, ge=0.0, le=1.0)
    # An hourly job that runs ~10 minutes: a 5-poll window (60 s polls) falls wholly between two
    # runs about 3 times in 4.
    asleep_prob: float = Field(0.75, ge=0.0, le=1.0)
    artifacts_declared_prob: float = Field(0.5, ge=0.0, le=1.0)


def periodic_rng(seed: int) -> random.Random:
    return random.Random(f"ghostgpu-periodic:{seed}")


def _procs(rows: tuple[tuple[int, int, str, str], ...]) -> tuple[ProcessInfo, ...]:
    return tuple(ProcessInfo(pid=p, ppid=pp, state=s, command=c) for p, pp, s, c in rows)


def generate_periodic(seed: int, count: int, samples: int, model: PeriodicModel) -> list[SimInstance]:
    """`count` periodic jobs (ACTIVE ground truth); `in_gap` marks the ones asleep between runs."""
    rng = periodic_rng(seed)
    weights = [w for w, _ in ASLEEP_SHAPES]
    out: list[SimInstance] = []
    for index in range(count):
        (shape,) = rng.choices([s for _, s in ASLEEP_SHAPES], weights=weights)
        asleep = rng.random() < model.asleep_prob
        size = rng.randint(1 << 20, 1 << 30)
        if asleep:
            readings: tuple[float, ...] = (0.0,) * samples
            processes = _procs(shape)
            memory = GpuMemory(used_bytes=0)  # the job exited: its CUDA context is gone
            end = size
        else:
            readings = tuple(float(rng.randint(20, 100)) for _ in range(samples))
            processes = _procs((*shape, RUNNING_JOB))
            memory = GpuMemory(used_bytes=JOB_MEMORY)
            end = size + rng.randint(4096, 1 << 24)
        artifacts = (
            ArtifactSizes(start_bytes=size, end_bytes=end)
            if rng.random() < model.artifacts_declared_prob
            else ArtifactsNotDeclared()
        )
        evidence = Evidence(
            utilization=readings,
            processes=processes,
            artifacts=artifacts,
            faults=FaultEvidence(),
            memory=memory,
        )
        out.append(SimInstance(seed, index, TruthClass.ACTIVE, asleep, False, False, evidence))
    return out
