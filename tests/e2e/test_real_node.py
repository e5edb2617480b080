"""Real shapes on the devcluster's real node: each shape of tests/shapes/shapes.yaml below runs as a
real pod (kubelet + containerd + runc) whose command produces that shape; the controller's exec runs
the container's own `ps` through the apiserver and the real kubelet (no ps shim), restarts and exit
codes come from the kubelet, and only the GPU is a double (the fake dcgm-exporter).

For each shape the test records the in-container listing beside its roles (ghostgpu.signals's own
parser and classifier) in the test log and in <state>/logs/real-shapes.jsonl, checks the roles are
the corpus shape's, then checks the controller's verdict in shadow mode equals the corpus's
expectation; in enforce mode only the reclaimable ones are stopped, and `ghostgpu restore` brings
their real containers back."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import kr8s.asyncio
import pytest
import yaml
from cli_runs import restore
from kubernetes import client
from kubernetes.stream import stream
from test_controller import REPO, Controller, controller_config, opt_in, wait_for

from ghostgpu import __version__
from ghostgpu.config import ControllerConfig
from ghostgpu.controller.observe.evidence import policy_from_config
from ghostgpu.devcluster import DevCluster, FakeDcgmClient, cluster, realnode
from ghostgpu.devcluster.fleet import (
    BUSYBOX_SETUP,
    SLEEP_LONG,
    SUPERVISORD,
    Box,
    RealShape,
    deployment,
    sh,
    the_running_pod,
)
from ghostgpu.devcluster.realnode import REAL_NODE_TAINT
from ghostgpu.signals.podexec import ExecResult, KubeExec, PodRef
from ghostgpu.signals.processes import ExecProcessSource, parse_ps
from ghostgpu.verdict import SignalFailure, classify_listing

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.real_node, pytest.mark.timeout(900)]

CORPUS = {s["name"]: s for s in yaml.safe_load((REPO / "tests" / "shapes" / "shapes.yaml").read_text())}
POLICY = policy_from_config(ControllerConfig())


def expect(shape: RealShape) -> str:
    return str(CORPUS[shape.corpus]["expect"])


SHAPES = [
    RealShape(
        "torchrun-finished-container-kept-alive", {"trainer": sh("python3 -c 'print(1)' && sleep infinity")}
    ),
    RealShape(
        "periodic-job-asleep-between-hourly-runs",
        {"job": sh("while true; do python3 -c 'print(1)'; sleep 3600; done")},
    ),
    RealShape(
        "periodic-loop-on-alpine-busybox",
        {
            "job": sh(
                BUSYBOX_SETUP + "exec /bb/ash -c 'while :; do python3 -c pass; sleep 30m; done'", busybox=True
            )
        },
    ),
    # Debian's BusyBox has no crond applet: Debian's cron, listed by BusyBox's ps (roles: a timer).
    RealShape("busybox-crond-between-runs", {"cron": sh(BUSYBOX_SETUP + "exec cron -f", busybox=True)}),
    RealShape(
        "supervisord-with-a-live-worker",
        {"serve": sh(SUPERVISORD.format(name="serve", command=f'python3 -c "{SLEEP_LONG}"'))},
    ),
    RealShape(
        "supervisord-every-program-exited",
        {"serve": sh(SUPERVISORD.format(name="train", command="python3 -c \"print('done')\""))},
    ),
    RealShape(
        "tini-shell-sleep-infinity-after-training",
        {"trainer": Box(["/usr/bin/tini", "--", "/bin/sh", "-c", "python3 -c 'print(1)'; sleep infinity"])},
    ),
    RealShape(
        "dumb-init-gunicorn-between-requests",
        {"api": Box(["/usr/bin/dumb-init", "--", "/bin/sh", "-c", f'python3 -c "{SLEEP_LONG}"'])},
    ),
    # The crashed child is never reaped: its parent (a subshell turned `sleep infinity`) never waits.
    RealShape(
        "crashed-worker-left-a-defunct-child",
        {"trainer": sh("(python3 -c 'import os; os.kill(os.getpid(), 9)' & exec sleep infinity)")},
    ),
    RealShape(
        "crash-loop-with-zero-memory",
        {
            "trainer": sh(
                "if [ -e /state/crashed ]; then python3 -c pass; sleep infinity; "
                "else touch /state/crashed; python3 -c 'import sys; sys.exit(1)'; fi"
            )
        },
        crash_first=True,
    ),
    RealShape("someones-kubectl-exec-terminal", {"dev": Box(["sleep", "infinity"])}, session="tty"),
    RealShape(
        "someones-kubectl-exec-without-a-terminal", {"dev": Box(["sleep", "infinity"])}, session="pipe"
    ),
    RealShape(
        "second-gpu-container-still-serving",
        {
            "trainer": sh("python3 -c 'print(1)'; sleep infinity"),
            "embedder": Box(["python3", "-c", SLEEP_LONG]),
        },
    ),
    RealShape(
        "shared-process-namespace-all-finished",
        {"trainer": sh("python3 -c 'print(1)'; sleep infinity")},
        shared_pid=True,
        extra={"eval": sh("python3 -c 'print(2)'; sleep infinity")},
    ),
    RealShape(
        "distroless-image-without-ps",
        {"server": Box(["/usr/bin/python3", "-c", SLEEP_LONG], image="distroless")},
    ),
    RealShape("sleep-max-int-holder", {"main": Box(["sleep", "2147483647"])}),
    # Not here: tail-dev-null-holder. GNU tail -f /dev/null wakes every second (it polls a device
    # it cannot watch); on a loaded machine a listing often catches it R, which is work to the
    # classifier, so its verdict on a real node is ACTIVE about as often as FINISHED_IDLE.
    RealShape("timeout-wrapped-evaluation", {"eval": Box(["timeout", "7200", "python3", "-c", SLEEP_LONG])}),
]
RECLAIMABLE = {s.name for s in SHAPES if expect(s) in ("FINISHED_IDLE", "ZOMBIE_CRASHED")}


class RecordingExec:
    """The controller's own exec client (KubeExec), keeping what each `ps` printed."""

    def __init__(self, inner: KubeExec) -> None:
        self.inner = inner
        self.outputs: dict[tuple[str, str], str] = {}

    async def run(self, pod: PodRef, argv: tuple[str, ...], *, timeout: float) -> ExecResult:
        r = await self.inner.run(pod, argv, timeout=timeout)
        self.outputs[(pod.name, pod.container)] = (
            f"$ {' '.join(argv)}  (exit {r.returncode})\n{r.stdout}{r.stderr}"
        )
        return r


