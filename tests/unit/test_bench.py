"""`ghostgpu bench` reproduces the published table and its outputs hold up.

These run the real benchmark with its defaults (10,000 instances, a few seconds), not a fixture.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.sim.runner import BenchConfig, BenchResult, run_bench
from ghostgpu.sim.tables import markdown

BENCH_DOC = Path(__file__).resolve().parents[2] / "docs" / "bench.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"


@pytest.fixture(scope="module")
def default() -> BenchResult:
    return run_bench()


@pytest.fixture(scope="module")
def faulty() -> BenchResult:
    return run_bench(BenchConfig(fault_rate=0.05))


def test_defaults_are_the_published_setup(default: BenchResult) -> None:
    c = default.config
    assert (c.seeds, c.instances, c.window, c.total_instances) == (5, 2000, 5, 10_000)
    for d in default.detectors:
        assert d.confusion.total == 10_000
        assert d.confusion.fp + d.confusion.tn == 6_000
        assert d.confusion.tp + d.confusion.fn == 4_000


def test_single_sample_fpr_reproduces_published(default: BenchResult) -> None:
    d = default.detector("single-util")
    assert 0.100 <= d.confusion.fpr <= 0.125  # published 10.93 %
    assert d.confusion.recall == 1.0


def test_window5_fpr_reproduces_published(default: BenchResult) -> None:
    d = default.detector("window-util")
    assert 0.028 <= d.confusion.fpr <= 0.043  # published 3.50 % (210 of 6,000)
    assert d.confusion.recall == 1.0


def test_paper_multi_signal_reproduces_published(default: BenchResult) -> None:
    d = default.detector("paper-multi-signal")
    assert d.confusion.fp == 0
    assert 0.925 <= d.confusion.recall <= 0.953  # published 93.90 % (244 of 4,000 missed)


def test_ghostgpu_rule_has_no_false_reclaim_and_full_recall(default: BenchResult) -> None:
    d = default.detector("ghostgpu")
    assert d.confusion.fp == 0
    assert d.confusion.recall >= 0.999
    assert d.unknown == 0


def test_published_figures_and_differences_are_reported(default: BenchResult) -> None:
    d = default.detector("window-util")
    assert d.published is not None and d.published.fpr == pytest.approx(0.035)
    assert d.fpr_diff == pytest.approx(d.confusion.fpr - 0.035)
    assert default.detector("ghostgpu").published is None
    assert default.detector("ghostgpu").fpr_diff is None


def test_window_sweep_follows_the_closed_form(default: BenchResult) -> None:
    assert [p.window for p in default.sweep] == list(range(1, 11))
    fprs = [p.window_util_fpr for p in default.sweep]
    assert fprs == sorted(fprs, reverse=True)
    for p in default.sweep:
        assert p.expected_fpr == pytest.approx(0.15 * 0.75**p.window)
        se = math.sqrt(p.expected_fpr * (1 - p.expected_fpr) / 6000)
        assert abs(p.window_util_fpr - p.expected_fpr) <= 5 * se
        assert p.paper_fpr == 0.0 and p.ghostgpu_fpr == 0.0
    window5 = default.sweep[4]
    assert window5.window_util_fpr == default.detector("window-util").confusion.fpr


def test_paper_misses_exactly_the_zombies_with_a_defunct_child_and_ghostgpu_takes_them(
    default: BenchResult,
) -> None:
    b = default.beyond
    paper = default.detector("paper-multi-signal").confusion
    assert b.zombies == 1000
    assert b.paper_missed == paper.fn == b.paper_missed_with_defunct_child
    assert b.ghostgpu_reclaimed_of_missed == b.paper_missed
    assert b.ghostgpu_kinds_of_missed == {"ZOMBIE_CRASHED": b.paper_missed}
    assert b.ghostgpu_reasons_of_missed["defunct-only"] == b.paper_missed


def test_ghostgpu_kind_matrix_never_reclaims_active(default: BenchResult) -> None:
    m = default.beyond.ghostgpu_kind_matrix
    assert m["ACTIVE"].get("FINISHED_IDLE", 0) == m["ACTIVE"].get("ZOMBIE_CRASHED", 0) == 0
    assert sum(m["ZOMBIE_CRASHED"].values()) == 1000
    assert m["ZOMBIE_CRASHED"].get("ZOMBIE_CRASHED", 0) > m["ZOMBIE_CRASHED"].get("FINISHED_IDLE", 0)


def test_five_percent_faults_make_no_false_reclaim_for_ghostgpu(faulty: BenchResult) -> None:
    f = faulty.faults
    assert f is not None and f.rate == 0.05
    # The injection has teeth: failures happened, and reading them as zero does cause false reclaims.
    assert f.failed_utilization_samples > 0 and f.failed_process_listings > 0
    assert (
        faulty.fault_detector("window-util").silent_false_reclaims
        > faulty.detector("window-util").confusion.fp
    )
    g = faulty.fault_detector("ghostgpu")
    assert g.false_reclaims == 0
    assert g.unknown > 0  # the price: failed evidence is kept and retried next poll
    assert faulty.fault_detector("paper-multi-signal").false_reclaims == 0


def test_faults_do_not_change_the_clean_table(default: BenchResult, faulty: BenchResult) -> None:
    assert faulty.detectors == default.detectors
    assert default.faults is None


def test_benchmark_is_deterministic() -> None:
    config = BenchConfig(seeds=2, instances=300, fault_rate=0.1)
    assert run_bench(config) == run_bench(config)
    assert run_bench(config) != run_bench(config.model_copy(update={"first_seed": 2}))


def test_progress_callback_counts_every_instance() -> None:
    seen: list[int] = []
    run_bench(BenchConfig(seeds=2, instances=250), progress=seen.append)
    assert sum(seen) == 500


# --- command line ------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_json_is_the_full_result() -> None:
    result = runner.invoke(app, ["bench", "--json", "--seeds", "1", "--instances", "300"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [d["key"] for d in data["detectors"]] == [
        "single-util",
        "window-util",
        "paper-multi-signal",
        "ghostgpu",
    ]
    assert data["detectors"][0]["confusion"]["tp"] + data["detectors"][0]["confusion"]["fn"] == 120
    assert {"fpr", "recall", "precision", "accuracy"} <= set(data["detectors"][0]["confusion"])
    assert len(data["sweep"]) == 10 and data["faults"] is None


def test_cli_detectors_subcommand_markdown_and_plot(tmp_path: Path) -> None:
    png = tmp_path / "window.png"
    args = ["bench", "detectors", "--markdown", "--seeds", "1", "--instances", "200"]
    result = runner.invoke(app, [*args, "--fault-rate", "0.05", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert "| detector | TP | FP | TN | FN | FPR |" in result.stdout
    assert "Under injected signal faults" in result.stdout
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_rich_table_names_every_detector() -> None:
    result = runner.invoke(app, ["bench", "--seeds", "1", "--instances", "200"])
    assert result.exit_code == 0, result.output
    for key in ("single-util", "window-util", "paper-multi-signal", "ghostgpu"):
        assert key in result.stdout


def test_cli_rejects_json_with_markdown() -> None:
    result = runner.invoke(app, ["bench", "--json", "--markdown", "--instances", "10"])
    assert result.exit_code != 0


def test_readme_table_is_the_command_output(faulty: BenchResult) -> None:
    """docs/bench.md's table is produced by `ghostgpu bench --fault-rate 0.05 --markdown`, never by hand."""
    text = BENCH_DOC.read_text(encoding="utf-8")
    assert BEGIN in text and END in text, "docs/bench.md bench section markers missing"
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert block.strip() == markdown(faulty).strip()


