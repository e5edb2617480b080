"""Utilization signal: query building, response parsing and every failure mode, with the HTTP side
served by a real local server on 127.0.0.1 (canned Prometheus API answers, slow answers for the
timeout case)."""

from __future__ import annotations

import json
import math
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ghostgpu.config import MetricsConfig, MetricsPreset
from ghostgpu.signals.prometheus import PrometheusClient, PrometheusError, parse_vector
from ghostgpu.signals.utilization import (
    FIELD_LABEL,
    PodKey,
    PodReading,
    QuerySpec,
    UtilizationRing,
    UtilizationSource,
    build_query,
    max_series,
    workload_memory,
    workload_sample,
)
from ghostgpu.verdict import (
    FailureReason,
    GpuMemory,
    Rule,
    SignalFailure,
    VerdictPolicy,
    window_verdict,
    window_verdict_from_runs,
)

NOW = 1_760_000_000.0
SPEC = QuerySpec.from_preset(MetricsConfig().dcgm, max_sample_age=60)


@dataclass
class Canned:
    status: int = 200
    body: object = None
    raw: bytes | None = None
    delay: float = 0.0
    queries: list[dict[str, list[str]]] = field(default_factory=list)


@pytest.fixture
def prom() -> Iterator[tuple[str, Canned]]:
    canned = Canned()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a: object) -> None:
            pass

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            canned.queries.append(urllib.parse.parse_qs(self.rfile.read(length).decode()))
            if canned.delay:
                time.sleep(canned.delay)
            data = canned.raw if canned.raw is not None else json.dumps(canned.body).encode()
            try:
                self.send_response(canned.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", canned
    server.shutdown()
    server.server_close()


def series(field_: str, ns: str, pod: str, value: float, ts: float = NOW, **extra: str) -> dict:
    return {
        "metric": {FIELD_LABEL: field_, "namespace": ns, "pod": pod, **extra},
        "value": [ts, repr(value) if not isinstance(value, str) else value],
    }


def success(*result: dict) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": list(result)}}


A, B, C = PodKey("team-a", "train-0"), PodKey("team-a", "notebook-7f9c"), PodKey("team-b", "serve.v2-0")


async def poll(url: str, pods: list[PodKey], *, timeout: float = 2.0, spec: QuerySpec = SPEC):
    async with PrometheusClient(url, timeout=timeout) as client:
        return await UtilizationSource(client, spec).poll(pods, now=NOW)


# --- query building -------------------------------------------------------------------------------


def test_query_is_one_expression_that_does_not_grow_with_the_pods() -> None:
    q = build_query(SPEC, [A, B, C])
    # the reading (twice: as `util`, and as the one zero filter of `fb` and `uid` together:
    # Prometheus evaluates it again wherever the query names it), its timestamp (once: stale pods
    # get `ts` beside their reading) and the idle pods' UIDs, all over the same selector:
    # dcgm-exporter's scrape only
    assert q.count("DCGM_FI_DEV_GPU_UTIL{") == 4
    assert q.count('DCGM_FI_DEV_GPU_UTIL{job=~"nvidia-dcgm-exporter|dcgm-exporter", ') == 4
    assert q.count("and on(namespace, pod) ((max by (namespace, pod) (max_over_time(") == 1
    assert q.count("min by (namespace, pod) (timestamp(DCGM_FI_DEV_GPU_UTIL{") == 1
    assert ">= time() - 60" not in q and "< time() - 60," in q
    # namespaces are named (escaped), pods are not: the query does not grow with the fleet
    assert 'pod=~".+"' in q and "notebook-7f9c" not in q
    assert 'namespace=~"team-a|team-b"' in q
    many = [PodKey(f"team-{i % 3}", f"pod-{i}") for i in range(5000)]
    assert len(build_query(SPEC, many)) == len(build_query(SPEC, many[:3])) < 2500
    assert "DCGM_FI_DEV_XID_ERRORS{" in q and "> 0" in q
    # util, ts, uid, fb (framebuffer in bytes: dcgm-exporter reports MiB), fbneg and xid in one
    # expression (the poll's own query also asks for samples ahead of the clock: build_query(now=))
    assert q.count(" or ") == 5
    assert "timestamp(DCGM_FI_DEV_GPU_UTIL{" in q
    assert "(sum by (namespace, pod) (max without (container) (max_over_time(DCGM_FI_DEV_FB_USED{" in q
    assert ") * 1048576" in q
    # memory and UIDs only for the pods at or under the zero threshold, under one filter
    assert (
        ') * 1048576, "ghostgpu_field", "fb", "", "")) and on(namespace, pod) '
        "((max by (namespace, pod) (max_over_time(DCGM_FI_DEV_GPU_UTIL{" in q
    )
    assert ")) <= 0)" in q
    assert '"ghostgpu_field", "fb"' in q


def test_query_uses_label_mapping_and_scale() -> None:
    exported = MetricsPreset.model_validate(
        MetricsConfig().dcgm.model_dump()
        | {"namespace_label": "exported_namespace", "pod_label": "exported_pod", "utilization_scale": 100.0}
    )
    q = build_query(QuerySpec.from_preset(exported, max_sample_age=60), [A])
    assert 'exported_pod=~".+"' in q and 'exported_namespace=~"team-a"' in q
    assert "max by (exported_namespace, exported_pod)" in q and "* 100" in q
    hami = build_query(QuerySpec.from_preset(MetricsConfig().hami, max_sample_age=60), [A])
    assert "Device_utilization_desc_of_container{" in hami and 'podname=~".+"' in hami


async def test_exported_labels_and_hami_xid_labels_map_back_to_pods(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    spec = QuerySpec.from_preset(MetricsConfig().hami, max_sample_age=60)
    canned.body = success(
        {
            "metric": {FIELD_LABEL: "util", "podnamespace": "team-a", "podname": "train-0"},
            "value": [NOW, "0"],
        },
        {
            "metric": {FIELD_LABEL: "ts", "podnamespace": "team-a", "podname": "train-0"},
            "value": [NOW, str(NOW)],
        },
        # HAMi's XID comes from dcgm-exporter, labelled namespace/pod
        {"metric": {FIELD_LABEL: "xid", "namespace": "team-a", "pod": "train-0"}, "value": [NOW, "48"]},
    )
    out = await poll(url, [A], spec=spec)
    assert out[A].utilization == 0.0 and [x.code for x in out[A].xids] == [48]


def test_query_rejects_a_name_that_could_inject_promql() -> None:
    # Namespaces are written into the query: a name that is not a Kubernetes name is refused.
    with pytest.raises(ValueError, match="namespace"):
        build_query(SPEC, [PodKey('team-a"} or vector(1) #', "p")])
    # Pod names never are (every pod is matched and filtered in the controller).
    query = build_query(SPEC, [PodKey("team-a", 'x"} or vector(1) #')])
    assert "vector(1)" not in query and 'namespace=~"team-a"' in query


def test_spec_rejects_label_names_that_are_not_labels() -> None:
    with pytest.raises(ValueError):
        QuerySpec(metric="DCGM_FI_DEV_GPU_UTIL", pod_label='pod"}')
    with pytest.raises(ValueError):
        QuerySpec(metric="up or vector(1)")


# --- parsing through the real HTTP path -----------------------------------------------------------


async def test_readings_per_pod_with_max_over_gpus_and_xids(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    canned.body = success(
        series("util", "team-a", "train-0", 87.0),
        series("ts", "team-a", "train-0", NOW - 15),
        series("util", "team-a", "notebook-7f9c", 0.0),
        series("ts", "team-a", "notebook-7f9c", NOW - 5),
        series("xid", "team-a", "notebook-7f9c", 79.0, gpu="1"),
        series("util", "other-ns", "train-0", 55.0),  # same pod name elsewhere: ignored
        series("ts", "other-ns", "train-0", NOW),
    )
    out = await poll(url, [A, B])
    # No framebuffer series in this answer: memory is missing (a failure), utilization stands.
    assert out[A].utilization == 87.0 and out[A].xids == ()
    assert isinstance(out[A].memory, SignalFailure) and out[A].memory.reason is FailureReason.MISSING
    assert out[B].utilization == 0.0
    assert [(x.code, x.gpu) for x in out[B].xids] == [(79, "1")]
    assert len(canned.queries) == 1, "one HTTP query per poll"
    assert canned.queries[0]["time"] == [f"{NOW:.3f}"]


async def test_a_pod_in_an_invalid_namespace_fails_alone_and_busy_readings_are_shared(
    prom: tuple[str, Canned],
) -> None:
    url, canned = prom
    canned.body = success(
        series("util", "team-a", "train-0", 87.0),
        series("util", "team-a", "notebook-7f9c", 87.0),
    )
    bad = PodKey("Team_A", "x")
    out = await poll(url, [A, bad, B])
    assert isinstance(out[bad].utilization, SignalFailure)
    assert out[bad].utilization.detail == "invalid namespace name"
    assert "Team_A" not in canned.queries[0]["query"][0]  # never written into the query
    # Two busy pods with the same reading share one frozen object; values stay per pod.
    assert out[A].utilization == out[B].utilization == 87.0 and out[A] is out[B]


async def test_the_series_cap_counts_only_the_pods_of_valid_namespaces(prom: tuple[str, Canned]) -> None:
    """The cap is max_series of the pods asked about: a pod of an invalid namespace is not asked
    about, so it does not raise the cap (the set of pods the answer is filtered by is theirs)."""
    url, canned = prom
    xids = [series("xid", "team-a", "train-0", 79.0, gpu=str(g)) for g in range(max_series(1) - 1)]
    canned.body = success(series("util", "team-a", "train-0", 87.0), *xids)
    out = await poll(url, [A])
    assert out[A].utilization == 87.0 and len(out[A].xids) == max_series(1) - 1  # at the cap: read
    canned.body = success(
        series("util", "team-a", "train-0", 87.0), series("xid", "team-a", "x", 79.0), *xids
    )
    for pods in ([A], [A, PodKey("Team_A", "x")]):
        failed = (await poll(url, pods))[A].utilization
        assert isinstance(failed, SignalFailure) and "more than" in failed.detail


async def test_framebuffer_bytes_per_pod_and_workload_sum(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    canned.body = success(
        series("util", "team-a", "train-0", 0.0),
        series("ts", "team-a", "train-0", NOW),
        series("fb", "team-a", "train-0", float(3 << 30)),
        series("util", "team-a", "notebook-7f9c", 0.0),
        series("ts", "team-a", "notebook-7f9c", NOW),
        series("fb", "team-a", "notebook-7f9c", 0.0),
    )
    out = await poll(url, [A, B])
    assert out[A] == PodReading(0.0, (), 3 << 30)
    assert out[B] == PodReading(0.0, (), 0)
    assert workload_memory([out[A], out[B]]) == GpuMemory(used_bytes=3 << 30)
    missing = PodReading(0.0, (), SignalFailure(reason=FailureReason.MISSING))
    assert workload_memory([out[A], missing]) == missing.memory, "one pod failing fails the workload"
    assert workload_memory([PodReading(0.0)]) is None, "not collected is not a failure"


def test_a_preset_without_a_framebuffer_query_collects_no_memory() -> None:
    spec = SPEC.model_copy(update={"framebuffer_query": None})
    assert '"fb"' not in build_query(spec, [A])


async def test_missing_series_is_a_failure_not_zero(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    canned.body = success(series("util", "team-a", "train-0", 3.0), series("ts", "team-a", "train-0", NOW))
    out = await poll(url, [A, B])
    assert out[A].utilization == 3.0
    assert isinstance(out[B].utilization, SignalFailure)
    assert out[B].utilization.reason is FailureReason.MISSING


async def test_empty_result_fails_every_pod(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    canned.body = success()
    out = await poll(url, [A, B, C])
    assert {r.utilization.reason for r in out.values() if isinstance(r.utilization, SignalFailure)} == {
        FailureReason.MISSING
    }
    assert len(out) == 3


async def test_stale_sample_is_a_failure(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    canned.body = success(
        series("util", "team-a", "train-0", 0.0),
        series("ts", "team-a", "train-0", NOW - 61),  # older than max_sample_age=60
        series("util", "team-a", "notebook-7f9c", 0.0),
        series("ts", "team-a", "notebook-7f9c", NOW - 59),
    )
    out = await poll(url, [A, B])
    assert isinstance(out[A].utilization, SignalFailure) and out[A].utilization.reason is FailureReason.STALE
    assert out[B].utilization == 0.0


async def test_series_kinds_the_query_sends_map_to_fresh_stale_missing_and_memory_asked_only_at_zero(
    prom: tuple[str, Canned],
) -> None:
    """The query answers a fresh pod with `util` (no `ts`), a stale pod with `ts` only, and `fb`
    only at or under the zero threshold; a pod with nothing is MISSING, never a zero."""
    url, canned = prom
    canned.body = success(
        series("util", "team-a", "train-0", 0.0),  # fresh, idle: its memory was asked for
        series("fb", "team-a", "train-0", 1.0),
        series("ts", "team-a", "notebook-7f9c", NOW - 300),  # stale: no reading at all
        series("util", "team-b", "serve.v2-0", 55.0),  # fresh, busy: memory not asked
    )
    out = await poll(url, [A, B, C, PodKey("team-a", "gone-0")])
    assert out[A].utilization == 0.0 and out[A].memory == 1
    assert isinstance(out[B].utilization, SignalFailure) and out[B].utilization.reason is FailureReason.STALE
    assert "300s old" in out[B].utilization.detail
    assert out[C].utilization == 55.0
    assert isinstance(out[C].memory, SignalFailure) and out[C].memory.reason is FailureReason.MISSING
    gone = out[PodKey("team-a", "gone-0")].utilization
    assert isinstance(gone, SignalFailure) and gone.reason is FailureReason.MISSING
    # an idle pod whose `fb` series is absent has a missing memory reading, its utilization stands
    canned.body = success(series("util", "team-a", "train-0", 0.0))
    out = await poll(url, [A])
    assert out[A].utilization == 0.0
    assert isinstance(out[A].memory, SignalFailure) and out[A].memory.reason is FailureReason.MISSING
    # an answer carrying a stale `ts` beside a `util` is STALE: the timestamp is always checked
    canned.body = success(
        series("util", "team-a", "train-0", 0.0), series("ts", "team-a", "train-0", NOW - 61)
    )
    assert (await poll(url, [A]))[A].utilization.reason is FailureReason.STALE  # type: ignore[union-attr]


async def test_nan_reading_counts_as_missing(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    canned.body = success(series("util", "team-a", "train-0", "NaN"), series("ts", "team-a", "train-0", NOW))
    out = await poll(url, [A])
    assert isinstance(out[A].utilization, SignalFailure)


@pytest.mark.parametrize("status", [500, 503, 422])
async def test_http_error_fails_every_pod(prom: tuple[str, Canned], status: int) -> None:
    url, canned = prom
    canned.status = status
    canned.body = {"status": "error", "errorType": "execution", "error": "query timed out in expression eval"}
    out = await poll(url, [A, B])
    for r in out.values():
        assert isinstance(r.utilization, SignalFailure)
        assert r.utilization.reason is FailureReason.HTTP_ERROR
        assert str(status) in r.utilization.detail


async def test_http_500_with_html_body(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    canned.status, canned.raw = 500, b"<html>Internal Server Error</html>"
    out = await poll(url, [A])
    assert out[A].utilization.reason is FailureReason.HTTP_ERROR  # type: ignore[union-attr]


async def test_timeout_fails_every_pod(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    canned.delay = 1.5
    canned.body = success(series("util", "team-a", "train-0", 50.0), series("ts", "team-a", "train-0", NOW))
    t0 = time.monotonic()
    out = await poll(url, [A], timeout=0.3)
    assert time.monotonic() - t0 < 1.4, "the client must give up at its timeout"
    assert out[A].utilization.reason is FailureReason.TIMEOUT  # type: ignore[union-attr]


async def test_connection_refused_is_http_error() -> None:
    out = await poll("http://127.0.0.1:9", [A], timeout=1.0)
    assert out[A].utilization.reason is FailureReason.HTTP_ERROR  # type: ignore[union-attr]


async def test_status_error_with_200_and_non_json(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    canned.body = {"status": "error", "errorType": "bad_data", "error": "parse error"}
    out = await poll(url, [A])
    assert out[A].utilization.reason is FailureReason.HTTP_ERROR  # type: ignore[union-attr]
    canned.body, canned.raw = None, b"not json"
    out = await poll(url, [A])
    assert out[A].utilization.reason is FailureReason.PARSE_ERROR  # type: ignore[union-attr]


def test_parse_vector_rejects_matrix_and_malformed_samples() -> None:
    with pytest.raises(PrometheusError) as e:
        parse_vector({"status": "success", "data": {"resultType": "matrix", "result": []}})
    assert e.value.failure.reason is FailureReason.PARSE_ERROR
    with pytest.raises(PrometheusError):
        parse_vector(success({"metric": {}, "value": [NOW]}))
    with pytest.raises(PrometheusError):
        parse_vector(success({"metric": {}, "value": [NOW, "abc"]}))


async def test_a_malformed_item_fails_the_whole_answer_in_the_poll(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    canned.body = success(
        series("util", "team-a", "train-0", 87.0),
        series("ts", "team-a", "train-0", NOW),
        {"metric": ["not", "labels"], "value": [NOW, "1"]},
    )
    out = await poll(url, [A])
    assert isinstance(out[A].utilization, SignalFailure)
    assert out[A].utilization.reason is FailureReason.PARSE_ERROR


async def test_invalid_pod_name_fails_only_that_pod(prom: tuple[str, Canned]) -> None:
    url, canned = prom
    canned.body = success(series("util", "team-a", "train-0", 9.0), series("ts", "team-a", "train-0", NOW))
    bad = PodKey("team-a", "Bad_Name")
    out = await poll(url, [A, bad])
    assert out[A].utilization == 9.0
    assert isinstance(out[bad].utilization, SignalFailure)


# --- aggregation and the ring ----------------------------------------------------------------------


def test_workload_sample_is_max_over_pods_and_fails_safe() -> None:
    assert workload_sample([PodReading(0.0), PodReading(12.0)]) == 12.0
    fail = SignalFailure(reason=FailureReason.STALE)
    assert workload_sample([PodReading(50.0), PodReading(fail)]) == fail
    assert isinstance(workload_sample([]), SignalFailure)


def test_ring_keeps_last_k_oldest_first() -> None:
    ring = UtilizationRing(size=3)
    for v in (5.0, 0.0, 0.0, 0.0):
        ring.push(v)
    assert ring.samples == (0.0, 0.0, 0.0)
    assert ring.newest_all_zero(3, 0.0)
    ring.push(SignalFailure(reason=FailureReason.MISSING))
    assert not ring.newest_all_zero(1, 0.0), "a failure is never a zero"
    assert not ring.newest_all_zero(3, 0.0)
    ring.resize(5)
    assert len(ring) == 3 and ring.size == 5
    assert not UtilizationRing(size=5).newest_all_zero(5, 0.0)
    ring.resize(2)
    assert ring.samples == (0.0, SignalFailure(reason=FailureReason.MISSING))


def test_rings_share_whole_percent_readings_and_allocate_their_slots_once() -> None:
    """50,000 rings of 30 samples: a whole-percent reading is one shared float, not one per slot,
    and a ring's slots are allocated once (nothing long-lived is allocated per poll)."""
    a, b = UtilizationRing(size=30), UtilizationRing(size=30)
    a.push(float("87"))
    b.push(float("87"))
    assert a.samples[-1] is b.samples[-1]
    a.push(87.5)
    assert a.samples == (87.0, 87.5)
    store = a._slots
    for v in range(40):
        a.push(float(v))
    assert a.samples == tuple(float(v) for v in range(10, 40)) and a._slots is store


@settings(max_examples=200, deadline=None)
@given(
    size=st.integers(1, 8),
    ops=st.lists(
        st.one_of(
            st.floats(0, 100).map(lambda v: ("push", v)),
            st.just(("push", math.nan)),  # not a reading at or under any threshold (see below)
            st.just(("fail", None)),
            st.just(("clear", None)),
            st.integers(1, 8).map(lambda n: ("resize", n)),
        ),
        max_size=40,
    ),
    k=st.integers(0, 9),
    threshold=st.sampled_from([0.0, 5.0, 50.0]),
    kept=st.sampled_from([0.0, 5.0, 50.0]),
)
def test_ring_behaves_as_the_last_size_samples(
    size: int, ops: list, k: int, threshold: float, kept: float
) -> None:
    """The circular ring against the plain model: a list cut to its last `size` samples. Its
    runs (kept on push for `kept`, counted for any other threshold) judge a window exactly as a
    pass over the window's samples does."""
    ring, model = UtilizationRing(size=size, zero_threshold=kept), []
    fail = SignalFailure(reason=FailureReason.MISSING)
    for op, arg in ops:
        if op == "push":
            ring.push(arg)
            model = [*model, arg][-ring.size :]
        elif op == "fail":
            ring.push(fail)
            model = [*model, fail][-ring.size :]
        elif op == "clear":
            ring.clear()
            model = []
        else:
            ring.resize(arg)
            model = model[-arg:]
        assert ring.samples == tuple(model) and len(ring) == len(model)  # items: identity first (NaN)
    tail = model[-k:] if k else []
    zeros = all(not isinstance(s, SignalFailure) and s <= threshold for s in tail)
    expect = k > 0 and len(tail) == k and zeros
    assert ring.newest_all_zero(k, threshold) == expect
    for rule, window in ((Rule.GHOSTGPU, max(k, 1)), (Rule.WINDOW_UTIL, max(k, 1)), (Rule.SINGLE_UTIL, 3)):
        policy = VerdictPolicy(rule=rule, window=window, zero_threshold=threshold)
        by_pass = window_verdict(ring.newest(policy.effective_window), policy)
        assert window_verdict_from_runs(*ring.runs(threshold), policy) is by_pass


def test_a_nan_reading_never_counts_toward_an_all_zero_window() -> None:
    """The controller never sees one (a NaN series is dropped and counts as missing), but the ring
    and the pass over samples (which decide() also reads the long window from) must agree on it all
    the same: a NaN is not a reading at or under the threshold, so it breaks the zero run (fail
    safe: never closer to a reclaim)."""
    from ghostgpu.verdict import window_runs

    samples = (0.0, 0.0, math.nan, 0.0)
    ring = UtilizationRing(size=4)
    for s in samples:
        ring.push(s)
    assert ring.runs(0.0) == window_runs(samples, 0.0) == (4, 4, 1)
    assert not ring.newest_all_zero(2, 0.0) and ring.newest_all_zero(1, 0.0)
    assert ring.runs(5.0) == window_runs(samples, 5.0) == (4, 4, 1)  # counted, not kept


def test_the_bench_floor_query_asks_every_signal_of_every_pod_unfiltered() -> None:
    from ghostgpu.signals.utilization import every_signal_query

    q = every_signal_query(SPEC, [A, B, C])
    assert q.count(" or ") == 2 and " and on(" not in q and "time()" not in q
    for kind in ("util", "ts", "fb"):
        assert f'"ghostgpu_field", "{kind}"' in q
    assert len(every_signal_query(SPEC, [PodKey("team-a", f"p{i}") for i in range(5000)])) == len(
        every_signal_query(SPEC, [A])
    )