async def list_real(kubeconfig: Path, pods: list[PodRef]) -> tuple[dict[PodRef, Any], RecordingExec]:
    api = await kr8s.asyncio.api(kubeconfig=str(kubeconfig))
    rec = RecordingExec(KubeExec(api))
    return await ExecProcessSource(rec).list_many(pods), rec


def roles_of(listing: Any) -> set[str] | str:
    if isinstance(listing, SignalFailure):
        return listing.reason.value
    return {r.value for r in classify_listing(listing, POLICY.processes)}


def corpus_roles(corpus: str) -> set[str] | str:
    text = CORPUS[corpus]["containers"]
    roles: set[str] = set()
    for listing in text.values():
        if listing == "no-ps":
            return "no-listing"
        roles |= {r.value for r in classify_listing(parse_ps(listing, scope="c"), POLICY.processes)}
    return roles


@dataclass
class Fleet:
    cluster: DevCluster
    ns: str
    pods: dict[str, str] = field(default_factory=dict)
    sessions: list[Any] = field(default_factory=list)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.cluster.kube.api_client)

    @property
    def apps(self) -> client.AppsV1Api:
        return client.AppsV1Api(self.cluster.kube.api_client)

    def running_pod(self, shape: RealShape) -> str | None:
        return the_running_pod(self.core, self.ns, shape.name)

    def status_of(self, shape: RealShape, name: str) -> Any:
        pod = self.core.read_namespaced_pod(self.pods[shape.name], self.ns)
        return next(cs for cs in pod.status.container_statuses if cs.name == name)

    def verdict(self, shape: RealShape) -> str | None:
        d = self.apps.read_namespaced_deployment(shape.name, self.ns)
        return (d.metadata.annotations or {}).get("ghostgpu.io/verdict")

    def replicas(self, shape: RealShape) -> int:
        return int(self.apps.read_namespaced_deployment(shape.name, self.ns).spec.replicas)

    def open_session(self, shape: RealShape) -> None:
        """A person's `kubectl exec -it ... bash` (tty) or `kubectl exec -i ... bash` (pipe), held open."""
        pod, c = self.pods[shape.name], next(iter(shape.containers))
        ws = stream(
            self.core.connect_get_namespaced_pod_exec,
            pod,
            self.ns,
            container=c,
            command=["/bin/bash"],
            stdin=True,
            stdout=True,
            stderr=True,
            tty=shape.session == "tty",
            _preload_content=False,
        )
        self.sessions.append(ws)


