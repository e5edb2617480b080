"""Bad input, fuzzed: ghostgpu.yaml mutated and random, and hostile workload
annotations. Properties: every input ends in a value or in the module's own error type with a
readable message (never another exception), and nothing runs inside a container but the fixed
argv — asserted on the argv the probes hand to the exec layer, including through the reconciler.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import posixpath
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ghostgpu.config import ControllerConfig, GhostgpuConfig, load_config_text, load_controller_config
from ghostgpu.config_errors import ConfigError
from ghostgpu.controller.books.decisions import DecisionLog
from ghostgpu.controller.inventory import gpu_predicate, pod_view, workload_from
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.reconciler import Reconciler, Snapshot
from ghostgpu.signals.artifacts import (
    DU_ARGV_PREFIX,
    LS_ARGV_PREFIX,
    FileArtifactProbe,
    FileTarget,
    InvalidArtifactURI,
    S3Target,
    parse_artifact_uri,
    parse_du,
)
from ghostgpu.signals.podexec import ExecResult, PodRef
from ghostgpu.signals.processes import LISTING_ARGVS, PS_ARGV, ExecProcessSource, MalformedListing, parse_ps
from ghostgpu.signals.prometheus import PrometheusError, parse_vector
from ghostgpu.signals.utilization import PodKey, PodReading
from ghostgpu.verdict import RECLAIMABLE_KINDS, SignalFailure, VerdictKind

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ghostgpu.yaml"
BASE: dict[str, Any] = yaml.safe_load(EXAMPLE.read_text())
FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHELL_META = list(";|&$`\\\"'<>(){}[]*?!#~\n\t \r%^")
SAFE_PATH = re.compile(r"^/[A-Za-z0-9._/@+=,-]*$")

# --- ghostgpu.yaml ----------------------------------------------------------------------------------


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    yield prefix
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _paths(v, (*prefix, i))


PATHS = [p for p in _paths(BASE) if p]
hostile_text = st.one_of(
    st.text(max_size=40),
    st.text(alphabet=st.sampled_from([*SHELL_META, "a", "/", ".", "-"]), max_size=40),
    st.sampled_from(["../../etc/passwd", "$(reboot)", "`id`", "a; rm -rf /", "${HOME}", "%s%n", "\x00"]),
    st.integers(min_value=1, max_value=20_000).map(lambda n: "9" * n),  # huge numbers as text
)
junk = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(10**30), max_value=10**30),
        st.floats(allow_nan=True, allow_infinity=True),
        hostile_text,
    ),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(hostile_text, inner, max_size=4),
    max_leaves=8,
)


def _set(doc: Any, path: tuple[Any, ...], value: Any, op: str) -> None:
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    last = path[-1]
    if op == "delete":
        del parent[last]
    elif op == "extra" and isinstance(parent, dict):
        parent[f"unexpected{len(parent)}"] = value
    else:
        parent[last] = value


def _load(text: str) -> GhostgpuConfig | ConfigError:
    try:
        return load_config_text(text, "fuzz.yaml")
    except ConfigError as exc:
        return exc


def _assert_clear(err: ConfigError) -> None:
    assert err.issues, "a ConfigError must name at least one problem"
    for line in err.lines():
        assert line.startswith("fuzz.yaml: ")
        assert len(line) < 20_000  # huge values are not echoed back in full


@FUZZ
@given(path=st.sampled_from(PATHS), value=junk, op=st.sampled_from(["replace", "delete", "extra"]))
def test_mutated_config_loads_or_fails_clearly(path: tuple[Any, ...], value: Any, op: str) -> None:
    doc = copy.deepcopy(BASE)
    _set(doc, path, value, op)
    try:
        text = yaml.safe_dump(doc, sort_keys=False, allow_unicode=True)
    except yaml.YAMLError:
        assume(False)
    out = _load(text)
    if isinstance(out, ConfigError):
        _assert_clear(out)
    else:
        assert isinstance(out, GhostgpuConfig)


@FUZZ
@given(text=st.text(max_size=300))
def test_arbitrary_text_loads_or_fails_clearly(text: str) -> None:
    out = _load(text)
    if isinstance(out, ConfigError):
        _assert_clear(out)


@FUZZ
@given(key=st.sampled_from(sorted(BASE.get("controller") or {"mode": "shadow"})), value=junk)
def test_controller_section_loads_or_fails_clearly(tmp_path_factory: Any, key: str, value: Any) -> None:
    section = {**(BASE.get("controller") or {}), key: value}
    path = tmp_path_factory.mktemp("cm") / "ghostgpu-controller.yaml"
    path.write_text(yaml.safe_dump(section))
    try:
        cfg = load_controller_config(path)
    except ConfigError as exc:
        assert exc.issues and all(line.startswith(str(path)) for line in exc.lines())
    else:
        assert isinstance(cfg, ControllerConfig)


def test_yaml_alias_bomb_is_rejected_as_such() -> None:
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 5)]
    lines.append("teams: *a4")  # 10^5 leaves from 6 lines
    out = _load("\n".join(lines))
    assert isinstance(out, ConfigError)
    assert any("alias" in line.lower() for line in out.lines())


# --- artifact URIs and the fixed argv ---------------------------------------------------------------

path_part = st.one_of(
    st.sampled_from(["..", ".", "", "data", "out", "-rf", "--help", "$(id)", "a b", "x;y", "~", "*"]),
    st.text(alphabet=st.sampled_from([*SHELL_META, "a", "b", "0", ".", "-", "_"]), min_size=1, max_size=12),
)
file_uris = st.builds(
    lambda parts, lead, host: f"file://{host}{lead}{'/'.join(parts)}",
    st.lists(path_part, min_size=0, max_size=6),
    st.sampled_from(["/", "", "//", "/./", "/../"]),
    st.sampled_from(["", "localhost", "evil.example", "127.0.0.1"]),
)
s3_uris = st.builds(
    lambda b, p: f"s3://{b}/{p}",
    st.text(alphabet=st.sampled_from(list("abc-.0_A;$")), max_size=70),
    st.text(max_size=40),
)
huge_uris = st.integers(min_value=1000, max_value=70_000).map(lambda n: "file:///" + "a" * n)
any_uri = st.one_of(file_uris, s3_uris, huge_uris, st.text(max_size=80))


class RecordingExec:
    """Records every argv handed to the exec layer; answers like a container where `du` sees 4 KiB."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        self.calls.append(argv)
        if argv == PS_ARGV:
            return ExecResult("PID PPID STAT ELAPSED COMMAND\n    1 0 S 900 sleep infinity\n", "", 0)
        if argv[: len(DU_ARGV_PREFIX)] == DU_ARGV_PREFIX:
            return ExecResult(f"4\t{argv[-1]}\n", "", 0)
        return ExecResult("", "", 0)


