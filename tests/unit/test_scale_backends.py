"""`ghostgpu bench scale --backend`: the metrics stores the bench measures against (pure parts; the
bench itself runs in tests/e2e/test_scale_smoke.py and by hand)."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.config import ControllerConfig
from ghostgpu.scale import backends
from ghostgpu.scale.bench import BenchConfig, Side, SizeResult, controller_config, from_json, to_json


def test_backends_are_named_in_order_and_a_wrong_one_is_named() -> None:
    assert backends.parse_backends("victoriametrics, prometheus") == ("victoriametrics", "prometheus")
    with pytest.raises(ValueError, match="mimir: expected some of prometheus, victoriametrics"):
        backends.parse_backends("prometheus,mimir")
    with pytest.raises(ValueError, match="named twice"):
        backends.parse_backends("prometheus,prometheus")
    with pytest.raises(ValueError, match="none given"):
        backends.parse_backends(" , ")


def test_the_cli_refuses_an_unknown_backend_before_starting_anything() -> None:
    out = CliRunner().invoke(app, ["bench", "scale", "--sizes", "10", "--backend", "thanos"])
    assert out.exit_code != 0
    assert "--backend 'thanos': thanos: expected some of prometheus, victoriametrics" in out.output


def test_the_controller_against_victoriametrics_waits_for_its_ingest_delay() -> None:
    prom = controller_config("http://127.0.0.1:9090", 5)
    vm = controller_config("http://127.0.0.1:8428", 5, "agent", "victoriametrics")
    assert "ingestDelay" not in prom["controller"]["prometheus"]
    assert vm["controller"]["prometheus"] == {
        "url": "http://127.0.0.1:8428",
        "timeout": "60s",
        "ingestDelay": "5s",
    }
    # both are configs the controller accepts
    assert ControllerConfig.model_validate(vm["controller"]).prometheus.ingest_delay_seconds == 5.0
    ControllerConfig.model_validate(prom["controller"])


def test_queries_are_counted_from_either_stores_metrics() -> None:
    prometheus = (
        'prometheus_http_requests_total{code="200",handler="/api/v1/query"} 7\n'
        'prometheus_http_requests_total{code="400",handler="/api/v1/query"} 1\n'
        'prometheus_http_requests_total{code="200",handler="/api/v1/query_range"} 50\n'
    )
    vm = (
        'vm_http_requests_total{path="/api/v1/query"} 12\n'
        'vm_http_requests_total{path="/api/v1/query_range"} 3\n'
        'vm_http_requests_total{path="/influx/query", protocol="influx"} 9\n'
    )
    assert backends.queries_in(prometheus) == 8
    assert backends.queries_in(vm) == 12


def _side(wall: float) -> Side:
    return Side(wall, 0.1, 100.0, 1, 2, 0, 3, cycle_cpu_s=0.2, writes=0)


def test_each_backends_result_is_saved_and_read_back_and_shown_beside_the_first() -> None:
    res = SizeResult(n=1000, idle=10, nodes=125, ghostgpu=_side(0.5), naive=_side(5.0), backend="prometheus")
    same, other = {"ACTIVE": 990, "FINISHED_IDLE": 10}, {"ACTIVE": 990, "UNKNOWN": 10}
    res.backends["prometheus"] = backends.BackendResult("prometheus", _side(0.5), same, 0.21, 310.0)
    res.backends["victoriametrics"] = backends.BackendResult(
        "victoriametrics", _side(0.4), other, 0.05, 120.0
    )
    data = json.loads(
        json.dumps(to_json([res], BenchConfig(sizes=(1000,), backends=("prometheus", "victoriametrics"))))
    )
    assert data["config"]["backends"] == ["prometheus", "victoriametrics"]
    [back] = from_json(data)
    assert back.backends["victoriametrics"].ghostgpu == _side(0.4)
    assert asdict(back) == asdict(res)
    table = backends.backends_markdown([back])
    lines = table.splitlines()
    assert lines[2].startswith(
        "| 1,000 | prometheus | 0.500 | 0.200 | 100 | 1 | 0.210 | 310 | ACTIVE 990, FINISHED_IDLE 10 |"
    )
    assert "| victoriametrics | 0.400 |" in lines[3] and "DIFFER: {'ACTIVE': 990, 'UNKNOWN': 10}" in lines[3]
    # read back from JSON (keys sorted), the store measured in full still comes first
    res.backend = "victoriametrics"
    assert list(res.backends) == ["prometheus", "victoriametrics"]
    assert [line.split("|")[2].strip() for line in backends.backends_markdown([res]).splitlines()[2:]] == [
        "victoriametrics",
        "prometheus",
    ]
    res.backend = "prometheus"
    res.backends["victoriametrics"].states = dict(same)
    assert backends.backends_markdown([res]).splitlines()[3].endswith("| same as first |")


def test_results_saved_before_backends_read_back_with_none() -> None:
    res = SizeResult(n=10, idle=1, nodes=2, ghostgpu=_side(0.5), naive=_side(5.0))
    data = to_json([res], BenchConfig(sizes=(10,)))
    for r in data["results"]:
        del r["backends"], r["backend"]
    [back] = from_json(json.loads(json.dumps(data)))
    assert back.backends == {} and back.backend == "prometheus"


async def test_the_first_store_keeps_its_figures_and_each_other_runs_the_controller_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[str] = []

    class FakeStores:
        def use(self, name: str, scrape_interval: str) -> str:
            calls.append(f"use {name} {scrape_interval}")
            return f"http://{name}"

    def figures(url: str, conf: dict, spec: object, n: int) -> tuple[float, float]:
        calls.append(f"figures {url} {conf['url']} {n}")
        return (0.25, 64.0)

    class Run:
        def __init__(self) -> None:
            self.side = _side(0.7)
            self.rows = [{"states": {"ACTIVE": 9}}, {"states": {"ACTIVE": 10}}]

    async def controller_run(url: str) -> Run:
        calls.append(f"controller {url}")
        return Run()

    monkeypatch.setattr(backends, "store_figures", figures)
    first = SizeResult(n=10, idle=0, nodes=2, ghostgpu=_side(0.5), naive=_side(5.0), states={"ACTIVE": 10})
    out = await backends.measure_backends(
        ("victoriametrics", "prometheus"),
        FakeStores(),  # type: ignore[arg-type]
        first,
        object(),
        "5s",
        wait_series=lambda url: calls.append(f"wait {url}"),  # type: ignore[func-returns-value]
        controller_run=controller_run,
        controller_config=lambda url: {"url": url},
    )
    assert calls == [
        "use victoriametrics 5s",
        "figures http://victoriametrics http://victoriametrics 10",
        "use prometheus 5s",
        "wait http://prometheus",
        "controller http://prometheus",
        "figures http://prometheus http://prometheus 10",
    ]
    assert out["victoriametrics"] == backends.BackendResult(
        "victoriametrics", _side(0.5), {"ACTIVE": 10}, 0.25, 64.0
    )
    assert out["prometheus"] == backends.BackendResult("prometheus", _side(0.7), {"ACTIVE": 10}, 0.25, 64.0)


def test_the_controller_config_for_a_url_carries_what_the_store_there_needs() -> None:
    url = "http://127.0.0.1:18428"
    assert "ingestDelay" not in controller_config(url, 5)["controller"]["prometheus"]
    backends._SERVING[url] = "victoriametrics"
    try:
        assert controller_config(url, 5)["controller"]["prometheus"]["ingestDelay"] == "5s"
    finally:
        del backends._SERVING[url]