def test_published_figures_only_beside_the_configuration_they_were_measured_at() -> None:
    result = run_bench(BenchConfig(seeds=1, instances=200, window=3))
    assert result.detector("single-util").published is not None  # one sample, whatever the window
    assert result.detector("window-util").published is None
    assert result.detector("paper-multi-signal").published is None
    assert [d.window for d in result.detectors] == [1, 3, 3, 3]


# --- the periodic-jobs extension -------------------------------------------------------------------


def test_periodic_jobs_do_not_move_the_published_table(default: BenchResult) -> None:
    from ghostgpu.sim.periodic import PeriodicModel

    without = run_bench(BenchConfig(periodic=PeriodicModel(share=0.0)))
    assert without.extended is None
    assert without.detectors == default.detectors and without.beyond == default.beyond


def test_the_extended_fleet_has_no_false_reclaim_for_ghostgpu_and_breaks_the_old_holder_rule(
    default: BenchResult,
) -> None:
    ext = default.extended
    assert ext is not None and ext.periodic_jobs == 2000 and 0 < ext.asleep < ext.periodic_jobs
    rows = {r.key: r for r in ext.rows}
    assert rows["ghostgpu"].confusion.fp == 0 and rows["ghostgpu"].periodic_false_reclaims == 0
    assert rows["ghostgpu"].confusion.recall == default.detector("ghostgpu").confusion.recall
    # Utilization alone reclaims every job asleep between runs; the previous holder rule most of them.
    assert rows["window-util"].periodic_false_reclaims == ext.asleep
    assert 0 < rows["ghostgpu-no-timers"].periodic_false_reclaims < ext.asleep
    assert rows["paper-multi-signal"].periodic_false_reclaims == 0
    # the extended confusion is the published one plus the periodic jobs (all negatives)
    published = default.detector("window-util").confusion
    assert rows["window-util"].confusion.tn + rows["window-util"].confusion.fp == (
        published.tn + published.fp + ext.periodic_jobs
    )