@FUZZ
@given(uri=any_uri)
def test_artifact_uri_parses_to_a_safe_target_or_a_clear_error(uri: str) -> None:
    try:
        target = parse_artifact_uri(uri)
    except InvalidArtifactURI as exc:
        assert str(exc)
        return
    if isinstance(target, FileTarget):
        p = target.path
        assert SAFE_PATH.match(p) and len(p) <= 1024
        assert posixpath.normpath(p) == p and ".." not in p.split("/")
        assert not any(c in p for c in SHELL_META)
    else:
        assert isinstance(target, S3Target)
        assert re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", target.bucket)


@FUZZ
@given(uri=any_uri)
async def test_file_probe_runs_only_the_fixed_argv(uri: str) -> None:
    try:
        target = parse_artifact_uri(uri)
    except InvalidArtifactURI:
        return
    assume(isinstance(target, FileTarget))
    assert isinstance(target, FileTarget)
    ex = RecordingExec()
    await FileArtifactProbe(ex, timeout=1).measure(PodRef("ns", "p", "main"), target)
    assert ex.calls == [(*DU_ARGV_PREFIX, target.path), (*LS_ARGV_PREFIX, target.path)]
    # the one user-derived element comes after `--` and starts with '/': never an option
    assert all(call[-1].startswith("/") and call[-2] == "--" for call in ex.calls)


