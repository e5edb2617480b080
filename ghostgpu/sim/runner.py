"""The benchmark runner: synthetic fleet → `ghostgpu.verdict.decide` under each rule → counts.

Deterministic for a given `BenchConfig`; no timing enters the result (speed is shown by running it).
"""

from __future__ import annotations

from collections import Counter as Tally
from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, computed_field

from ghostgpu.sim.faults import fault_rng, inject_faults, read_silently
from ghostgpu.sim.generator import generate_fleet
from ghostgpu.sim.metrics import Confusion, Counter
from ghostgpu.sim.model import FleetModel, TruthClass
from ghostgpu.sim.periodic import PeriodicModel, generate_periodic
from ghostgpu.sim.published import Published, published_for
from ghostgpu.verdict import ProcessPolicy, Rule, SignalFailure, VerdictKind, VerdictPolicy, decide


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class BenchConfig(_Frozen):
    seeds: int = Field(5, ge=1)
    first_seed: int = Field(0, ge=0)
    instances: int = Field(2000, ge=1)  # per seed
    window: int = Field(5, ge=1, le=100)
    fault_rate: float = Field(0.0, ge=0.0, le=1.0)
    sweep_max: int = Field(10, ge=1, le=100)  # the plot's window axis: 1..sweep_max
    model: FleetModel = FleetModel()
    periodic: PeriodicModel = PeriodicModel()  # the extension's second table (not the published one)

    @property
    def samples(self) -> int:
        return max(self.window, self.sweep_max)

    @property
    def seed_list(self) -> list[int]:
        return list(range(self.first_seed, self.first_seed + self.seeds))

    @property
    def total_instances(self) -> int:
        return self.seeds * self.instances


@dataclass(frozen=True, slots=True)
class Detector:
    key: str
    label: str
    policy: VerdictPolicy


def table_detectors(window: int) -> tuple[Detector, ...]:
    return (
        Detector("single-util", "single utilization sample == 0", VerdictPolicy(rule=Rule.SINGLE_UTIL)),
        Detector(
            "window-util",
            f"{window} utilization samples all == 0",
            VerdictPolicy(rule=Rule.WINDOW_UTIL, window=window),
        ),
        Detector(
            "paper-multi-signal",
            f"multi-signal ({window} samples ∧ process count == 0 ∧ no artifact growth)",
            VerdictPolicy(rule=Rule.PAPER_MULTI_SIGNAL, window=window),
        ),
        Detector(
            "ghostgpu",
            f"ghostgpu ({window} samples ∧ no live process ∧ no growth; defunct-aware, faults)",
            VerdictPolicy(rule=Rule.GHOSTGPU, window=window),
        ),
    )


def extended_detectors(window: int) -> tuple[Detector, ...]:
    """The table's detectors plus the ghostgpu rule as it was before timers were told apart from
    holders (every `sleep` a holder, no timer programs): what the periodic jobs break."""
    holders_by_name = ProcessPolicy(timers=frozenset(), forever_sleep_s=1e-9)
    return (
        *table_detectors(window),
        Detector(
            "ghostgpu-no-timers",
            "ghostgpu without timer detection (any sleep is a holder)",
            VerdictPolicy(rule=Rule.GHOSTGPU, window=window, processes=holders_by_name),
        ),
    )


class ExtendedRow(_Frozen):
    key: str
    label: str
    confusion: Confusion  # published fleet + periodic jobs
    periodic_false_reclaims: int  # periodic jobs judged reclaimable


class ExtendedResult(_Frozen):
    """The second table: the published fleet plus periodic jobs (ghostgpu.sim.periodic)."""

    periodic_jobs: int
    asleep: int  # of them, the window fell wholly between two runs
    rows: tuple[ExtendedRow, ...]


class DetectorResult(_Frozen):
    key: str
    label: str
    rule: Rule
    window: int
    confusion: Confusion
    unknown: int  # UNKNOWN verdicts (counted as "keep")
    published: Published | None

    def _diff(self, ours: float | None, theirs: float | None) -> float | None:
        return None if ours is None or theirs is None else ours - theirs

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fpr_diff(self) -> float | None:
        return self._diff(self.confusion.fpr, self.published and self.published.fpr)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def recall_diff(self) -> float | None:
        return self._diff(self.confusion.recall, self.published and self.published.recall)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def accuracy_diff(self) -> float | None:
        return self._diff(self.confusion.accuracy, self.published and self.published.accuracy)


