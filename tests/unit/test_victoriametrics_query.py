"""VictoriaMetrics as the metrics store: what the controller sends and reads differently, and how the
devcluster runs it (tests/e2e/test_victoriametrics.py runs the real server)."""

from __future__ import annotations

from pathlib import Path

import httpx
import orjson
import pytest

from ghostgpu.config import ControllerConfig
from ghostgpu.controller.app import signal_sources
from ghostgpu.devcluster import components, victoriametrics
from ghostgpu.signals import prometheus as prom_module
from ghostgpu.signals.prometheus import PrometheusClient, iter_answer


async def test_every_query_asks_for_the_samples_up_to_the_time_asked() -> None:
    """Without nocache=1 VictoriaMetrics answers a query for `now` as of 30 s earlier
    (-search.latencyOffset) and stamps the answer with `now`."""
    forms: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        forms.append(request.content)
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        client = PrometheusClient("http://store:8428", client=http)
        await client.query("up", at=1_760_000_000.0)
        await client.query("up")
    sent = [dict(httpx.QueryParams(f.decode())) for f in forms]
    assert sent == [
        {"query": "up", "nocache": "1", "time": "1760000000.000"},
        {"query": "up", "nocache": "1"},
    ]


def test_the_ingest_delay_widens_the_query_windows() -> None:
    def window(**prometheus: str) -> float:
        cfg = ControllerConfig.model_validate(
            {"metrics": {"scrapeInterval": "15s"}, "processSource": "agent", "prometheus": prometheus}
        )
        return signal_sources(
            cfg, PrometheusClient("http://127.0.0.1:1"), executor=None
        ).utilization.spec.window  # type: ignore[arg-type]

    assert window() == 30.0  # Prometheus: the last two scrapes
    assert window(ingestDelay="5s") == 35.0
    with pytest.raises(ValueError, match="positive duration"):
        window(ingestDelay="0s")


def _vm_body(items: list[tuple[dict[str, str], float, str]]) -> bytes:
    """An instant-query answer laid out byte for byte as VictoriaMetrics writes it
    (app/vmselect/prometheus/query_response.qtpl): no spaces, then a `stats` object after `data`."""
    result = ",".join(
        '{"metric":' + orjson.dumps(m).decode() + ',"value":[' + f'{ts:.3f},"{v}"' + "]}"
        for m, ts, v in items
    )
    return (
        '{"status":"success","data":{"resultType":"vector","result":[' + result + "]},"
        '"stats":{"seriesFetched": "3","executionTimeMsec":2}}'
    ).encode()


def test_a_victoriametrics_answer_is_read_a_slice_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    items = [({"namespace": "a", "pod": f"p{i}", "ghostgpu_field": "util"}, 1.5, str(i)) for i in range(50)]
    body = _vm_body(items)

    def whole(_: object) -> object:
        raise AssertionError("parsed whole: the answer's layout was not recognised")

    monkeypatch.setattr(prom_module, "vector_result", whole)
    got = list(iter_answer(body, chunk_bytes=200))
    assert got == [(1.5, m, float(v)) for m, _, v in items]


def test_scrape_config_drops_only_what_the_strict_parser_refuses(tmp_path: Path) -> None:
    prom = components.prometheus_config(9400, tmp_path / "targets", prometheus_port=9090)
    vm = victoriametrics.scrape_config(prom)
    assert "evaluation_interval" in prom["global"]  # the original is not changed
    assert vm["global"] == {"scrape_interval": "1s"}
    sds = [sd for job in vm["scrape_configs"] for sd in job.get("file_sd_configs", [])]
    assert sds and all(set(sd) == {"files"} for sd in sds)
    strip = {"file_sd_configs"}
    assert [{k: v for k, v in j.items() if k not in strip} for j in vm["scrape_configs"]] == [
        {k: v for k, v in j.items() if k not in strip} for j in prom["scrape_configs"]
    ]


def test_server_argv_listens_on_loopback_and_rereads_file_sd_every_second(tmp_path: Path) -> None:
    argv = victoriametrics.argv(Path("/bin/victoria-metrics"), tmp_path / "s.yml", tmp_path / "data", 8428)
    assert argv[0] == "/bin/victoria-metrics"
    assert f"-promscrape.config={tmp_path / 's.yml'}" in argv
    assert "-httpListenAddr=127.0.0.1:8428" in argv
    assert "-promscrape.fileSDCheckInterval=1s" in argv
    assert not any(a.startswith("-search.latencyOffset") for a in argv)  # the client copes with the default


def test_an_unknown_metrics_store_is_refused_before_anything_starts(tmp_path: Path) -> None:
    from ghostgpu.devcluster.cluster import DevCluster

    with pytest.raises(
        ValueError, match=r"metrics store 'thanos': expected one of \['prometheus', 'victoriametrics'\]"
    ):
        DevCluster.up(tmp_path / "state", metrics_store="thanos")
    assert not (tmp_path / "state").exists()


def _cluster_body(partial: bool, items: list[tuple[dict[str, str], float, str]]) -> bytes:
    """vmselect's layout: `isPartial` after `status`."""
    body = _vm_body(items)
    flag = b'"isPartial":' + (b"true" if partial else b"false") + b","
    return body.replace(b'{"status":"success",', b'{"status":"success",' + flag, 1)


def test_a_partial_cluster_answer_fails_and_a_whole_one_is_read_a_slice_at_a_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    items = [({"namespace": "a", "pod": f"p{i}"}, 1.5, "0") for i in range(30)]
    with pytest.raises(prom_module.PrometheusError, match="partial answer") as err:
        list(iter_answer(_cluster_body(True, items), chunk_bytes=200))
    assert err.value.failure.reason.value == "other"

    def whole(_: object) -> object:
        raise AssertionError("parsed whole: the answer's layout was not recognised")

    monkeypatch.setattr(prom_module, "vector_result", whole)
    assert len(list(iter_answer(_cluster_body(False, items), chunk_bytes=200))) == 30