@FUZZ
@given(
    ns=st.text(max_size=30), name=st.text(max_size=30), container=st.text(alphabet=SHELL_META, max_size=10)
)
async def test_process_probe_argv_never_depends_on_the_pod(ns: str, name: str, container: str) -> None:
    ex = RecordingExec()
    await ExecProcessSource(ex, concurrency=1, timeout=1).list_processes(PodRef(ns, name, container))
    assert ex.calls == [PS_ARGV]
    # A container whose ps rejects the procps columns gets the one other fixed argv, nothing else.
    busybox = RecordingExec()

    async def rejecting(pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        busybox.calls.append(argv)
        return ExecResult("", "ps: bad -o argument 'etimes'", 1)

    busybox.run = rejecting  # type: ignore[method-assign]
    await ExecProcessSource(busybox, concurrency=1, timeout=1).list_processes(PodRef(ns, name, container))
    assert busybox.calls == list(LISTING_ARGVS)


# --- workload annotations through the reconciler ----------------------------------------------------

huge_values = st.integers(min_value=0, max_value=60_000).map("x".__mul__)
annotation_values = st.one_of(any_uri, hostile_text, huge_values)
annotations = st.dictionaries(
    st.sampled_from(
        [
            "ghostgpu.io/artifacts",
            "ghostgpu.io/reclaim-policy",
            "gpu-eviction-policy",
            "ghostgpu.io/reclaimed-from-replicas",
            "ghostgpu.io/verdict",
            "ghostgpu.io/evidence",
            "example.com/other",
        ]
    ),
    annotation_values,
    max_size=5,
)


def _pod(i: int, ann: dict[str, str]) -> dict[str, Any]:
    started = (datetime.now(UTC) - timedelta(hours=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"w{i}",
            "namespace": "fuzz",
            "uid": f"uid-{i}",
            "labels": {"ghostgpu.io/tracked": "true"},
            "annotations": ann,
            "creationTimestamp": started,
        },
        "spec": {
            "nodeName": "n0",
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
        },
        "status": {"phase": "Running", "startTime": started},
    }


class ZeroUtilization:
    """Every pod reads 0 % (the worst case: every workload becomes an idle candidate)."""

    async def poll(
        self, pods: Any, *, now: float, devices: object = None, uids: object = None
    ) -> dict[PodKey, PodReading]:
        return {p: PodReading(0.0) for p in pods}


class NoCluster:
    """Followers never write; any call here would be a bug in this test's set-up."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"unexpected cluster call {name}")


@FUZZ
@given(batch=st.lists(annotations, min_size=1, max_size=6))
def test_hostile_annotations_reach_only_the_fixed_argv_and_never_a_reclaim(
    batch: list[dict[str, str]],
) -> None:
    is_gpu = gpu_predicate(["nvidia.com/gpu"])
    pods = [_pod(i, ann) for i, ann in enumerate(batch)]
    workloads = {wl.ref: wl for wl in (workload_from("Pod", p, is_gpu) for p in pods)}
    snap = Snapshot(
        namespaces={"fuzz": {"ghostgpu.io/reclaim": "enabled"}},
        workloads=workloads,
        pods=[pod_view(p, is_gpu) for p in pods],
        nodes=[],
    )
    ex = RecordingExec()
    cfg = ControllerConfig.model_validate({"window": 2, "longWindow": 2, "startupGrace": "1s"})
    rec = Reconciler(
        cfg,
        cluster=NoCluster(),  # type: ignore[arg-type]
        utilization=ZeroUtilization(),  # type: ignore[arg-type]
        processes=ExecProcessSource(ex, concurrency=2, timeout=1),
        files=FileArtifactProbe(ex, timeout=1),
        s3=None,
        metrics=ControllerMetrics(),
        decision_log=DecisionLog(None),
        is_leader=lambda: False,
    )

    async def polls() -> Any:
        result = None
        for _ in range(3):
            result = await rec.poll_once(snap)
        return result

    result = asyncio.run(polls())
    allowed = set(LISTING_ARGVS)
    for ann in batch:
        try:
            t = parse_artifact_uri(ann.get("ghostgpu.io/artifacts", ""))
        except InvalidArtifactURI:
            continue
        if isinstance(t, FileTarget):
            allowed |= {(*DU_ARGV_PREFIX, t.path), (*LS_ARGV_PREFIX, t.path)}
    assert set(ex.calls) <= allowed
    for ref, judged in result.judged.items():
        ann = workloads[ref].annotations
        uri = ann.get("ghostgpu.io/artifacts")
        if not uri:  # absent or empty: nothing declared (the artifact signal is not used)
            continue
        try:
            target = parse_artifact_uri(uri)
        except InvalidArtifactURI:
            # an unusable artifact declaration is a failed required signal: never reclaimable
            assert judged.verdict.kind is VerdictKind.UNKNOWN
            assert judged.verdict.kind not in RECLAIMABLE_KINDS
            continue
        if isinstance(target, S3Target):  # no S3 client configured here: a failure, kept
            assert judged.verdict.kind not in RECLAIMABLE_KINDS


@FUZZ
@given(ann=annotations)
def test_workload_annotations_never_break_inventory(ann: dict[str, str]) -> None:
    wl = workload_from("Pod", _pod(0, ann), gpu_predicate())
    assert isinstance(wl.exempt, bool)
    assert wl.reclaimed_from is None or isinstance(wl.reclaimed_from, int)
    assert wl.exempt == (
        ann.get("ghostgpu.io/reclaim-policy") == "never" or ann.get("gpu-eviction-policy") == "never"
    )


# --- signal parsers on garbage -----------------------------------------------------------------------


@FUZZ
@given(text=st.one_of(st.text(max_size=400), st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_ps_parser_garbage_is_a_malformed_listing(text: str) -> None:
    try:
        procs = parse_ps(text)
    except MalformedListing:
        return
    assert all(p.pid >= 1 for p in procs)


@FUZZ
@given(text=st.text(max_size=200), path=st.sampled_from(["/data", "/out/x"]))
def test_du_parser_garbage_is_a_value_error(text: str, path: str) -> None:
    with contextlib.suppress(ValueError):
        assert parse_du(text, path) >= 0


json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
vector_like = st.builds(
    lambda status, rt, result: {"status": status, "data": {"resultType": rt, "result": result}},
    st.sampled_from(["success", "error", None]),
    st.sampled_from(["vector", "matrix", 3]),
    st.lists(st.fixed_dictionaries({"metric": json_values, "value": json_values}) | json_values, max_size=4),
)


@FUZZ
@given(body=st.one_of(json_values, vector_like))
def test_prometheus_body_garbage_is_a_typed_failure(body: Any) -> None:
    json.dumps(body)  # what a server could send
    try:
        _, samples = parse_vector(body)
    except PrometheusError as exc:
        assert isinstance(exc.failure, SignalFailure)
        return
    import math

    assert all(math.isfinite(s.value) for s in samples)
