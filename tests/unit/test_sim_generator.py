"""The synthetic fleet follows docs/design.md#benchmark, is deterministic, and fault injection behaves."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from ghostgpu.sim.faults import fault_rng, inject_faults, read_silently
from ghostgpu.sim.generator import class_counts, generate_fleet
from ghostgpu.sim.model import FleetModel, TruthClass
from ghostgpu.verdict import ArtifactSizes, FaultEvidence, SignalFailure

SAMPLES = 10


@pytest.fixture(scope="module")
def fleet():
    return generate_fleet(seed=0, instances=2000, samples=SAMPLES)


def test_class_mix_is_exact_per_seed(fleet) -> None:
    counts = {t: sum(i.truth is t for i in fleet) for t in TruthClass}
    assert counts == {TruthClass.ACTIVE: 1200, TruthClass.FINISHED_IDLE: 600, TruthClass.ZOMBIE_CRASHED: 200}
    assert class_counts(2000, FleetModel()) == (1200, 600, 200)
    # Shuffled, not in blocks.
    assert {i.truth for i in fleet[:50]} == set(TruthClass)


def test_same_seed_same_fleet_other_seed_other_fleet() -> None:
    a = generate_fleet(seed=3, instances=300, samples=SAMPLES)
    b = generate_fleet(seed=3, instances=300, samples=SAMPLES)
    c = generate_fleet(seed=4, instances=300, samples=SAMPLES)
    assert a == b
    assert [i.evidence for i in a] != [i.evidence for i in c]


def test_every_instance_has_the_requested_samples(fleet) -> None:
    assert all(len(i.evidence.utilization) == SAMPLES for i in fleet)


def test_active_jobs_keep_one_to_four_live_processes(fleet) -> None:
    for inst in (i for i in fleet if i.truth is TruthClass.ACTIVE):
        procs = inst.evidence.processes
        assert isinstance(procs, tuple)
        assert 1 <= len(procs) <= 4
        assert not any(p.defunct for p in procs)


def test_active_outside_a_gap_reads_nonzero_everywhere(fleet) -> None:
    busy = [i for i in fleet if i.truth is TruthClass.ACTIVE and not i.in_gap]
    assert busy
    assert all(all(s > 0 for s in i.evidence.utilization) for i in busy)


def test_gap_share_and_reading_probability_follow_the_model(fleet) -> None:
    active = [i for i in fleet if i.truth is TruthClass.ACTIVE]
    gaps = [i for i in active if i.in_gap]
    # 1,200 draws at p = 0.15: mean 180, sd ~12.4; a ±5 sd band only fails on a real model change.
    assert 118 <= len(gaps) <= 242
    readings = [s for i in gaps for s in i.evidence.utilization]
    nonzero = sum(s > 0 for s in readings) / len(readings)
    assert 0.20 <= nonzero <= 0.30


def test_finished_and_crashed_read_zero_and_never_grow_output(fleet) -> None:
    for inst in (i for i in fleet if i.truth is not TruthClass.ACTIVE):
        assert all(s == 0.0 for s in inst.evidence.utilization)
        artifacts = inst.evidence.artifacts
        assert not (isinstance(artifacts, ArtifactSizes) and artifacts.changed)


def test_finished_jobs_have_no_processes(fleet) -> None:
    assert all(i.evidence.processes == () for i in fleet if i.truth is TruthClass.FINISHED_IDLE)


def test_about_one_zombie_in_four_keeps_exactly_one_defunct_child(fleet) -> None:
    zombies = [i for i in fleet if i.truth is TruthClass.ZOMBIE_CRASHED]
    with_child = [i for i in zombies if i.defunct_child]
    for inst in zombies:
        procs = inst.evidence.processes
        assert isinstance(procs, tuple)
        assert len(procs) == (1 if inst.defunct_child else 0)
        assert all(p.defunct for p in procs)
    assert 0.15 <= len(with_child) / len(zombies) <= 0.35


def test_model_rejects_inconsistent_shares() -> None:
    with pytest.raises(ValidationError):
        FleetModel(share_active=0.7)
    assert FleetModel().expected_window_fpr(5) == pytest.approx(0.15 * 0.75**5)


# --- fault injection ---------------------------------------------------------------------------


def test_zero_rate_changes_nothing(fleet) -> None:
    rng = random.Random(1)
    assert all(inject_faults(i.evidence, 0.0, rng) is i.evidence for i in fleet[:50])


def test_full_rate_fails_every_signal(fleet) -> None:
    rng = random.Random(1)
    for inst in fleet[:50]:
        faulty = inject_faults(inst.evidence, 1.0, rng)
        assert all(isinstance(s, SignalFailure) for s in faulty.utilization)
        assert isinstance(faulty.processes, SignalFailure)
        assert isinstance(faulty.faults, SignalFailure)
        assert isinstance(faulty.artifacts, SignalFailure) or not isinstance(
            inst.evidence.artifacts, ArtifactSizes
        )


def test_fault_rate_is_roughly_the_share_of_failed_samples(fleet) -> None:
    rng = fault_rng(0)
    faulty = [inject_faults(i.evidence, 0.05, rng) for i in fleet]
    samples = [s for e in faulty for s in e.utilization]
    share = sum(isinstance(s, SignalFailure) for s in samples) / len(samples)
    assert 0.04 <= share <= 0.06


def test_fault_stream_is_deterministic_per_seed(fleet) -> None:
    a = [inject_faults(i.evidence, 0.1, fault_rng(7)) for i in fleet[:100]]
    b = [inject_faults(i.evidence, 0.1, fault_rng(7)) for i in fleet[:100]]
    assert a == b


def test_silent_reading_turns_failures_into_zero_and_empty(fleet) -> None:
    faulty = inject_faults(fleet[0].evidence, 1.0, random.Random(2))
    silent = read_silently(faulty)
    assert silent.utilization == (0.0,) * SAMPLES
    assert silent.processes == ()
    assert isinstance(silent.faults, FaultEvidence)
    assert not isinstance(silent.artifacts, SignalFailure)
