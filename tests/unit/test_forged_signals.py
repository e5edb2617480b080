"""Series a tenant forges are not evidence (docs/threat-model.md): each forged answer below is what
Prometheus returns to the poll's query when a second producer writes the victim's series, and each
ends in a failed signal, so the verdict of a busy workload can never be FINISHED_IDLE or
ZOMBIE_CRASHED. Every case has its honest twin, which is reclaimable: the checks are what tells
them apart, not a broken answer.

What Prometheus itself computes is asserted on the query here; the source selector and the
busiest sample of the window are also evaluated by Prometheus's own engine (promtool), and samples
ahead of the clock (which promtool's test loader does not hold: it loads samples up to the
evaluation time) against a real Prometheus in tests/e2e/test_forged_series.py.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_signals_agent import Prom

from ghostgpu.config import ControllerConfig, MetricsConfig, load_config_text
from ghostgpu.controller.app import signal_sources
from ghostgpu.signals.agent import AgentProcessSource, AgentSeries
from ghostgpu.signals.podexec import PodRef
from ghostgpu.signals.prometheus import PrometheusClient, PrometheusError, VectorSample
from ghostgpu.signals.utilization import (
    FIELD_LABEL,
    PodKey,
    PodReading,
    QuerySpec,
    UtilizationSource,
    build_query,
    readings_from_samples,
)
from ghostgpu.verdict import (
    Evidence,
    FailureReason,
    GpuMemory,
    ProcessCounts,
    SignalFailure,
    VerdictKind,
    decide,
)

NOW = 1_760_000_000.0
MAX_AGE = 180.0
METRICS = MetricsConfig()
SPEC = QuerySpec.from_preset(
    METRICS.dcgm,
    max_sample_age=MAX_AGE,
    agent_processes=True,
    agent_source=METRICS.agent_source,
    window=60.0,
    max_clock_skew=5.0,
)
POD = PodKey("team-a", "train-0")
UID = "0b5c6f1e-live"
REF = PodRef(POD.namespace, POD.name, "main")
ROLES = ("work", "wrapper", "holder", "timer", "session", "defunct")


@pytest.fixture
def prom() -> Iterator[Prom]:
    p = Prom()
    yield p
    p.server.shutdown()
    p.server.server_close()


def gpu(field_: str, value: float, **labels: str) -> dict[str, Any]:
    metric = {FIELD_LABEL: field_, "namespace": POD.namespace, "pod": POD.name, **labels}
    return {"metric": metric, "value": [NOW, repr(value)]}


def agent(field_: str, value: float, **labels: str) -> dict[str, Any]:
    base = {
        "tracked_namespace": POD.namespace,
        "tracked_pod": POD.name,
        "tracked_uid": UID,
        "tracked_container": "main",
    }
    return {"metric": base | labels | {FIELD_LABEL: field_}, "value": [NOW, repr(value)]}


def idle_answer(*, uid: str = UID, scan: float = NOW - 10) -> list[dict[str, Any]]:
    """What an idle pod's answer holds: utilization 0, no memory, only a holder process left."""
    roles = [agent("proc", 1 if r == "holder" else 0, role=r, tracked_uid=uid) for r in ROLES]
    return [gpu("util", 0), gpu("fb", 0), *roles, agent("scan", scan, tracked_uid=uid)]


async def poll(prom: Prom, result: list[dict[str, Any]]) -> tuple[PodReading, Any]:
    prom.body = lambda q: {"status": "success", "data": {"resultType": "vector", "result": result}}
    series = AgentSeries()
    async with PrometheusClient(prom.url, timeout=5) as client:
        readings = await UtilizationSource(client, SPEC, agent=series).poll([POD], now=NOW, uids={POD: UID})
        counts = (await AgentProcessSource(series, max_age=MAX_AGE).list_many([REF]))[REF]
    return readings[POD], counts


def verdict(reading: PodReading, counts: ProcessCounts | SignalFailure) -> VerdictKind:
    """The verdict over a window of this poll's reading (the controller's ring, full)."""
    memory = reading.memory
    observed = GpuMemory(used_bytes=memory) if isinstance(memory, int) else memory
    evidence = Evidence(utilization=(reading.utilization,) * 5, processes=counts, memory=observed)
    return decide(evidence).kind