class SweepPoint(_Frozen):
    window: int
    window_util_fpr: float
    expected_fpr: float  # gap_prob * (1 - gap_nonzero_prob) ** window
    paper_fpr: float
    paper_recall: float
    ghostgpu_fpr: float
    ghostgpu_recall: float


class BeyondResult(_Frozen):
    """What the default rule does with the zombies the published multi-signal rule keeps."""

    zombies: int
    paper_missed: int  # zombies the paper rule did not judge reclaimable
    paper_missed_with_defunct_child: int
    ghostgpu_reclaimed_of_missed: int
    ghostgpu_kinds_of_missed: dict[str, int]
    ghostgpu_reasons_of_missed: dict[str, int]
    # Clean fleet, default rule: ground-truth class → verdict kind → count.
    ghostgpu_kind_matrix: dict[str, dict[str, int]]


class FaultDetectorResult(_Frozen):
    key: str
    label: str
    confusion: Confusion  # explicit failures, as ghostgpu's signal sources report them
    unknown: int
    silent_confusion: Confusion  # the same faulty readings taken as 0 % / empty / no growth

    @computed_field  # type: ignore[prop-decorator]
    @property
    def false_reclaims(self) -> int:
        return self.confusion.fp

    @computed_field  # type: ignore[prop-decorator]
    @property
    def silent_false_reclaims(self) -> int:
        return self.silent_confusion.fp


class FaultResult(_Frozen):
    rate: float
    failed_utilization_samples: int
    failed_process_listings: int
    failed_artifact_reads: int
    detectors: tuple[FaultDetectorResult, ...]


class BenchResult(_Frozen):
    config: BenchConfig
    detectors: tuple[DetectorResult, ...]
    sweep: tuple[SweepPoint, ...]
    beyond: BeyondResult
    faults: FaultResult | None
    extended: ExtendedResult | None = None

    def detector(self, key: str) -> DetectorResult:
        return next(d for d in self.detectors if d.key == key)

    def fault_detector(self, key: str) -> FaultDetectorResult:
        if self.faults is None:
            raise KeyError("no fault run (fault_rate is 0)")
        return next(d for d in self.faults.detectors if d.key == key)


def _rate(num: int, den: int) -> float:
    return num / den if den else 0.0


