"""End to end, in the devcluster's real Prometheus: a tenant's exporter, scraped as the
prometheus-community chart's `kubernetes-pods` job scrapes annotated pods (honor_labels), serves a
busy victim's exact series at 0 (docs/threat-model.md). In turn: the exporter's own label set
(Prometheus adds the tenant target's job and instance), the whole stored label set of the real
series (job and instance too) at scrape time, and the same with timestamps 30 s ahead (Prometheus
then drops the real samples as out of order). The victim, busy all along, is never reclaimable,
and `ghostgpu doctor` fails its "one producer per signal" row.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client
from test_controller import LEASE_NS, REPO, Controller, controller_config, deployment, opt_in, wait_for

from ghostgpu.devcluster import DevCluster, FakeDcgmClient
from ghostgpu.devcluster.components import AGENT_NAMESPACE, AGENT_SCRAPE_JOB
from ghostgpu.quiet_http import QuietHTTPServer

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(600)]

ROW = "prometheus: one producer per signal"
RECLAIMABLE = {"FINISHED_IDLE", "ZOMBIE_CRASHED"}
_LINE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>.*)\} (?P<value>\S+)$")


class Forger:
    """The tenant's exporter: the victim's series read from the real exporters' /metrics, every
    value set to what an idle pod would show, under `mode`: "own" (the exporter's label set),
    "exact" (also the real series' job and instance), "ahead" (exact, timestamps 30 s ahead)."""

    def __init__(self, dcgm_url: str, ns: str, pod: str) -> None:
        self.dcgm_url, self.ns, self.pod = dcgm_url, ns, pod
        self.instance = dcgm_url.removeprefix("http://")
        self.mode = "own"
        forger = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a: object) -> None:
                pass

            def do_GET(self) -> None:
                data = forger.body().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        # The victim's series are read from the real exporters in the background, so a scrape is
        # answered at once: reading them per scrape outlasted the 1 s scrape timeout on a loaded
        # machine, and a forger whose scrapes fail writes too few samples to be counted.
        self.victim: list[tuple[str, str, bool]] = self._read_victim()
        self._stop = threading.Event()
        threading.Thread(target=self._keep_reading, daemon=True).start()
        self.server = QuietHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.port = self.server.server_address[1]

    def _read_victim(self) -> list[tuple[str, str, bool]]:
        """(name, labels, whether the agent's) of each of the victim's series the exporters serve."""
        rows: list[tuple[str, str, bool]] = []
        for path, agent in (("/metrics", False), ("/agent/metrics", True)):
            for line in httpx.get(self.dcgm_url + path, timeout=5).text.splitlines():
                m = _LINE.match(line)
                mine = f'pod="{self.pod}"' if not agent else f'tracked_pod="{self.pod}"'
                if m and mine in m["labels"]:
                    rows.append((m["name"], m["labels"], agent))
        return rows

    def _keep_reading(self) -> None:
        while not self._stop.wait(0.5):
            with contextlib.suppress(httpx.HTTPError):
                self.victim = self._read_victim()

    def body(self) -> str:
        now = time.time()
        stamp = f" {int((now + 30) * 1000)}" if self.mode == "ahead" else ""
        out: list[str] = []
        for name, labels, agent in self.victim:
            value = "0"
            if name == "ghostgpu_agent_container_processes":
                value = "1" if 'role="holder"' in labels else "0"
            elif name == "ghostgpu_agent_container_scan_timestamp_seconds":
                value = f"{now:.3f}"
            elif name == "ghostgpu_agent_container_program":
                continue  # a holder runs no program worth naming
            if self.mode != "own":
                job = AGENT_SCRAPE_JOB if agent else "dcgm-exporter"
                extra = f'job="{job}",instance="{self.instance}"'
                if agent:
                    extra += f',namespace="{AGENT_NAMESPACE}"'
                labels = f"{extra},{labels}"
            out.append(f"{name}{{{labels}}} {value}{stamp}")
        return "\n".join(out) + "\n"

    def close(self) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def forger(devcluster: DevCluster) -> Iterator[Callable[[str, str], Forger]]:
    made: list[Forger] = []

    def make(ns: str, pod: str) -> Forger:
        f = Forger(devcluster.state.dcgm_url, ns, pod)
        made.append(f)
        return f

    yield make
    devcluster.unscrape("forger")
    for f in made:
        f.close()


def doctor(devcluster: DevCluster, config: Path) -> dict[str, Any]:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "ghostgpu.cli",
            "doctor",
            "-c",
            str(config),
            "--kubeconfig",
            str(devcluster.kubeconfig),
            "--json",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=180,
    )
    assert out.returncode in (0, 1), out.stderr
    return {r["check"]: r for r in json.loads(out.stdout)}[ROW]