RECLAIMABLE = (VerdictKind.FINISHED_IDLE, VerdictKind.ZOMBIE_CRASHED)


async def test_the_honest_idle_answer_is_reclaimable(prom: Prom) -> None:
    reading, counts = await poll(prom, idle_answer())
    assert counts == ProcessCounts(holder=1)
    assert verdict(reading, counts) is VerdictKind.FINISHED_IDLE


async def test_agent_series_of_another_pod_uid_fail_the_processes(prom: Prom) -> None:
    """A forger copies the pod's series from an old /metrics (or another pod of the same name)."""
    reading, counts = await poll(prom, idle_answer(uid="7d1e-a-pod-that-is-gone"))
    assert isinstance(counts, SignalFailure) and counts.reason is FailureReason.UNTRUSTED, counts
    assert UID in counts.detail and "7d1e-a-pod-that-is-gone" in counts.detail
    assert verdict(reading, counts) not in RECLAIMABLE


async def test_gpu_series_of_another_pod_uid_fail_the_utilization(prom: Prom) -> None:
    reading, counts = await poll(prom, [*idle_answer(), gpu("uid", 1, pod_uid="7d1e-other")])
    assert isinstance(reading.utilization, SignalFailure)
    assert (
        reading.utilization.reason is FailureReason.UNTRUSTED and "7d1e-other" in reading.utilization.detail
    )
    assert verdict(reading, counts) not in RECLAIMABLE
    # the live pod's own UID on its series is what an honest exporter writes
    honest, counts = await poll(prom, [*idle_answer(), gpu("uid", 1, pod_uid=UID)])
    assert verdict(honest, counts) is VerdictKind.FINISHED_IDLE


async def test_a_scan_time_ahead_of_the_clock_fails_the_processes(prom: Prom) -> None:
    """A fresh-looking scan an hour ahead (so it never goes stale) is no scan at all."""
    reading, counts = await poll(prom, idle_answer(scan=NOW + 3600))
    assert isinstance(counts, SignalFailure) and counts.reason is FailureReason.UNTRUSTED, counts
    assert "ahead" in counts.detail
    assert verdict(reading, counts) not in RECLAIMABLE
    # within the allowed skew (5 s): a clock a little ahead of the controller's is not a forger
    reading, counts = await poll(prom, idle_answer(scan=NOW + 3))
    assert verdict(reading, counts) is VerdictKind.FINISHED_IDLE


async def test_the_querys_own_ahead_checks_fail_the_pod(prom: Prom) -> None:
    """Prometheus answers `ahead` for a pod with a sample written ahead of the clock (the real
    samples were dropped as out of order), from the GPU or the agent series."""
    reading, counts = await poll(prom, [*idle_answer(), gpu("ahead", NOW + 30)])
    assert isinstance(reading.utilization, SignalFailure)
    assert reading.utilization.reason is FailureReason.UNTRUSTED and "30s ahead" in reading.utilization.detail
    assert verdict(reading, counts) not in RECLAIMABLE


async def test_a_negative_framebuffer_sample_fails_the_memory_instead_of_lowering_it(prom: Prom) -> None:
    """A busy pod's 8 GiB plus a forged -8 GiB series sums to 0; the negative sample fails it."""
    forged = [r for r in idle_answer() if r["metric"][FIELD_LABEL] != "fb"]
    reading, counts = await poll(prom, [*forged, gpu("fb", 0), gpu("fbneg", -8 * 2**30)])
    assert isinstance(reading.memory, SignalFailure) and reading.memory.reason is FailureReason.PARSE_ERROR
    assert verdict(reading, counts) not in RECLAIMABLE


async def test_a_reading_over_100_percent_fails(prom: Prom) -> None:
    reading, counts = await poll(prom, [gpu("util", 250), *idle_answer()[1:]])
    assert isinstance(reading.utilization, SignalFailure) and "over 100" in reading.utilization.detail
    assert verdict(reading, counts) not in RECLAIMABLE


def test_a_role_count_no_node_runs_fails_the_processes() -> None:
    from ghostgpu.signals.agent import AgentAnswer

    answer = AgentAnswer(eval_time=NOW)
    for r in ROLES:
        answer.add(
            "proc", agent("proc", 10**9 if r == "work" else 0, role=r)["metric"], 10**9 if r == "work" else 0
        )
    answer.add("scan", agent("scan", NOW)["metric"], NOW)
    got = answer.counts(REF, MAX_AGE)
    assert isinstance(got, SignalFailure) and got.reason is FailureReason.PARSE_ERROR


