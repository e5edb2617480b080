"""`ghostgpu doctor`'s row "prometheus: one producer per signal" over canned Prometheus answers
(the queries run against the devcluster's Prometheus in tests/e2e/test_forged_series.py)."""

from __future__ import annotations

from typing import Any

from ghostgpu.config import load_default_config
from ghostgpu.doctor.prometheus_checks import check_signal_sources

ROW = "prometheus: one producer per signal"


class Prom:
    """Answers each query with the result of the first (substring, result) that it contains."""

    def __init__(self, *answers: tuple[str, list[dict[str, Any]]], dropped: float | None = 0.0) -> None:
        self.answers = list(answers)
        self.dropped = dropped
        self.queries: list[str] = []

    async def query(self, promql: str) -> list[dict[str, Any]]:
        self.queries.append(promql)
        if "increase(prometheus_target_scrapes_sample_out_of_order_total" in promql:
            return (
                []
                if self.dropped is None or self.dropped < 0
                else [{"metric": {}, "value": [0, str(self.dropped)]}]
            )
        if "count(prometheus_target_scrapes_sample_out_of_order_total)" in promql:
            return [{"metric": {}, "value": [0, "0"]}] if self.dropped is not None else []
        return next((result for needle, result in self.answers if needle in promql), [])


def one(metric: dict[str, str], value: str = "1") -> list[dict[str, Any]]:
    return [{"metric": metric, "value": [0, value]}]


async def run(prom: Prom, namespaces: list[str] | None = None) -> Any:
    ctrl = load_default_config().controller  # agent mode: GPU, XID and agent series
    return await check_signal_sources(prom, ctrl, ["team-a"] if namespaces is None else namespaces)  # type: ignore[arg-type]


async def test_one_producer_per_signal_is_ok_and_every_query_is_pinned() -> None:
    prom = Prom()
    row = await run(prom)
    assert row.status == "ok" and row.check == ROW
    assert any('job=~"nvidia-dcgm-exporter|dcgm-exporter"' in q and "unless" in q for q in prom.queries)
    assert any('job=~"ghostgpu-agent", namespace=~"ghostgpu-agent"' in q for q in prom.queries)
    assert all('"team-a"' in q for q in prom.queries if "unless" in q)


async def test_a_second_producer_of_the_victims_series_fails_the_row() -> None:
    forged = one({"__name__": "DCGM_FI_DEV_GPU_UTIL", "job": "kubernetes-pods", "instance": "10.0.3.7:9400"})
    row = await run(Prom(("unless", forged)))
    assert row.status == "fail"
    assert "kubernetes-pods" in row.found and "10.0.3.7:9400" in row.found
    assert "honor_labels" in row.fix and "overrideHonorLabels" in row.fix


async def test_two_instances_for_one_pod_and_more_samples_than_scrapes_fail_the_row() -> None:
    two = one({"namespace": "team-a", "pod": "train-0"}, "2")
    row = await run(Prom(("> 1", two)))
    assert row.status == "fail" and "team-a/train-0" in row.found and "2 instances" in row.found
    doubled = one({"job": "dcgm-exporter", "instance": "127.0.0.1:9400"})
    row = await run(Prom(("count_over_time(up", doubled)))
    assert row.status == "fail" and "more samples than the target had scrapes" in row.found


async def test_dropped_out_of_order_samples_fail_the_row_and_no_self_scrape_warns() -> None:
    row = await run(Prom(dropped=42.0))
    assert row.status == "fail" and "42 out-of-order or duplicate" in row.found
    row = await run(Prom(dropped=None))
    assert row.status == "warn" and "does not scrape itself" in row.found
    row = await run(Prom(dropped=-1))  # the counters have one sample yet: no increase, nothing dropped
    assert row.status == "ok"
    row = await run(Prom(), namespaces=[])
    assert row.status == "warn"