@pytest.fixture(scope="module")
def fleet(devcluster: DevCluster) -> Iterator[Fleet]:
    if devcluster.state.real_node is None:
        pytest.fail(f"the devcluster's real node did not start: {devcluster.state.real_node_error}")
    images = devcluster.state.node_images
    assert images is not None
    ns = f"real-{int(time.time())}"
    devcluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    devcluster.kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ghostgpu-system"}})
    f = Fleet(devcluster, ns)
    by_kind = {"workload": images.workload, "distroless": images.distroless}
    t0 = time.monotonic()
    for shape in SHAPES:
        devcluster.kube.apply(deployment(shape, ns, by_kind))
    for shape in SHAPES:
        f.pods[shape.name] = wait_for(lambda s=shape: f.running_pod(s), 120, f"{shape.name} running")
    print(f"[real node] {len(SHAPES)} deployments running in {time.monotonic() - t0:.1f}s")
    for shape in SHAPES:
        if shape.crash_first:  # ready again after a real restart: restartCount from the kubelet
            wait_for(
                lambda s=shape: f.status_of(s, "trainer").restart_count >= 1 and f.running_pod(s),
                90,
                "restart",
            )
        if shape.session:
            f.open_session(shape)
    yield f
    for ws in f.sessions:
        ws.close()
    devcluster.kube.delete("v1", "Namespace", ns)


def test_real_pods_list_as_their_corpus_shapes(fleet: Fleet, devcluster: DevCluster) -> None:
    """The listing the controller's own exec gets from each real container parses into the
    corpus shape's roles; crash evidence is the real kubelet's. A process caught running (R: a
    supervisord at its 1 s tick) is work for that instant, so a shape gets a few listings."""
    time.sleep(2)  # the held-open sessions' bash is up
    log = Path(devcluster.state.state_dir) / "logs" / "real-shapes.jsonl"
    pending = {s.corpus: s for s in SHAPES}
    mismatched: dict[str, Any] = {}
    for _attempt in range(5):
        targets = {
            s.corpus: [PodRef(fleet.ns, fleet.pods[s.name], c) for c in s.containers]
            for s in pending.values()
        }
        refs = [p for ps in targets.values() for p in ps]
        listings, rec = asyncio.run(list_real(devcluster.kubeconfig, refs))
        mismatched = {}
        with log.open("a") as out:
            for corpus, refs_of in targets.items():
                got: set[str] | str = set()
                for ref in refs_of:
                    roles = roles_of(listings[ref])
                    got = roles if isinstance(roles, str) else (got if isinstance(got, str) else got | roles)
                    text = rec.outputs.get((ref.name, ref.container), str(listings[ref]))
                    print(f"--- {corpus} / {ref.container}: roles {roles}\n{text}")
                    kept = sorted(roles) if isinstance(roles, set) else roles
                    out.write(
                        json.dumps({"shape": corpus, "container": ref.container, "ps": text, "roles": kept})
                    )
                    out.write("\n")
                want = corpus_roles(corpus)
                if got != want:
                    mismatched[corpus] = (sorted(got) if isinstance(got, set) else got, want)
        pending = {c: pending[c] for c in mismatched}
        if not pending:
            break
        time.sleep(1)
    assert mismatched == {}
    crash = next(s for s in SHAPES if s.crash_first)
    st = fleet.status_of(crash, "trainer")
    assert st.restart_count >= 1
    assert (st.last_state.terminated.reason, st.last_state.terminated.exit_code) == ("Error", 1)


# The procps listing the agent's rows are compared with: the container's own /usr/bin/ps (also in
# the BusyBox shapes, whose PATH puts BusyBox's first), -ww as without a terminal ps cuts at 80.
PS_WIDE = ("/usr/bin/ps", "-ww", "-eo", "pid,ppid,stat,etimes,args")