# --- a flood of series for pods that do not exist --------------------------------------------------


def test_series_of_pods_not_asked_about_are_dropped_and_a_flood_fails_every_pod() -> None:
    """200,000 series of made-up pods in a tracked namespace: the poll fails (UNKNOWN for all)
    instead of keeping them; a few stray ones are dropped before anything of them is kept."""
    from ghostgpu.signals.agent import AgentAnswer

    def fake(i: int, field_: str = "util") -> VectorSample:
        labels = {FIELD_LABEL: field_, "namespace": POD.namespace, "pod": f"ghost-{i}"}
        return VectorSample(labels=labels, timestamp=NOW, value=0.0)

    real = [
        VectorSample(labels=s["metric"], timestamp=NOW, value=float(s["value"][1])) for s in idle_answer()
    ]
    answer = AgentAnswer(eval_time=NOW, pods=frozenset({POD}))
    stray = [
        VectorSample(
            labels=agent("proc", 0, role=r, tracked_pod=f"ghost-{i}")["metric"], timestamp=NOW, value=0
        )
        for i in range(50)
        for r in ROLES
    ]
    got = readings_from_samples(SPEC, [POD], NOW, [*real, *stray, *(fake(i) for i in range(200))], answer)
    assert got[POD].utilization == 0.0
    assert set(answer.containers) == {(POD.namespace, POD.name, "main")}  # the strays were not kept
    flood = [*real, *(fake(i) for i in range(200_000))]
    with pytest.raises(PrometheusError, match="more than 1064 series for 1 pods"):
        readings_from_samples(SPEC, [POD], NOW, flood, AgentAnswer(eval_time=NOW, pods=frozenset({POD})))


async def test_an_answer_too_large_is_not_read_and_fails_every_pod(prom: Prom) -> None:
    flood = [
        {
            "metric": {FIELD_LABEL: "util", "namespace": POD.namespace, "pod": f"ghost-{i}"},
            "value": [NOW, "0"],
        }
        for i in range(20_000)
    ]
    reading, counts = await poll(prom, [*idle_answer(), *flood])
    assert (
        isinstance(reading.utilization, SignalFailure) and reading.utilization.reason is FailureReason.OTHER
    )
    assert "bytes" in reading.utilization.detail
    assert isinstance(counts, SignalFailure)
    assert verdict(reading, counts) not in RECLAIMABLE


# --- what Prometheus computes: pinned, busiest sample, samples ahead --------------------------------


AGENT_AHEAD_NAMES = '"ghostgpu_agent_container_scan_timestamp_seconds|ghostgpu_agent_container_processes"'


def test_every_selector_of_the_query_names_its_source() -> None:
    q = build_query(SPEC, [POD], now=NOW)
    dcgm = 'job=~"nvidia-dcgm-exporter|dcgm-exporter", namespace=~"team-a", pod=~".+"'
    agent_sel = 'job=~"ghostgpu-agent", namespace=~"ghostgpu-agent", tracked_namespace=~"team-a"'
    for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_XID_ERRORS"):
        assert q.count(f"{metric}{{") == q.count(f"{metric}{{{dcgm}")
    for metric in ("processes", "scan_timestamp_seconds", "unseen"):
        name = f"ghostgpu_agent_container_{metric}"
        assert q.count(f"{name}{{") == q.count(f"{name}{{{agent_sel}") > 0
    # the one selector by name regex (samples ahead, below) is pinned too
    assert q.count("{__name__=~") == q.count(f"{{__name__=~{AGENT_AHEAD_NAMES}, {agent_sel}") == 1
    # samples ahead: the newest sample up to 4 minutes past now, newer than now + the skew; each
    # GPU metric's timestamp() tagged apart (utilization and framebuffer share a label set), and
    # the agent's scan and live roles (what a forger must write to make work look finished)
    at = f"@ {NOW + 240:.3f}"
    for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):
        assert f'label_replace(timestamp({metric}{{{dcgm}}} {at}), "ghostgpu_metric", ' in q, metric
    # one selector: the scan time (no role) and the live roles' counts
    both = f'__name__=~{AGENT_AHEAD_NAMES}, {agent_sel}, role=~"|work|timer|session"'
    assert f"timestamp({{{both}}} {at})) > " in q
    assert q.count(f") > {NOW + 5:.3f}") == 2