def run_bench(
    config: BenchConfig | None = None, progress: Callable[[int], None] | None = None
) -> BenchResult:
    """Run the benchmark. `progress(n)` is called after every n instances (for a progress bar)."""
    config = config or BenchConfig()
    detectors = table_detectors(config.window)
    sweep_windows = range(1, config.sweep_max + 1)
    sweep_policies = {
        (rule, k): VerdictPolicy(rule=rule, window=k)
        for k in sweep_windows
        for rule in (Rule.WINDOW_UTIL, Rule.PAPER_MULTI_SIGNAL, Rule.GHOSTGPU)
    }
    table = {d.key: Counter() for d in detectors}
    unknown = Tally[str]()
    sweep = {key: Counter() for key in sweep_policies}
    fault_table = {d.key: Counter() for d in detectors}
    fault_unknown = Tally[str]()
    silent_table = {d.key: Counter() for d in detectors}
    failed = Tally[str]()
    zombies = missed = missed_defunct = missed_reclaimed = 0
    missed_kinds = Tally[str]()
    missed_reasons = Tally[str]()
    matrix: dict[str, Tally[str]] = {t.value: Tally[str]() for t in TruthClass}
    ext_detectors = extended_detectors(config.window)
    ext_table = {d.key: Counter() for d in ext_detectors}
    ext_periodic = Tally[str]()
    periodic_jobs = asleep = 0

    for seed in config.seed_list:
        frng = fault_rng(seed)
        fleet = generate_fleet(seed, config.instances, config.samples, config.model)
        for done, inst in enumerate(fleet, start=1):
            positive = inst.truth.reclaimable
            verdicts = {}
            for d in detectors:
                v = decide(inst.evidence, d.policy)
                verdicts[d.key] = v
                table[d.key].add(positive, v.reclaimable)
                unknown[d.key] += v.kind is VerdictKind.UNKNOWN
            for key, policy in sweep_policies.items():
                sweep[key].add(positive, decide(inst.evidence, policy).reclaimable)
            if config.periodic.share > 0:
                for d in ext_detectors:
                    v = verdicts.get(d.key) or decide(inst.evidence, d.policy)
                    ext_table[d.key].add(positive, v.reclaimable)

            ours = verdicts["ghostgpu"]
            matrix[inst.truth.value][ours.kind.value] += 1
            if inst.truth is TruthClass.ZOMBIE_CRASHED:
                zombies += 1
                if not verdicts["paper-multi-signal"].reclaimable:
                    missed += 1
                    missed_defunct += inst.defunct_child
                    missed_reclaimed += ours.reclaimable
                    missed_kinds[ours.kind.value] += 1
                    missed_reasons.update(r.value for r in ours.reasons)

            if config.fault_rate > 0:
                faulty = inject_faults(inst.evidence, config.fault_rate, frng)
                silent = read_silently(faulty)
                failed["utilization"] += sum(isinstance(s, SignalFailure) for s in faulty.utilization)
                failed["processes"] += isinstance(faulty.processes, SignalFailure)
                failed["artifacts"] += isinstance(faulty.artifacts, SignalFailure)
                for d in detectors:
                    v = decide(faulty, d.policy)
                    fault_table[d.key].add(positive, v.reclaimable)
                    fault_unknown[d.key] += v.kind is VerdictKind.UNKNOWN
                    silent_table[d.key].add(positive, decide(silent, d.policy).reclaimable)
            if progress is not None and done % 100 == 0:
                progress(100)
        if progress is not None and len(fleet) % 100:
            progress(len(fleet) % 100)
        if config.periodic.share > 0:
            count = round(config.instances * config.periodic.share)
            for job in generate_periodic(seed, count, config.samples, config.periodic):
                periodic_jobs += 1
                asleep += job.in_gap
                for d in ext_detectors:
                    reclaimed = decide(job.evidence, d.policy).reclaimable
                    ext_table[d.key].add(False, reclaimed)
                    ext_periodic[d.key] += reclaimed

    results = tuple(
        DetectorResult(
            key=d.key,
            label=d.label,
            rule=d.policy.rule,
            window=d.policy.effective_window,
            confusion=table[d.key].freeze(),
            unknown=unknown[d.key],
            published=published_for(d.key, config.window),
        )
        for d in detectors
    )
    points = []
    for k in sweep_windows:
        w = sweep[(Rule.WINDOW_UTIL, k)].freeze()
        p = sweep[(Rule.PAPER_MULTI_SIGNAL, k)].freeze()
        g = sweep[(Rule.GHOSTGPU, k)].freeze()
        points.append(
            SweepPoint(
                window=k,
                window_util_fpr=w.fpr or 0.0,
                expected_fpr=config.model.expected_window_fpr(k),
                paper_fpr=p.fpr or 0.0,
                paper_recall=p.recall or 0.0,
                ghostgpu_fpr=g.fpr or 0.0,
                ghostgpu_recall=g.recall or 0.0,
            )
        )
    beyond = BeyondResult(
        zombies=zombies,
        paper_missed=missed,
        paper_missed_with_defunct_child=missed_defunct,
        ghostgpu_reclaimed_of_missed=missed_reclaimed,
        ghostgpu_kinds_of_missed=dict(sorted(missed_kinds.items())),
        ghostgpu_reasons_of_missed=dict(sorted(missed_reasons.items())),
        ghostgpu_kind_matrix={t: dict(sorted(c.items())) for t, c in matrix.items()},
    )
    faults = None
    if config.fault_rate > 0:
        faults = FaultResult(
            rate=config.fault_rate,
            failed_utilization_samples=failed["utilization"],
            failed_process_listings=failed["processes"],
            failed_artifact_reads=failed["artifacts"],
            detectors=tuple(
                FaultDetectorResult(
                    key=d.key,
                    label=d.label,
                    confusion=fault_table[d.key].freeze(),
                    unknown=fault_unknown[d.key],
                    silent_confusion=silent_table[d.key].freeze(),
                )
                for d in detectors
            ),
        )
    extended = None
    if config.periodic.share > 0:
        extended = ExtendedResult(
            periodic_jobs=periodic_jobs,
            asleep=asleep,
            rows=tuple(
                ExtendedRow(
                    key=d.key,
                    label=d.label,
                    confusion=ext_table[d.key].freeze(),
                    periodic_false_reclaims=ext_periodic[d.key],
                )
                for d in ext_detectors
            ),
        )
    return BenchResult(
        config=config, detectors=results, sweep=tuple(points), beyond=beyond, faults=faults, extended=extended
    )
