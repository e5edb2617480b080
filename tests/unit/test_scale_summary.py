"""The scale bench's summary of the probe's per-poll rows (pure; the bench itself is e2e)."""

from __future__ import annotations

from typing import Any

from ghostgpu.scale.bench import Side, SizeResult, summarise_controller
from ghostgpu.scale.report import markdown, targets


def _row(poll: int, cpu: float, process_cpu: float, rss: float = 100.0) -> dict[str, Any]:
    return {
        "poll": poll,
        "wall_s": cpu * 2,
        "cpu_s": cpu,
        "process_cpu_s": process_cpu,
        "peak_rss_mib": rss,
        "prometheus_queries": 1,
        "apiserver_requests": 3,
        "exec_calls": 1,
    }


def test_cycle_cpu_counts_what_happens_between_polls() -> None:
    # window 2: polls 1-3 warm up; steady polls 4-6 each cost 0.5 s in the poll, 0.7 s per cycle
    totals = [1.0, 1.6, 2.2, 2.9, 3.6, 4.3]
    rows = [_row(i + 1, 0.5, t, rss=100 + i) for i, t in enumerate(totals)]
    side, warm = summarise_controller(rows, window=2)
    assert side.cpu_s == 0.5 and side.polls == 3 and [w["poll"] for w in warm] == [1, 2, 3]
    assert side.cycle_cpu_s == 0.7
    assert side.peak_rss_mib == 105


def _result(cpu: float, cycle: float | None) -> SizeResult:
    mine = Side(1.0, cpu, 200.0, 1, 3, 1, 3, cycle_cpu_s=cycle)
    naive = Side(10.0, 9.0, 100.0, 100, 100, 100, 2)
    return SizeResult(n=10_000, idle=1, nodes=1, ghostgpu=mine, naive=naive)


def test_cpu_target_is_checked_against_the_stricter_figure() -> None:
    met = {name.split(" at")[0]: ok for name, ok, _ in targets([_result(0.8, 0.9)])}
    assert met["CPU per poll"] is True
    met = {name.split(" at")[0]: ok for name, ok, _ in targets([_result(0.8, 1.2)])}
    assert met["CPU per poll"] is False, "a cheap poll with costly work between polls is not met"
    met = {name.split(" at")[0]: ok for name, ok, _ in targets([_result(0.8, None)])}  # older JSON
    assert met["CPU per poll"] is True
    table = markdown([_result(0.8, 0.9)])
    assert "| 0.800 | 0.900 |" in table and "| 9.000 | — |" in table


def test_the_saved_json_keeps_every_poll_and_reads_back() -> None:
    import json

    from ghostgpu.scale.bench import BenchConfig, from_json, poll_rows, to_json

    rows = [{**_row(i + 1, 0.5, 0.5 * (i + 1)), "states": {"ACTIVE": 3}, "probe_only": 1} for i in range(4)]
    res = _result(0.5, 0.6)
    res.polls, res.startup = poll_rows(rows), {"sync_s": 2.5}
    assert all("probe_only" not in r for r in res.polls) and res.polls[3]["states"] == {"ACTIVE": 3}
    back = from_json(json.loads(json.dumps(to_json([res], BenchConfig()))))
    assert back[0].polls == res.polls and back[0].startup == {"sync_s": 2.5}
    old = to_json([res], BenchConfig())
    for r in old["results"]:  # a JSON saved before the rows were kept still reads
        del r["polls"], r["startup"]
    assert from_json(old)[0].polls == []


def test_rss_target_is_300_decimal_megabytes() -> None:
    def rss_met(mib: float) -> bool:
        res = _result(0.5, 0.5)
        res.ghostgpu.peak_rss_mib = mib
        return {name.split(" at")[0]: ok for name, ok, _ in targets([res])}["peak RSS"]

    assert rss_met(286.0) and not rss_met(287.0), "300 MB is 286.1 MiB, not 300 MiB"
