"""The processes signal from the node agent's series (signals/agent.py), read through the poll's one
PromQL query: what the query asks, how each container's series become its ProcessCounts or a
SignalFailure, and a controller in agent mode that judges from them without one exec.

The series are the ones the devcluster's fake dcgm-exporter serves for the agent (its text
exposition, parsed by prometheus_client's parser), turned into the instant-vector JSON Prometheus
answers the query with, and served over HTTP on 127.0.0.1 to the controller's own client.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ghostgpu.config import AGENT_SOURCE, ControllerConfig, MetricsConfig
from ghostgpu.controller.app import signal_sources
from ghostgpu.controller.observe.evidence import evidence_summary
from ghostgpu.controller.reconciler import Reconciler
from ghostgpu.devcluster.fake_dcgm import AgentContainer, Store
from ghostgpu.signals.agent import (
    PROCESSES_METRIC,
    SCAN_METRIC,
    UNSEEN_METRIC,
    AgentProcessSource,
    AgentSeries,
)
from ghostgpu.signals.artifacts import FileTarget
from ghostgpu.signals.podexec import ExecResult, PodRef
from ghostgpu.signals.processes import merge_listings
from ghostgpu.signals.prometheus import PrometheusClient
from ghostgpu.signals.utilization import FIELD_LABEL, PodKey, QuerySpec, UtilizationSource, build_query
from ghostgpu.verdict import (
    Evidence,
    FailureReason,
    ProcessCounts,
    ProcessInfo,
    SignalFailure,
    VerdictKind,
    VerdictPolicy,
    decide,
)

NOW = 1_760_000_000.0
MAX_AGE = 180.0
SPEC = QuerySpec.from_preset(
    MetricsConfig().dcgm,
    max_sample_age=MAX_AGE,
    agent_processes=True,
    agent_source=MetricsConfig().agent_source,
)
_FIELDS = {PROCESSES_METRIC: "proc", SCAN_METRIC: "scan", UNSEEN_METRIC: "unseen"}
_EXTRA = {"proc": ["role", "programs"], "unseen": ["reason"]}


def answer(
    store: Store, zero_pods: set[tuple[str, str]], *, at: float = NOW, util: float = 0.0
) -> dict[str, Any]:
    """What Prometheus answers the poll's query with, given the agent target's exposition: every
    zero pod's `util` and `fb`, and the agent's series of those pods, aggregated by the agent's own
    labels (the query's `max by`) and tagged with their field."""
    result: list[dict[str, Any]] = []
    for ns, pod in sorted(zero_pods):
        for field_, value in (("util", util), ("fb", 0.0)):
            result.append(
                {"metric": {FIELD_LABEL: field_, "namespace": ns, "pod": pod}, "value": [at, f"{value:g}"]}
            )
    for family in text_string_to_metric_families(store.agent_exposition(now=at - 5)):
        field_ = _FIELDS[family.name]
        for s in family.samples:
            if (s.labels["tracked_namespace"], s.labels["tracked_pod"]) not in zero_pods:
                continue  # `and on(tracked_namespace, tracked_pod)` the zero pods
            if field_ == "unseen" and s.value != 1:
                continue
            keep = [
                "tracked_namespace",
                "tracked_pod",
                "tracked_uid",
                "tracked_container",
                *_EXTRA.get(field_, []),
            ]
            # Prometheus keeps no label with an empty value
            labels = {k: s.labels[k] for k in keep if s.labels.get(k)} | {FIELD_LABEL: field_}
            result.append({"metric": labels, "value": [at, repr(float(s.value))]})
    return {"status": "success", "data": {"resultType": "vector", "result": result}}


class Prom:
    """A Prometheus HTTP API on 127.0.0.1 answering every query with `body(query)`."""

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.body: Callable[[str], Any] = lambda q: {
            "status": "success",
            "data": {"resultType": "vector", "result": []},
        }
        self.status = 200
        prom = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                query = urllib.parse.parse_qs(self.rfile.read(length).decode())["query"][0]
                prom.queries.append(query)
                data = json.dumps(prom.body(query)).encode()
                self.send_response(prom.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"


@pytest.fixture
def prom() -> Iterator[Prom]:
    p = Prom()
    yield p
    p.server.shutdown()
    p.server.server_close()


async def poll_agent(prom: Prom, pods: list[PodRef], *, now: float = NOW) -> dict[PodRef, Any]:
    series = AgentSeries()
    async with PrometheusClient(prom.url, timeout=2) as client:
        source = UtilizationSource(client, SPEC, agent=series)
        await source.poll(list(dict.fromkeys(PodKey(p.namespace, p.name) for p in pods)), now=now)
        return dict(await AgentProcessSource(series, max_age=MAX_AGE).list_many(pods))


# --- the query ------------------------------------------------------------------------------------


def test_the_one_query_carries_the_agent_series_of_the_zero_pods_only_in_agent_mode() -> None:
    pods = [PodKey("team-a", "train-0"), PodKey("team-b", "serve-0")]
    q = build_query(SPEC, pods)
    zero = (
        "(max by (namespace, pod) (max_over_time(DCGM_FI_DEV_GPU_UTIL"
        '{job=~"nvidia-dcgm-exporter|dcgm-exporter", namespace=~"team-a|team-b", pod=~".+"}[60s]))) <= 0'
    )
    on = f'label_replace({zero}, "tracked_namespace", "$1", "namespace", "(.*)")'
    on = f'label_replace({on}, "tracked_pod", "$1", "pod", "(.*)")'
    sel = '{job=~"ghostgpu-agent", namespace=~"ghostgpu-agent", tracked_namespace=~"team-a|team-b"}'
    key = "tracked_namespace, tracked_pod, tracked_uid, tracked_container"
    for agg, metric, field_, by in (
        ("max", PROCESSES_METRIC, "proc", f"{key}, role, programs"),
        ("min", SCAN_METRIC, "scan", f"{key}, live_roles"),  # the oldest scan of each live-role set
        ("max", UNSEEN_METRIC, "unseen", f"{key}, reason"),
    ):
        # each read only from the agent's scrape, over the window (the most processes of each
        # role and the programs it names), aggregated by the tracked container's labels (a container
        # scraped twice is one series), only for pods at or under the zero threshold
        over = "min_over_time" if agg == "min" else "max_over_time"
        assert f"label_replace({agg} by ({by}) ({over}({metric}{sel}[60s])" in q, metric
        assert f'"{FIELD_LABEL}", "{field_}", "", "")' in q
    assert f"max_over_time({UNSEEN_METRIC}{sel}[60s]) == 1" in q
    # the three under one filter: Prometheus evaluates `zero` again wherever the query names it
    assert q.count(f") and on(tracked_namespace, tracked_pod) ({on})") == 1 and q.endswith(f"({on})")
    # still one expression that does not grow with the fleet
    many = [PodKey(f"team-{i % 2}", f"pod-{i}") for i in range(3000)]
    assert len(build_query(SPEC, many)) == len(build_query(SPEC, many[:2]))
    exec_mode = build_query(QuerySpec.from_preset(MetricsConfig().dcgm, max_sample_age=MAX_AGE), pods)
    assert "ghostgpu_agent" not in exec_mode


def test_the_query_can_name_the_pods_whose_agent_series_it_needs() -> None:
    pods = [PodKey("team-a", "train-0"), PodKey("team-b", "serve.v2-0"), PodKey("team-c", "busy-0")]
    named = frozenset(pods[:2])
    q = build_query(SPEC, pods, now=NOW, agent_pods=named)
    sel = (
        '{job=~"ghostgpu-agent", namespace=~"ghostgpu-agent", tracked_namespace=~"team-a|team-b", '
        'tracked_pod=~"serve\\\\.v2-0|train-0"}'
    )
    for metric in (PROCESSES_METRIC, SCAN_METRIC):
        assert f"({metric}{sel}[60s])" in q, metric
    # the ahead check of the agent's series names the same pods
    assert f'role=~"|work|timer|session"}} @ {NOW + 240:.3f}' in q
    assert 'tracked_pod=~"serve\\\\.v2-0|train-0", role=~' in q
    # no zero filter on the agent's part: the names select it; every agent selector names them
    # but the rare containers the agent cannot see (`unseen`)
    assert "and on(tracked_namespace, tracked_pod)" not in q
    assert q.count('tracked_pod=~"serve\\\\.v2-0|train-0"') == 3
    bare = '{job=~"ghostgpu-agent", namespace=~"ghostgpu-agent", tracked_namespace=~"team-a|team-b"}'
    assert f"{UNSEEN_METRIC}{bare}" in q
    # the GPU parts are the query's as before
    without = build_query(QuerySpec.from_preset(MetricsConfig().dcgm, max_sample_age=MAX_AGE), pods, now=NOW)
    assert q.startswith(without + " or ")
    # none to ask: no agent part at all; None: every pod at zero, as before
    assert "ghostgpu_agent" not in build_query(SPEC, pods, now=NOW, agent_pods=frozenset())
    assert "and on(tracked_namespace, tracked_pod)" in build_query(SPEC, pods, now=NOW, agent_pods=None)
    with pytest.raises(ValueError, match="pod name"):
        build_query(SPEC, pods, agent_pods=frozenset({PodKey("team-a", 'x"} or vector(1) or {a="')}))


async def test_after_the_first_poll_the_agent_series_are_asked_for_the_pods_read_idle_before(
    prom: Prom,
) -> None:
    """Only a pod read idle by the poll before can have its processes asked for (the observer asks
    after `window` >= 2 idle readings in a row): the query names those pods, and a pod it did not
    name reads as not asked, never as no processes."""
    store = Store()
    for pod in ("idle-0", "idle-1", "turning-0"):
        store.set_agent(AgentContainer(namespace="team-a", pod=pod, uid=pod, roles={"holder": 1}))
    zero = {("team-a", "idle-0"), ("team-a", "idle-1")}

    def body(q: str) -> dict[str, Any]:
        # What Prometheus selects: the pods the query names, or (no names) every pod at zero.
        named = re.search(r'tracked_pod=~"([^"]*)"', q)
        asked = {("team-a", n) for n in named.group(1).split("|")} if named else zero
        got = answer(store, zero & asked)
        for ns, pod in sorted(zero - asked):  # at zero, not named: its reading, no agent series
            for field_ in ("util", "fb"):
                metric = {FIELD_LABEL: field_, "namespace": ns, "pod": pod}
                got["data"]["result"].append({"metric": metric, "value": [NOW, "0"]})
        busy = {FIELD_LABEL: "util", "namespace": "team-a", "pod": "turning-0"}
        if ("team-a", "turning-0") not in zero:
            got["data"]["result"].append({"metric": busy, "value": [NOW, "40"]})
        return got

    prom.body = body
    keys = [PodKey("team-a", p) for p in ("idle-0", "idle-1", "turning-0")]
    refs = [PodRef(k.namespace, k.name, "main") for k in keys]
    series = AgentSeries()
    async with PrometheusClient(prom.url, timeout=2) as client:
        source = UtilizationSource(client, SPEC, agent=series, agent_after_idle=True)
        processes = AgentProcessSource(series, max_age=MAX_AGE)
        # the first poll knows no idle pods yet: every pod at zero, as without the option
        await source.poll(keys, now=NOW)
        assert "and on(tracked_namespace, tracked_pod)" in prom.queries[-1]
        assert source.idle_last_poll == {keys[0], keys[1]}
        # the second names the two read idle; the busy pod turns idle in this poll
        zero.add(("team-a", "turning-0"))
        await source.poll(keys, now=NOW)
        assert 'tracked_pod=~"idle-0|idle-1"' in prom.queries[-1]
        got = await processes.list_many(refs)
        assert got[refs[0]] == got[refs[1]] == ProcessCounts(holder=1)
        late = got[refs[2]]
        assert isinstance(late, SignalFailure) and late.reason is FailureReason.MISSING
        assert "did not ask" in late.detail
        # the third names it too
        await source.poll(keys, now=NOW)
        assert 'tracked_pod=~"idle-0|idle-1|turning-0"' in prom.queries[-1]
        assert (await processes.list_many(refs))[refs[2]] == ProcessCounts(holder=1)
        # names that would make the query longer than the store takes: every pod at zero again
        source.max_query_bytes = len(prom.queries[-1].encode()) - 1
        await source.poll(keys, now=NOW)
        assert "tracked_pod=~" not in prom.queries[-1]
        assert (await processes.list_many(refs))[refs[2]] == ProcessCounts(holder=1)
        source.max_query_bytes = 16384
        # a failed query: no pod read idle, so the next poll names none and asks no agent series
        prom.status = 503
        await source.poll(keys, now=NOW)
        assert source.idle_last_poll == frozenset()
        prom.status = 200
        await source.poll(keys, now=NOW)
        assert "ghostgpu_agent" not in prom.queries[-1]
    assert len(prom.queries) == 6


async def test_a_window_of_one_reading_asks_the_agent_for_every_pod_at_zero(prom: Prom) -> None:
    """With controller.window 1 a pod's processes are asked at its first idle reading: the query
    never narrows the agent's series to the poll before's idle pods."""
    cfg = ControllerConfig.model_validate({"processSource": "agent", "window": 1})
    async with PrometheusClient(prom.url, timeout=2) as client:
        sources = signal_sources(cfg, client, executor=None)  # type: ignore[arg-type]
        assert sources.utilization.agent_after_idle is False
        default = signal_sources(
            ControllerConfig.model_validate({"processSource": "agent"}),
            client,
            executor=None,  # type: ignore[arg-type]
        )
        assert default.utilization.agent_after_idle is True


def test_a_preset_with_other_pod_labels_is_matched_to_the_agents_namespace_and_pod() -> None:
    spec = QuerySpec.from_preset(
        MetricsConfig().hami, max_sample_age=MAX_AGE, agent_processes=True, agent_source=AGENT_SOURCE
    )
    q = build_query(spec, [PodKey("team-a", "train-0")])
    ns_label, pod_label = spec.namespace_label, spec.pod_label
    assert (ns_label, pod_label) != ("namespace", "pod")
    assert f'"tracked_namespace", "$1", "{ns_label}", "(.*)")' in q
    assert f'"tracked_pod", "$1", "{pod_label}", "(.*)")' in q


# --- per container ----------------------------------------------------------------------------------


async def test_each_container_gets_its_counts_or_the_reason_it_has_none(prom: Prom) -> None:
    store = Store()
    roles, programs = {"work": 2, "wrapper": 1}, ["python", "torchrun"]
    store.set_agent(
        AgentContainer(namespace="team-a", pod="train-0", uid="u1", roles=roles, programs=programs)
    )
    store.set_agent(
        AgentContainer(namespace="team-a", pod="done-0", uid="u2", roles={"holder": 1, "wrapper": 1})
    )
    store.set_agent(AgentContainer(namespace="team-a", pod="hidden-0", uid="u3", unseen="no-cgroup-match"))
    store.set_agent(AgentContainer(namespace="team-a", pod="gone-0", uid="u4", unseen="not-running"))
    store.set_agent(AgentContainer(namespace="team-a", pod="noproc-0", uid="u5", unseen="proc-unreadable"))
    store.set_agent(
        AgentContainer(namespace="team-a", pod="old-0", uid="u6", scan_timestamp=NOW - MAX_AGE - 30)
    )
    store.set_agent(AgentContainer(namespace="team-a", pod="busy-0", uid="u7"))
    zero = {
        ("team-a", p) for p in ("train-0", "done-0", "hidden-0", "gone-0", "noproc-0", "old-0", "absent-0")
    }
    prom.body = lambda q: answer(store, zero)
    refs = {p: PodRef("team-a", p, "main") for _, p in sorted(zero)}
    got = await poll_agent(prom, list(refs.values()))
    assert len(prom.queries) == 1  # the processes signal rode in the utilization query
    assert got[refs["train-0"]] == ProcessCounts(work=2, wrapper=1, programs=("python", "torchrun"))
    assert got[refs["done-0"]] == ProcessCounts(holder=1, wrapper=1)
    for pod, reason in (
        ("hidden-0", FailureReason.NO_CGROUP_MATCH),
        ("gone-0", FailureReason.NOT_RUNNING),
        ("noproc-0", FailureReason.PROC_UNREADABLE),
        ("old-0", FailureReason.STALE),
        ("absent-0", FailureReason.MISSING),  # no agent series at all: agent not reporting
    ):
        failure = got[refs[pod]]
        assert isinstance(failure, SignalFailure) and failure.reason is reason, (pod, failure)
    assert "210s old" in got[refs["old-0"]].detail  # type: ignore[union-attr]
    assert "agent" in got[refs["absent-0"]].detail  # type: ignore[union-attr]
    # another container of a seen pod was not reported: it is missing, never zero processes
    other = PodRef("team-a", "train-0", "sidecar")
    assert (await poll_agent(prom, [other]))[other].reason is FailureReason.MISSING  # type: ignore[union-attr]


async def test_a_query_that_fails_fails_every_container(prom: Prom) -> None:
    prom.status = 503
    ref = PodRef("team-a", "train-0", "main")
    got = await poll_agent(prom, [ref])
    assert isinstance(got[ref], SignalFailure) and got[ref].reason is FailureReason.HTTP_ERROR


def _series(field_: str, value: float, **labels: str) -> dict[str, Any]:
    base = {
        "tracked_namespace": "team-a",
        "tracked_pod": "train-0",
        "tracked_uid": "u1",
        "tracked_container": "main",
    }
    return {"metric": base | labels | {FIELD_LABEL: field_}, "value": [NOW, repr(value)]}


def _util() -> list[dict[str, Any]]:
    return [
        {"metric": {FIELD_LABEL: "util", "namespace": "team-a", "pod": "train-0"}, "value": [NOW, "0"]},
        {"metric": {FIELD_LABEL: "fb", "namespace": "team-a", "pod": "train-0"}, "value": [NOW, "0"]},
    ]


ROLES6 = ("work", "wrapper", "holder", "timer", "session", "defunct")


ALL_ZERO = [_series("proc", 0, role=r) for r in ROLES6]


@pytest.mark.parametrize(
    ("series", "reason"),
    [
        # counts without a scan time (the presence series): cannot be dated, and a role without a
        # series is not read as none
        ([_series("proc", 0, role=r) for r in ROLES6], FailureReason.MISSING),
        ([_series("proc", 1, role="holder")], FailureReason.MISSING),
        # the presence series too old: absent roles are not zeros then either
        ([_series("proc", 1, role="holder"), _series("scan", NOW - MAX_AGE - 1)], FailureReason.STALE),
        # ahead of the clock: a forged presence series alone cannot say "nothing running"
        ([_series("scan", NOW + 60)], FailureReason.UNTRUSTED),
        # a role this controller does not know (a newer agent): not read as zero work
        ([*ALL_ZERO, _series("proc", 1, role="gpu"), _series("scan", NOW)],
         FailureReason.PARSE_ERROR),
        ([_series("proc", 0.5 if r == "work" else 0, role=r) for r in ROLES6] + [_series("scan", NOW)],
         FailureReason.PARSE_ERROR),
        # two pods of one name (old series of a replaced pod linger): neither is used
        ([*ALL_ZERO, _series("scan", NOW), _series("scan", NOW, tracked_uid="u2")],
         FailureReason.OTHER),
        ([_series("unseen", 1, reason="something-new")], FailureReason.OTHER),
    ],
)  # fmt: skip
async def test_series_that_cannot_be_read_fail_the_container(
    prom: Prom, series: list[dict[str, Any]], reason: FailureReason
) -> None:
    prom.body = lambda q: {"status": "success", "data": {"resultType": "vector", "result": _util() + series}}
    ref = PodRef("team-a", "train-0", "main")
    got = (await poll_agent(prom, [ref]))[ref]
    assert isinstance(got, SignalFailure) and got.reason is reason, got


async def test_all_six_roles_at_zero_and_a_fresh_scan_are_no_processes(prom: Prom) -> None:
    series = [_series("proc", 0, role=r) for r in ROLES6] + [_series("scan", NOW - MAX_AGE)]
    prom.body = lambda q: {"status": "success", "data": {"resultType": "vector", "result": _util() + series}}
    ref = PodRef("team-a", "train-0", "main")
    assert (await poll_agent(prom, [ref]))[ref] == ProcessCounts()


async def test_a_fresh_scan_time_makes_absent_roles_zero(prom: Prom) -> None:
    """The agent exports the roles with processes only: beside a fresh presence series the others
    count 0; the programs ride on the live roles' series."""
    series = [
        _series("proc", 2, role="work", programs="python torchrun"),
        _series("proc", 1, role="wrapper"),
        _series("scan", NOW - 10),
    ]
    prom.body = lambda q: {"status": "success", "data": {"resultType": "vector", "result": _util() + series}}
    ref = PodRef("team-a", "train-0", "main")
    assert (await poll_agent(prom, [ref]))[ref] == ProcessCounts(
        work=2, wrapper=1, programs=("python", "torchrun")
    )
    # nothing running at all: the presence series alone
    prom.body = lambda q: {
        "status": "success",
        "data": {"resultType": "vector", "result": [*_util(), _series("scan", NOW - 10)]},
    }
    assert (await poll_agent(prom, [ref]))[ref] == ProcessCounts()


async def test_an_answer_that_lost_a_live_roles_series_fails_the_container(prom: Prom) -> None:
    """The scan names the live roles it has series for: an answer without one of them (a proxy or
    a store answering with part of the series) is a failure, never a finished container; with the
    series there, or an agent that names none, the counts are read as usual."""
    ref = PodRef("team-a", "train-0", "main")
    work = _series("proc", 1, role="work", programs="python")

    async def read(*series: dict[str, Any]) -> ProcessCounts | SignalFailure:
        result = [*_util(), *series]
        prom.body = lambda q: {"status": "success", "data": {"resultType": "vector", "result": result}}
        return (await poll_agent(prom, [ref]))[ref]

    lost = await read(_series("scan", NOW - 10, live_roles="session work"), work)
    assert isinstance(lost, SignalFailure) and lost.reason is FailureReason.MISSING
    assert "session" in lost.detail and "work" not in lost.detail.split("role(s)")[1].split("whose")[0]
    # the live-role set changed in the window: every role either scan names must be there
    changed = await read(
        _series("scan", NOW - 20, live_roles="work"), _series("scan", NOW - 10, live_roles="")
    )
    assert isinstance(changed, SignalFailure) and changed.reason is FailureReason.MISSING
    whole = await read(_series("scan", NOW - 10, live_roles="work"), work)
    assert whole == ProcessCounts(work=1, programs=("python",))
    assert await read(_series("scan", NOW - 10), work) == ProcessCounts(work=1, programs=("python",))


async def test_a_role_whose_programs_changed_in_the_window_is_counted_once(prom: Prom) -> None:
    """Two series of one role in the window (its programs changed between scans): each is the
    whole count at its time, so the most of them, and every program named."""
    series = [
        _series("proc", 1, role="work", programs="python"),
        _series("proc", 2, role="work", programs="python torchrun"),
        _series("scan", NOW - 10),
    ]
    prom.body = lambda q: {"status": "success", "data": {"resultType": "vector", "result": _util() + series}}
    ref = PodRef("team-a", "train-0", "main")
    assert (await poll_agent(prom, [ref]))[ref] == ProcessCounts(work=2, programs=("python", "torchrun"))


async def test_an_agent_of_the_earlier_contract_reads_the_same_counts(prom: Prom) -> None:
    """Rollout skew, an older agent beside this controller: all six roles with zeros, no `programs`
    label (its programs were series this query no longer asks for). The counts, hence the verdict,
    are those of the new agent for the same processes; only the programs are left out."""
    ref = PodRef("team-a", "train-0", "main")
    old = [_series("proc", {"work": 1, "wrapper": 1}.get(r, 0), role=r) for r in ROLES6]
    new = [_series("proc", 1, role="work", programs="python"), _series("proc", 1, role="wrapper")]
    got = {}
    for name, series in (("old", old), ("new", new)):
        body = {
            "status": "success",
            "data": {"resultType": "vector", "result": [*_util(), *series, _series("scan", NOW)]},
        }
        prom.body = lambda q, body=body: body
        got[name] = (await poll_agent(prom, [ref]))[ref]
    assert got["old"] == ProcessCounts(work=1, wrapper=1)
    assert got["new"] == ProcessCounts(work=1, wrapper=1, programs=("python",))


async def test_the_source_before_any_poll_and_after_a_poll_without_pods() -> None:
    series = AgentSeries()
    ref = PodRef("team-a", "train-0", "main")
    got = (await AgentProcessSource(series, max_age=MAX_AGE).list_many([ref]))[ref]
    assert isinstance(got, SignalFailure) and got.reason is FailureReason.MISSING


# --- a workload's containers ----------------------------------------------------------------------


def test_a_workloads_counts_are_summed_and_any_failure_fails_it() -> None:
    a = ProcessCounts(work=1, wrapper=1, programs=("python",))
    b = ProcessCounts(holder=1, defunct=2, programs=("pause",))
    assert merge_listings([a, b]) == ProcessCounts(
        work=1, wrapper=1, holder=1, defunct=2, programs=("pause", "python")
    )
    stale = SignalFailure(reason=FailureReason.STALE)
    assert merge_listings([a, stale, b]) == stale
    mixed = merge_listings([a, (ProcessInfo(pid=1, state="S", command="sleep infinity"),)])
    assert isinstance(mixed, SignalFailure)
    rows = (ProcessInfo(pid=1, state="S", command="sleep 1"),)
    assert merge_listings([rows, rows]) == rows + rows


def test_the_evidence_summary_reads_counts_as_it_reads_rows() -> None:
    counts = ProcessCounts(work=0, wrapper=1, holder=1, programs=())
    policy = VerdictPolicy(window=2)
    ev = Evidence(utilization=(0.0, 0.0), processes=counts, memory=None)
    verdict = decide(ev, policy.model_copy(update={"required": frozenset({"utilization", "processes"})}))
    summary = evidence_summary(ev, verdict, 2)
    assert summary["procs"] == {"live": 0, "defunct": 0, "holders": 2}
    alive = ProcessCounts(work=1, wrapper=1, programs=("python",))
    ev = Evidence(utilization=(0.0, 0.0), processes=alive)
    verdict = decide(ev, policy.model_copy(update={"required": frozenset({"utilization", "processes"})}))
    assert verdict.kind is VerdictKind.ACTIVE
    assert evidence_summary(ev, verdict, 2)["procs"] == {"live": 2, "defunct": 0, "programs": ["python"]}
    failed = Evidence(utilization=(0.0, 0.0), processes=SignalFailure(reason=FailureReason.NO_CGROUP_MATCH))
    summary = evidence_summary(failed, decide(failed, policy), 2)
    assert summary["verdict"] == "UNKNOWN" and "processes-failed" in summary["reasons"]
    assert summary["procs"] == "!no-cgroup-match"


# --- wiring ---------------------------------------------------------------------------------------


class RecordingExec:
    def __init__(self) -> None:
        self.calls: list[tuple[PodRef, tuple[str, ...]]] = []

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        self.calls.append((pod, argv))
        return ExecResult("PID PPID STAT ELAPSED COMMAND\n1 0 S 10 sleep infinity\n", "", 0)


async def test_agent_mode_wires_no_exec_and_exec_mode_still_does(prom: Prom) -> None:
    ref = PodRef("team-a", "train-0", "main")
    for source, execs in (("agent", 0), ("exec", 2)):
        executor = RecordingExec()
        cfg = ControllerConfig.model_validate({"processSource": source})
        async with PrometheusClient(prom.url, timeout=2) as client:
            s = signal_sources(cfg, client, executor)
            await s.utilization.poll([PodKey("team-a", "train-0")], now=NOW)
            listed = (await s.processes.list_many([ref]))[ref]
            measured = await s.files.measure(ref, FileTarget("/out"))
        assert len(executor.calls) == execs, source
        assert s.utilization.spec.agent_processes is (source == "agent")
        if source == "agent":
            assert isinstance(listed, SignalFailure) and listed.reason is FailureReason.MISSING
            # file:// artifacts need exec: in agent mode they are a failed signal, never a guess
            assert isinstance(measured, SignalFailure) and measured.reason is FailureReason.FORBIDDEN
            assert "ghostgpu_agent_container_processes" in prom.queries[-1]
        else:
            assert "ghostgpu_agent" not in prom.queries[-1]


def test_the_fake_exporters_agent_series_follow_the_contract() -> None:
    store = Store()
    programs = ["a" * 80, "b", "c", "d", "e"]
    store.set_agent(AgentContainer(namespace="ns", pod="p", uid="u", roles={"work": 1}, programs=programs))
    store.set_agent(AgentContainer(namespace="ns", pod="q", uid="v", unseen="not-running"))
    families = {f.name: f.samples for f in text_string_to_metric_families(store.agent_exposition(now=NOW))}
    roles = [s for s in families[PROCESSES_METRIC] if s.labels["tracked_pod"] == "p"]
    assert [s.labels["role"] for s in roles] == ["work"]  # the roles with processes only
    programs = roles[0].labels["programs"].split(" ")
    assert len(programs) == 4 and all(len(p) <= 64 for p in programs)
    assert [s.value for s in families[SCAN_METRIC]] == [NOW]
    # an unseen container has the unseen series and no processes series
    assert [s.labels["reason"] for s in families[UNSEEN_METRIC]] == ["not-running"]
    assert not [s for s in families[PROCESSES_METRIC] if s.labels["tracked_pod"] == "q"]
    with pytest.raises(ValueError, match="unknown role"):
        store.set_agent(AgentContainer(namespace="ns", pod="p", roles={"gpu": 1}))
    assert store.remove("ns", "p") == 1 and 'tracked_pod="p"' not in store.agent_exposition(now=NOW)


# --- the controller in agent mode -------------------------------------------------------------------


async def test_a_controller_in_agent_mode_judges_from_the_agents_counts_and_never_reclaims_without_them(
    prom: Prom, tmp_path: Path
) -> None:
    """The reconciler with the sources processSource: agent wires, over one Prometheus answer per
    poll: holders only is FINISHED_IDLE, work is ACTIVE, and every way the agent's series fail is
    UNKNOWN with the failure on the evidence, counted in the gauge by reason; nothing is exec'd."""
    from test_controller_reconciler import Harness  # the reconciler's own harness (fake cluster)

    class AgentHarness(Harness):
        def reconciler(self) -> Reconciler:
            client = PrometheusClient(prom.url, timeout=2)
            sources = signal_sources(self.cfg, client, self.exec)
            return Reconciler(
                self.cfg,
                cluster=self.cluster,  # type: ignore[arg-type]
                utilization=sources.utilization,
                processes=sources.processes,
                files=sources.files,
                s3=None,
                metrics=self.metrics,
                decision_log=self.log,
                is_leader=lambda: self.leader,
                clock=lambda: self.clock,
            )

    h = AgentHarness(tmp_path, mode="enforce", processSource="agent")
    store = Store()
    names = ["done", "working", "hidden", "old", "absent"]
    for name in names:
        h.add(name)
    pod = {name: f"{name}-abc12-xyz" for name in names}

    def agent(name: str, **kw: Any) -> None:
        store.set_agent(AgentContainer(namespace="team-a", pod=pod[name], uid=f"uid-pod-{name}", **kw))

    agent("done", roles={"wrapper": 1, "holder": 1})
    agent("working", roles={"wrapper": 1, "work": 1}, programs=["python"])
    agent("hidden", unseen="no-cgroup-match")
    agent("old", roles={"wrapper": 1, "holder": 1}, scan_timestamp=h.clock - 3600)
    zero = {("team-a", pod[n]) for n in names}
    prom.body = lambda q: answer(store, zero, at=h.clock)
    await h.polls(4)  # window 3: processes asked in polls 3 and 4
    assert len(prom.queries) == 4 and h.exec.calls == []  # one query per poll, no exec
    assert h.verdict("done") == "FINISHED_IDLE" and h.replicas("done") == 0
    assert h.verdict("working") == "ACTIVE" and h.replicas("working") == 1
    for name, reason in (("hidden", "no-cgroup-match"), ("old", "stale"), ("absent", "missing")):
        assert h.verdict(name) == "UNKNOWN" and h.replicas(name) == 1, name
        ann = h.objects[next(r for r in h.objects if r.name == name)]["metadata"]["annotations"]
        evidence = json.loads(ann["ghostgpu.io/evidence"])
        assert "processes-failed" in evidence["reasons"] and evidence["procs"] == f"!{reason}"
        assert h.metrics.without_processes.labels(reason)._value.get() == 1