def test_a_tenants_exporter_writing_the_victims_series_never_makes_it_reclaimable(
    devcluster: DevCluster,
    make_namespace: Callable[..., str],
    dcgm: FakeDcgmClient,
    prometheus_url: str,
    forger: Callable[[str, str], Forger],
    tmp_path: Path,
) -> None:
    kube = devcluster.kube
    core, apps = client.CoreV1Api(kube.api_client), client.AppsV1Api(kube.api_client)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASE_NS}})
    ns, tenant = make_namespace({}, prefix="victim"), make_namespace({}, prefix="tenant")
    kube.apply(deployment("busy", ns))
    kube.apply(deployment("done", ns))  # the honest twin: idle, reclaimed, so the path works

    def running(name: str) -> Any:
        pods = core.list_namespaced_pod(ns, label_selector=f"app={name}").items
        live = [p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp]
        return live[0] if len(live) == 1 else None

    victim = wait_for(lambda: running("busy"), 90, "the victim running")
    done = wait_for(lambda: running("done"), 90, "the idle twin running")
    dcgm.set(ns, victim.metadata.name, util=90.0, fb_used_mib=8192)
    dcgm.agent(
        namespace=ns, pod=victim.metadata.name, uid=victim.metadata.uid, roles={"work": 1, "wrapper": 1}
    )
    dcgm.set(ns, done.metadata.name, util=0.0, fb_used_mib=0)
    dcgm.agent(namespace=ns, pod=done.metadata.name, uid=done.metadata.uid, roles={"wrapper": 1, "holder": 1})
    opt_in(devcluster, ns)
    config = controller_config(tmp_path, prometheus_url, "enforce", process_source="agent")

    def annotations(name: str) -> dict[str, str]:
        return apps.read_namespaced_deployment(name, ns).metadata.annotations or {}

    def replicas(name: str) -> int:
        return int(apps.read_namespaced_deployment(name, ns).spec.replicas)

    fake = forger(ns, victim.metadata.name)
    devcluster.scrape_pod("forger", fake.port, tenant, "forger-0")
    seen: list[tuple[str, str | None]] = []

    def watch(mode: str, polls: int) -> None:
        deadline = time.monotonic() + 150
        start = ctrl.polls()
        while ctrl.polls() < start + polls and time.monotonic() < deadline:
            verdict = annotations("busy").get("ghostgpu.io/verdict")
            seen.append((mode, verdict))
            assert verdict not in RECLAIMABLE and replicas("busy") == 1, (mode, verdict, annotations("busy"))
            time.sleep(0.5)
        assert ctrl.polls() >= start + polls, f"{mode}: the controller polled {ctrl.polls() - start} times"

    ctrl = Controller(devcluster.kubeconfig, config, tmp_path, "forged")
    try:
        wait_for(lambda: replicas("done") == 0, 120, "the honest idle twin reclaimed")
        for mode, found in (
            ("own", "'kubernetes-pods'"),  # another job: not the source
            ("exact", "more samples than the target had scrapes"),  # interleaved in one series
            ("ahead", "out-of-order"),  # the real samples dropped
        ):
            fake.mode = mode
            # Ahead: the forger's samples reach the query's time only 30 s on, and then they are
            # all the series holds (an unpinned instant read would see an idle pod from there on).
            watch(mode, 25 if mode == "ahead" else 8)
            if mode == "ahead":
                # the controller finds the forger's samples ahead of its clock: UNKNOWN, not idle
                wait_for(lambda: annotations("busy").get("ghostgpu.io/verdict") == "UNKNOWN", 60, "UNKNOWN")
                assert "untrusted" in annotations("busy").get("ghostgpu.io/evidence", ""), annotations("busy")
            row = wait_for(lambda found=found: (r := doctor(devcluster, config))["status"] == "fail"
                           and found in r["found"] and r, 60, f"doctor's row on {mode}")  # fmt: skip
            assert "honor_labels" in row["fix"]
        assert replicas("busy") == 1
        assert not [s for s in seen if s[1] in RECLAIMABLE]
    finally:
        ctrl.stop()
        dcgm.remove(ns, victim.metadata.name)
        dcgm.remove(ns, done.metadata.name)