def test_interleaved_zeros_cannot_win_the_busiest_sample_of_two_scrape_intervals_is_read() -> None:
    """A second producer writing 0 between a busy exporter's samples: the reading is the max over
    the window, and the agent's counts the most of each role in it."""
    ctrl = ControllerConfig.model_validate({"metrics": {"scrapeInterval": "15s"}, "processSource": "agent"})
    client = PrometheusClient("http://127.0.0.1:1")
    sources = signal_sources(ctrl, client, executor=None)  # type: ignore[arg-type]
    spec = sources.utilization.spec
    assert spec.window == 30.0
    q = build_query(spec, [POD], now=NOW)
    assert "max by (namespace, pod) (max_over_time(DCGM_FI_DEV_GPU_UTIL{" in q and "}[30s]))" in q
    assert "max_over_time(ghostgpu_agent_container_processes{" in q
    assert "min_over_time(ghostgpu_agent_container_scan_timestamp_seconds{" in q


# --- the config ------------------------------------------------------------------------------------

MINIMAL = """
flavors:
  - name: h100
    resource: nvidia.com/gpu
teams:
  - name: research
    quota: {h100: 4}
"""


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ("dcgm: {source: {}}", "name at least one label"),
        ("dcgm: {source: {job: '.*'}}", "matches the empty string"),
        ("dcgm: {source: {job: 'dcgm('}}", "is not a regular expression"),
        ("dcgm: {source: {__name__: dcgm}}", "reserved"),
        ("agentSource: {job: ''}", "matches the empty string"),
        (
            "dcgm: {utilizationQuery: 'max by (${namespace_label}, ${pod_label}) "
            "(max_over_time(${utilization_metric}[${window}]))'}",
            "must select its series with ${source}",
        ),
        (
            "dcgm: {utilizationQuery: 'max by (${namespace_label}, ${pod_label}) "
            "(${utilization_metric}{${source}})'}",
            "busiest sample of the window",
        ),
    ],
)
def test_a_source_that_pins_nothing_is_a_clear_error(metrics: str, message: str) -> None:
    from ghostgpu.config_errors import ConfigError

    with pytest.raises(ConfigError) as err:
        load_config_text(MINIMAL + f"controller:\n  metrics: {{{metrics}}}\n")
    assert message in str(err.value) and "metrics" in str(err.value)


def test_a_source_regex_is_quoted_into_the_query() -> None:
    cfg = load_config_text(MINIMAL + "controller:\n  metrics: {dcgm: {source: {job: 'a\"b|c\\.d'}}}\n")
    spec = QuerySpec.from_preset(cfg.controller.metrics.dcgm, max_sample_age=60)
    assert spec.source == 'job=~"a\\"b|c\\\\.d"'


# --- the query evaluated by Prometheus's own engine (promtool) ---------------------------------------

PROMTOOL = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Prometheus) not installed")
DCGM_LABELS = (
    'job="dcgm-exporter",instance="10.0.0.9:9400",gpu="0",UUID="GPU-0",container="main",namespace="team-a"'
)