async def ps_wide(kubeconfig: Path, refs: list[PodRef]) -> dict[PodRef, ExecResult | Exception]:
    api = await kr8s.asyncio.api(kubeconfig=str(kubeconfig))
    ex = KubeExec(api)

    async def one(ref: PodRef) -> ExecResult | Exception:
        try:
            return await ex.run(ref, PS_WIDE, timeout=20)
        except Exception as exc:  # distroless: no ps at all
            return exc

    return dict(zip(refs, await asyncio.gather(*(one(r) for r in refs)), strict=True))


def node_pods(fleet: Fleet) -> list[dict[str, Any]]:
    """The node's pods as the agent's watch gets them (the API's JSON, camelCase)."""
    node = fleet.cluster.state.real_node
    items = fleet.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}").items
    return [fleet.core.api_client.sanitize_for_serialization(p) for p in items]


def columns(rows: Any) -> list[tuple[int, int | None, str, str]]:
    return [(r.pid, r.ppid, r.state, r.command) for r in rows]


def test_agent_rows_equal_ps_in_every_real_container(fleet: Fleet, devcluster: DevCluster) -> None:
    """The node agent's scan of the host's /proc gives, for every real container of every shape,
    the rows the container's own procps `ps` prints (minus the probe; etimes within 2 s); the
    distroless container, which has no ps, gets rows too; a held-open `kubectl exec` is a session."""
    from ghostgpu.agent.scan import ContainerKey, Seen, scan_node
    from ghostgpu.controller.inventory import gpu_predicate

    time.sleep(2)  # the held-open sessions' bash is up
    log = Path(devcluster.state.state_dir) / "logs" / "real-shapes.jsonl"
    uids = {p["metadata"]["name"]: p["metadata"]["uid"] for p in node_pods(fleet)}
    # The real node's own cgroup lines, for the record (its cgroupRoot, its driver, this host's v1/v2).
    first = next(p for p in node_pods(fleet) if p["metadata"]["name"] == fleet.pods[SHAPES[0].name])
    cid = first["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            text = Path(f"/proc/{pid}/cgroup").read_text()
            if cid in text:
                print(f"[real node cgroup] uid {first['metadata']['uid']} id {cid}: {text!r}")
                break
    pending = {(s.corpus, c): s for s in SHAPES for c in s.containers}
    mismatched: dict[tuple[str, str], Any] = {}
    seen_rows: dict[tuple[str, str], Any] = {}
    for _attempt in range(5):
        refs = {k: PodRef(fleet.ns, fleet.pods[s.name], k[1]) for k, s in pending.items()}
        printed = asyncio.run(ps_wide(devcluster.kubeconfig, list(refs.values())))
        # After every ps has exited: the probes are gone from /proc when the agent reads it.
        scan = scan_node(node_pods(fleet), Path("/proc"), POLICY.processes, gpu_predicate(), now=time.time())
        mismatched = {}
        with log.open("a") as out:
            for k, ref in refs.items():
                outcome = scan.containers.get(ContainerKey(fleet.ns, ref.name, uids[ref.name], ref.container))
                assert isinstance(outcome, Seen), f"{k}: the agent did not see it: {outcome}"
                seen_rows[k] = outcome
                res = printed[ref]
                ours = columns(outcome.rows)
                if isinstance(res, ExecResult) and res.returncode == 0:
                    theirs = parse_ps(res.stdout, scope=f"{ref.name}/{ref.container}")
                    equal = ours == columns(theirs) and all(
                        abs((a.elapsed_s or 0) - (b.elapsed_s or 0)) <= 2
                        for a, b in zip(outcome.rows, theirs, strict=True)
                    )
                    ps_text = res.stdout
                else:
                    ps_text = f"no ps: {res}"
                    equal = pending[k].containers[k[1]].image == "distroless"  # no ps: checked below
                print(f"--- agent {k}: equal={equal}\n{ps_text}\n" + "\n".join(map(str, ours)))
                out.write(
                    json.dumps(
                        {
                            "shape": k[0],
                            "container": k[1],
                            "source": "agent",
                            "ps": ps_text,
                            "agent": [list(r) for r in ours],
                            "counts": outcome.counts.model_dump(mode="json"),
                            "equal": equal,
                        }
                    )
                )
                out.write("\n")
                if not equal:
                    mismatched[k] = (ps_text, ours)
        pending = {k: pending[k] for k in mismatched}
        if not pending:
            break
        time.sleep(1)
    assert mismatched == {}
    distroless = next(s for s in SHAPES if any(b.image == "distroless" for b in s.containers.values()))
    rows = seen_rows[(distroless.corpus, next(iter(distroless.containers)))].rows
    assert [(r.pid, r.ppid) for r in rows] == [(1, 0)] and "python3" in rows[0].command
    for s in SHAPES:
        if s.session:
            counts = seen_rows[(s.corpus, next(iter(s.containers)))].counts
            assert counts.session >= 1 and "bash" in counts.programs, (s.corpus, counts)
            rows = seen_rows[(s.corpus, next(iter(s.containers)))].rows
            bash = [r for r in rows if r.command == "/bin/bash"]
            assert bash and bash[0].ppid == 0, bash  # exec'd: its parent is outside the container
            assert ("+" in bash[0].state) == (s.session == "tty"), bash


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {
        (x.name, tuple(sorted(x.labels.items()))): x.value
        for fam in text_string_to_metric_families(text)
        for x in fam.samples
    }


def test_the_agent_command_exports_every_real_containers_roles(fleet: Fleet, devcluster: DevCluster) -> None:
    """`ghostgpu agent` as the DaemonSet runs it (its own process, the pods watched by node name)
    exports for every shape's GPU containers the role counts whose roles are the corpus shape's;
    the distroless one too (exec cannot list it), the held-open exec sessions as sessions."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    node = devcluster.state.real_node
    assert node
    agent = subprocess.Popen(
        [sys.executable, "-m", "ghostgpu.cli", "agent", "--kubeconfig", str(devcluster.kubeconfig),
         "--node-name", node, "--proc", "/proc", "--listen", f"127.0.0.1:{port}", "--interval", "1"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    log = Path(devcluster.state.state_dir) / "logs" / "real-shapes.jsonl"
    want = {s.corpus: corpus_roles(s.corpus) for s in SHAPES}
    want = {c: ({"work"} if r == "no-listing" else r) for c, r in want.items()}  # distroless: python3
    got: dict[str, Any] = {}
    try:

        def roles_match() -> bool:
            try:
                series = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:  # not listening yet (its imports, its first list of the node's pods)
                assert agent.poll() is None, "the agent exited"
                return False
            for s in SHAPES:
                if got.get(s.corpus) == want[s.corpus]:
                    continue
                roles: set[str] = set()
                for c in s.containers:
                    # the tracked pod under the agent's own label names (Prometheus sets namespace/pod)
                    pod = fleet.pods[s.name]
                    base = {"tracked_namespace": fleet.ns, "tracked_pod": pod, "tracked_container": c}
                    for (name, labels), value in series.items():
                        lab = dict(labels)
                        ours = all(lab.get(k) == v for k, v in base.items())
                        if name == "ghostgpu_agent_container_processes" and value > 0 and ours:
                            roles.add(lab["role"])
                got[s.corpus] = roles
            return got == want

        try:
            wait_for(roles_match, 60, "the agent's series")
        finally:
            with log.open("a") as out:
                for corpus, roles in sorted(got.items()):
                    line = {"shape": corpus, "source": "agent-series", "roles": sorted(roles)}
                    out.write(json.dumps({**line, "want": sorted(want[corpus])}) + "\n")
        series = scrape(f"http://127.0.0.1:{port}/metrics")
        assert series[("ghostgpu_agent_info", (("node", node), ("version", __version__)))] == 1
        assert series[("ghostgpu_agent_tracked_containers", ())] >= sum(len(s.containers) for s in SHAPES)
        unseen = [
            k
            for k in series
            if k[0] == "ghostgpu_agent_container_unseen" and ("tracked_namespace", fleet.ns) in k[1]
        ]
        assert unseen == []
        # What the agent costs Prometheus: its series per GPU container, from its real /metrics. No
        # zero-valued role series; a busy container (a live role: work, timer, session) has its
        # roles with processes and the scan time, 3 on average at most.
        per: dict[tuple[str, str], list[tuple[str, dict[str, str], float]]] = {}
        for (name, labels), value in series.items():
            lab = dict(labels)
            if name.startswith("ghostgpu_agent_container_") and lab.get("tracked_namespace") == fleet.ns:
                per.setdefault((lab["tracked_pod"], lab["tracked_container"]), []).append((name, lab, value))
        assert all(v > 0 for rows in per.values() for n, _l, v in rows if n.endswith("_processes"))
        assert all(any(n.endswith("_scan_timestamp_seconds") for n, _l, _v in rows) for rows in per.values())
        busy = [
            len(rows)
            for rows in per.values()
            if any(lab.get("role") in ("work", "timer", "session") for _n, lab, _v in rows)
        ]
        mean = sum(busy) / len(busy)
        line = {"source": "agent-series-per-container", "containers": len(per), "busy": len(busy)}
        line |= {
            "mean_per_busy": round(mean, 3),
            "mean_per_container": round(sum(map(len, per.values())) / len(per), 3),
        }
        print(json.dumps(line))
        with log.open("a") as out:
            out.write(json.dumps(line) + "\n")
        assert busy and mean <= 3.0, line
    finally:
        agent.terminate()
        out_text = agent.communicate(timeout=20)[0]
        print(out_text[-3000:])


def real_config(tmp: Path, prometheus_url: str, mode: str) -> Path:
    """test_controller's controller config, with a long window no run here reaches: every shape
    below is judged within the corpus's short window (none of them expects IDLE_HELD)."""
    path = controller_config(tmp, prometheus_url, mode)
    cfg = yaml.safe_load(path.read_text())
    cfg["controller"]["longWindow"] = 60
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_shadow_verdicts_then_enforce_then_restore(
    fleet: Fleet, devcluster: DevCluster, dcgm: FakeDcgmClient, prometheus_url: str, tmp_path: Path
) -> None:
    for shape in SHAPES:
        mem = CORPUS[shape.corpus]["memoryMiB"]
        for c in shape.containers:
            dcgm.set(
                fleet.ns, fleet.pods[shape.name], util=0.0, fb_used_mib=mem, container=c, node="localhost"
            )
    opt_in(devcluster, fleet.ns)
    shadow = Controller(
        devcluster.kubeconfig, real_config(tmp_path, prometheus_url, "shadow"), tmp_path, "shadow"
    )
    expected = {s.name: expect(s) for s in SHAPES}
    try:
        shadow.wait_polls(4, timeout=180)

        # Each shape's verdict as it is written; a shape counts once its verdict was the corpus's.
        got: dict[str, str | None] = {}

        def as_expected() -> bool:
            for s in SHAPES:
                if got.get(s.name) != expected[s.name]:
                    got[s.name] = fleet.verdict(s)
            return got == expected

        try:
            wait_for(as_expected, 90, "shadow verdicts")
        finally:
            for s in SHAPES:
                print(f"[verdict] {s.corpus}: {got.get(s.name)} (corpus: {expect(s)})")
        assert got == expected
        assert all(fleet.replicas(s) == 1 for s in SHAPES), "shadow touches nothing"
    finally:
        shadow.stop()

    enforce = Controller(
        devcluster.kubeconfig,
        real_config(tmp_path, prometheus_url, "enforce"),
        tmp_path,
        "enforce",
    )
    try:
        enforce.wait_polls(3)
        wait_for(lambda: all(fleet.replicas(s) == 0 for s in SHAPES if s.name in RECLAIMABLE), 90, "reclaims")
        enforce.wait_polls(2)
        assert {s.name: fleet.replicas(s) for s in SHAPES} == {
            s.name: 0 if s.name in RECLAIMABLE else 1 for s in SHAPES
        }
        # The real containers are gone: no pod of a reclaimed workload is left on the node.
        wait_for(
            lambda: (
                not any(
                    fleet.core.list_namespaced_pod(fleet.ns, label_selector=f"app={n}").items
                    for n in RECLAIMABLE
                )
            ),
            60,
            "the reclaimed pods' containers stopped",
        )
    finally:
        enforce.stop()

    for name in sorted(RECLAIMABLE):
        out = restore(devcluster, f"deployment/{name}", fleet.ns)
        assert out.returncode == 0 and "to 1 replicas" in out.stdout, out.stderr
    for shape in SHAPES:
        if shape.name in RECLAIMABLE:
            pod = wait_for(lambda s=shape: fleet.running_pod(s), 120, f"{shape.name} running again")
            listings, _ = asyncio.run(
                list_real(devcluster.kubeconfig, [PodRef(fleet.ns, pod, c) for c in shape.containers])
            )
            assert all(not isinstance(v, SignalFailure) and v for v in listings.values()), listings


def host_traces(state_dir: Path) -> dict[str, Any]:
    """What a real node of state_dir could leave on the host."""
    lay = realnode.Layout(state_dir)
    mounts = [
        ln
        for ln in Path("/proc/self/mountinfo").read_text().splitlines()
        if str(lay.dir) in ln or str(lay.run_dir) in ln
    ]
    shims = [
        c for c in realnode._cmdlines_matching("containerd-shim-runc-v2").values() if str(lay.socket) in c
    ]
    return {
        "mounts": mounts,
        "cgroups": [str(d) for d in lay.cgroup_dirs() if d.exists()],
        "shims": shims,
        "kubelet": realnode.kubelet_running(state_dir),
    }


def test_a_second_real_node_survives_kill_9_and_down_leaves_the_host_as_it_was(
    devcluster: DevCluster, tmp_path: Path
) -> None:
    """A second devcluster beside the session's (its own real node), a real pod on it, every one
    of its processes SIGKILLed; `up` again works, and `down` leaves no mount, cgroup, shim or
    kubelet, and the sysctls as they were (the session's kubelet still holds its own)."""
    before = realnode.read_sysctls()
    second = DevCluster.up(tmp_path, addons=())
    try:
        assert second.state.real_node, second.state.real_node_error
        assert realnode.cgroup_root_name(tmp_path) != realnode.cgroup_root_name(
            Path(devcluster.state.state_dir)
        )
        images = second.state.node_images
        assert images is not None
        shape = RealShape("sleep-max-int-holder", {"main": Box(["sleep", "2147483647"])})
        second.kube.apply(deployment(shape, "default", {"workload": images.workload}))
        f = Fleet(second, "default")
        wait_for(lambda: f.running_pod(shape), 90, "a pod on the second real node")
        assert host_traces(tmp_path)["mounts"] and host_traces(tmp_path)["shims"]
        for p in second.state.processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
    except BaseException:
        second.down()  # a failure before the kill must not leave a second cluster running
        raise
    again = DevCluster.up(tmp_path, addons=())  # clears what the killed run left, starts afresh
    try:
        assert again.state.real_node, again.state.real_node_error
        f = Fleet(again, "default")
        again.kube.apply(deployment(shape, "default", {"workload": images.workload}))
        wait_for(lambda: f.running_pod(shape), 90, "the pod on the restarted real node")
    finally:
        again.down()
    assert host_traces(tmp_path) == {"mounts": [], "cgroups": [], "shims": [], "kubelet": False}
    assert realnode.read_sysctls() == before


def test_a_start_that_fails_after_the_real_node_is_up_leaves_the_host_as_it_was(
    devcluster: DevCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up` fails after its real node started (an add-on that never comes up): the error reaches
    the caller, and the real node's mounts, cgroups, shims and kubelet are gone with the rest, as
    after `down`. No state dir is left to `down` later, so nothing else would clean them."""
    before = realnode.read_sysctls()

    def an_addon_fails(self: object) -> None:
        raise RuntimeError("an add-on exited while starting")

    monkeypatch.setattr(cluster._Starter, "_wait_addons", an_addon_fails)
    with pytest.raises(RuntimeError, match="an add-on exited"):
        DevCluster.up(tmp_path, addons=())
    assert host_traces(tmp_path) == {"mounts": [], "cgroups": [], "shims": [], "kubelet": False}
    assert not realnode.Layout(tmp_path).run_dir.exists()
    assert realnode.read_sysctls() == before


def test_real_node_is_a_gpu_node_kwok_does_not_manage(devcluster: DevCluster) -> None:
    if devcluster.state.real_node is None:
        pytest.fail(f"the devcluster's real node did not start: {devcluster.state.real_node_error}")
    node = client.CoreV1Api(devcluster.kube.api_client).read_node(devcluster.state.real_node)
    assert node.status.allocatable["nvidia.com/gpu"] == node.status.capacity["nvidia.com/gpu"]
    assert node.metadata.labels["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert {t.key for t in node.spec.taints} >= {"nvidia.com/gpu", REAL_NODE_TAINT.key}
    assert "kwok.x-k8s.io/node" not in (node.metadata.annotations or {})
    # The kubelet is built from the control plane's own module and version.
    apiserver = client.VersionApi(devcluster.kube.api_client).get_code().git_version
    assert node.status.node_info.kubelet_version == apiserver
    assert node.status.node_info.container_runtime_version.startswith("containerd://")
