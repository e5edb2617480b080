"""The corpus of real pod shapes (tests/shapes/shapes.yaml) through the controller's own path:
each container's `ps` answers the fixed argvs as procps, BusyBox or a distroless image would,
`ExecProcessSource` lists and `merge_listings` merges them, and `decide` judges under the default
controller section. Every shape gets the verdict an operator expects; no live shape is ever
reclaimable."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, ConfigDict, Field

from ghostgpu.config import ControllerConfig
from ghostgpu.controller.observe.evidence import policy_from_config
from ghostgpu.signals.podexec import ExecFailed, ExecResult, PodRef
from ghostgpu.signals.processes import PS_ARGV, PS_ARGV_BUSYBOX, ExecProcessSource, merge_listings
from ghostgpu.verdict import (
    ArtifactSizes,
    ArtifactsNotDeclared,
    ContainerRestart,
    Evidence,
    FailureReason,
    FaultEvidence,
    GpuMemory,
    SignalFailure,
    VerdictKind,
    XidEvent,
    decide,
)

CORPUS = Path(__file__).resolve().parents[1] / "shapes" / "shapes.yaml"
POLICY = policy_from_config(ControllerConfig())
NO_PS = "no-ps"


class Restart(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    container: str
    reason: str
    exit_code: int | None = Field(None, alias="exitCode")


class Artifacts(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    start_bytes: int = Field(alias="startBytes")
    end_bytes: int = Field(alias="endBytes")
    completion_marker: bool = Field(False, alias="completionMarker")


class Shape(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    truth: str = Field(pattern="^(live|idle|crashed)$")
    containers: dict[str, str]
    zeros: int | None = None
    util: list[list[float]] | None = None  # per GPU, oldest first
    memory_mib: float | None = Field(alias="memoryMiB")
    restarts: list[Restart] = []
    xids: list[int] = []
    artifacts: Artifacts | None = None
    shared_process_namespace: bool = Field(False, alias="sharedProcessNamespace")
    expect: VerdictKind

    def samples(self) -> tuple[float, ...]:
        if self.zeros is not None:
            return (0.0,) * self.zeros
        assert self.util, f"{self.name}: give zeros or util"
        return tuple(max(per_sample) for per_sample in zip(*self.util, strict=True))


def load() -> list[Shape]:
    return [Shape.model_validate(raw) for raw in yaml.safe_load(CORPUS.read_text())]


SHAPES = load()


class ContainerPs:
    """What `ps` does inside each container of one shape: procps, BusyBox, or absent."""

    def __init__(self, listings: dict[str, str]) -> None:
        self.listings = listings
        self.calls: list[tuple[str, tuple[str, ...]]] = []

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        self.calls.append((pod.container, argv))
        text = self.listings[pod.container]
        if text == NO_PS:
            raise ExecFailed(
                FailureReason.EXEC_ERROR,
                'OCI runtime exec failed: exec failed: unable to start container process: exec: "ps": '
                "executable file not found in $PATH: unknown",
            )
        busybox = "ELAPSED" not in text.splitlines()[0]
        if busybox and argv != PS_ARGV_BUSYBOX:
            return ExecResult("", "ps: bad -o argument 'etimes', supported arguments: user,group,comm", 1)
        if not busybox and argv != PS_ARGV:
            return ExecResult("", "ps: unexpected argv", 1)
        return ExecResult(text, "", 0)


def evidence_of(shape: Shape) -> tuple[Evidence, ContainerPs]:
    ps = ContainerPs(shape.containers)
    source = ExecProcessSource(ps)
    containers = list(shape.containers)
    targets = [
        PodRef("team-a", shape.name, c)
        for c in (containers[:1] if shape.shared_process_namespace else containers)
    ]
    listings = asyncio.run(source.list_many(targets))
    memory: GpuMemory | SignalFailure = (
        SignalFailure(reason=FailureReason.MISSING, detail="no framebuffer series")
        if shape.memory_mib is None
        else GpuMemory(used_bytes=int(shape.memory_mib * (1 << 20)))
    )
    artifacts: Any = (
        ArtifactSizes(
            start_bytes=shape.artifacts.start_bytes,
            end_bytes=shape.artifacts.end_bytes,
            completion_marker=shape.artifacts.completion_marker,
        )
        if shape.artifacts
        else ArtifactsNotDeclared()
    )
    faults = FaultEvidence(
        xid_events=tuple(XidEvent(code=c, gpu="GPU-0") for c in shape.xids),
        restarts=tuple(
            ContainerRestart(container=r.container, reason=r.reason, exit_code=r.exit_code)
            for r in shape.restarts
        ),
    )
    evidence = Evidence(
        utilization=shape.samples(),
        processes=merge_listings([listings[t] for t in targets]),
        artifacts=artifacts,
        faults=faults,
        memory=memory,
    )
    return evidence, ps


def test_the_corpus_is_large_and_names_are_unique() -> None:
    assert len(SHAPES) >= 30
    assert len({s.name for s in SHAPES}) == len(SHAPES)
    kinds = {s.expect for s in SHAPES}
    assert kinds == set(VerdictKind), "every verdict is someone's expectation"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_shape_gets_the_verdict_an_operator_expects(shape: Shape) -> None:
    evidence, _ = evidence_of(shape)
    verdict = decide(evidence, POLICY)
    assert verdict.kind is shape.expect, f"{shape.name}: {verdict.kind} {[r.value for r in verdict.reasons]}"
    if shape.truth == "live":
        assert not verdict.reclaimable, f"false reclaim of {shape.name}"


def test_no_live_shape_is_reclaimed() -> None:
    false_reclaims = [
        s.name for s in SHAPES if s.truth == "live" and decide(evidence_of(s)[0], POLICY).reclaimable
    ]
    assert false_reclaims == []


def test_every_gpu_container_is_listed_and_busybox_gets_its_own_argv() -> None:
    by_name = {s.name: s for s in SHAPES}
    _, ps = evidence_of(by_name["second-gpu-container-still-serving"])
    assert sorted(ps.calls) == [("embedder", PS_ARGV), ("trainer", PS_ARGV)]
    _, ps = evidence_of(by_name["busybox-crond-between-runs"])
    assert ps.calls == [("cron", PS_ARGV), ("cron", PS_ARGV_BUSYBOX)]
    _, ps = evidence_of(by_name["shared-process-namespace-all-finished"])
    assert ps.calls == [("trainer", PS_ARGV)]


def test_the_old_first_container_probe_would_have_reclaimed_live_work() -> None:
    """Listing only the first GPU container (what the controller did before) sees a finished
    trainer and misses the embedder that still serves: that shape proves the change."""
    shape = next(s for s in SHAPES if s.name == "second-gpu-container-still-serving")
    first_only = shape.model_copy(update={"containers": dict(list(shape.containers.items())[:1])})
    assert decide(evidence_of(first_only)[0], POLICY).reclaimable
    assert not decide(evidence_of(shape)[0], POLICY).reclaimable


def test_idle_held_carries_the_memory_held_and_timers_say_so() -> None:
    from ghostgpu.controller.observe.evidence import evidence_summary
    from ghostgpu.verdict import Reason

    by_name = {s.name: s for s in SHAPES}
    evidence, _ = evidence_of(by_name["vllm-server-idle-at-night"])
    verdict = decide(evidence, POLICY)
    assert Reason.MEMORY_HELD in verdict.reasons and verdict.memory_bytes == 72000 << 20
    assert evidence_summary(evidence, verdict, 5)["gpu_mem_mib"] == 72000
    evidence, _ = evidence_of(by_name["periodic-job-asleep-longer-than-the-long-window"])
    verdict = decide(evidence, POLICY)
    assert verdict.kind is VerdictKind.IDLE_HELD and Reason.TIMER in verdict.reasons
    evidence, _ = evidence_of(by_name["cuda-context-the-listing-cannot-see"])
    assert Reason.MEMORY_WITHOUT_PROCESS in decide(evidence, POLICY).reasons
    evidence, _ = evidence_of(by_name["tini-shell-sleep-infinity-after-training"])
    verdict = decide(evidence, POLICY)
    assert Reason.HOLDERS_ONLY in verdict.reasons and Reason.MEMORY_FREE in verdict.reasons
    assert evidence_summary(evidence, verdict, 5)["procs"] == {"live": 0, "defunct": 0, "holders": 3}