def promtool(
    tmp_path: Path, query: str, series: list[dict[str, str]], at: str, expected: list[dict[str, Any]]
) -> str:
    """Run `query` at `at` over `series` (15 s apart) in promtool's Prometheus engine; the output
    (empty when the answer is exactly `expected`)."""
    test = {
        "rule_files": [],
        "evaluation_interval": "15s",
        "tests": [
            {
                "interval": "15s",
                "input_series": series,
                "promql_expr_test": [{"expr": query, "eval_time": at, "exp_samples": expected}],
            }
        ],
    }
    path = tmp_path / "query_test.yaml"
    path.write_text(yaml.safe_dump(test, sort_keys=False, width=100_000))
    run = subprocess.run(["promtool", "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    return "" if run.returncode == 0 else run.stdout + run.stderr


def _sample(value: float, **labels: str) -> dict[str, Any]:
    return {"labels": "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}", "value": value}


@PROMTOOL
def test_interleaved_zeros_read_busy_in_prometheus(tmp_path: Path) -> None:
    """A busy GPU's samples (90) interleaved with a second producer's zeros in one series, the
    newest a zero: the reading is 90 (an instant read of the newest sample was 0, an idle pod)."""
    spec = QuerySpec.from_preset(METRICS.dcgm, max_sample_age=MAX_AGE, window=30.0)
    series = [{"series": f'DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},pod="busy"}}', "values": "90 0 90 0 90 0"}]
    q = build_query(spec, [PodKey("team-a", "busy")], now=75.0)
    assert not promtool(
        tmp_path, q, series, "75s", [_sample(90, ghostgpu_field="util", namespace="team-a", pod="busy")]
    )
    # what an instant read answers here: the forger's zero
    instant = 'max by (namespace, pod) (DCGM_FI_DEV_GPU_UTIL{namespace="team-a"})'
    assert not promtool(tmp_path, instant, series, "75s", [_sample(0, namespace="team-a", pod="busy")])


@PROMTOOL
def test_a_series_of_another_scrape_is_not_read_in_prometheus(tmp_path: Path) -> None:
    """The victim's exact exporter labels at 0 from a tenant's scrape (job kubernetes-pods) beside
    the real busy series: the reading is the real one's."""
    spec = QuerySpec.from_preset(METRICS.dcgm, max_sample_age=MAX_AGE, window=30.0)
    forged = DCGM_LABELS.replace('job="dcgm-exporter"', 'job="kubernetes-pods"')
    series = [
        {"series": f'DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},pod="busy"}}', "values": "90x4"},
        {"series": f'DCGM_FI_DEV_GPU_UTIL{{{forged},pod="busy"}}', "values": "0x4"},
        {"series": f'DCGM_FI_DEV_GPU_UTIL{{{forged},pod="ghost"}}', "values": "0x4"},  # no such pod
    ]
    q = build_query(spec, [PodKey("team-a", "busy"), PodKey("team-a", "ghost")], now=60.0)
    assert not promtool(
        tmp_path, q, series, "60s", [_sample(90, ghostgpu_field="util", namespace="team-a", pod="busy")]
    )


@PROMTOOL
def test_naming_the_idle_pods_selects_what_the_zero_filter_selected_in_prometheus(tmp_path: Path) -> None:
    """The poll that names the pods read idle before (UtilizationSource's agent_after_idle) gets,
    in Prometheus's own engine, the same answer for those pods as the zero filter's query, and
    the busy pods' agent series in neither."""
    spec = QuerySpec.from_preset(
        METRICS.dcgm,
        max_sample_age=MAX_AGE,
        window=30.0,
        agent_processes=True,
        agent_source=METRICS.agent_source,
    )
    agent_labels = 'job="ghostgpu-agent",namespace="ghostgpu-agent",tracked_namespace="team-a"'
    series = []
    for pod, util, role in (("idle-0", 0, "holder"), ("busy-0", 50, "work")):
        series += [
            {"series": f'DCGM_FI_DEV_GPU_UTIL{{{DCGM_LABELS},pod="{pod}"}}', "values": f"{util}x4"},
            {
                "series": f'ghostgpu_agent_container_processes{{{agent_labels},tracked_pod="{pod}",'
                f'tracked_uid="u-{pod}",tracked_container="main",role="{role}"}}',
                "values": "1x4",
            },
            {
                "series": f"ghostgpu_agent_container_scan_timestamp_seconds{{{agent_labels},"
                f'tracked_pod="{pod}",tracked_uid="u-{pod}",tracked_container="main"}}',
                "values": "55x4",  # one scan time: the window's bounds differ across versions
            },
        ]
    container = {"tracked_namespace": "team-a", "tracked_pod": "idle-0", "tracked_uid": "u-idle-0"}
    container["tracked_container"] = "main"
    expected = [
        _sample(0, ghostgpu_field="util", namespace="team-a", pod="idle-0"),
        _sample(50, ghostgpu_field="util", namespace="team-a", pod="busy-0"),
        _sample(1, ghostgpu_field="proc", role="holder", **container),
        _sample(55, ghostgpu_field="scan", **container),
    ]
    pods = [PodKey("team-a", "idle-0"), PodKey("team-a", "busy-0")]
    for agent_pods in (None, frozenset({PodKey("team-a", "idle-0")})):
        q = build_query(spec, pods, now=60.0, agent_pods=agent_pods)
        assert not promtool(tmp_path, q, series, "60s", expected), agent_pods
