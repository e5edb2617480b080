"""The metrics source of the scale bench: an exporter that serves dcgm-exporter's series for N
GPU pods (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_XID_ERRORS with dcgm-exporter's
label names) and the node agent's series for each pod's GPU container (`ghostgpu agent`: the scan's
timestamp, the roles with processes and the programs that keep it alive), and the real Prometheus
scraping it.

The agent's series are what the node agent's collector (ghostgpu/agent/exporter.py) prints for the
same processes: an idle pod's container holds only `sleep infinity` (fleet.IDLE_TABLE), a busy one a
shell and its training program (fleet.BUSY_TABLE), both counted by the verdict's own `count_roles`.
Their scan timestamp is the time of the scrape, as a running agent's would be.

Why not the devcluster's fake dcgm-exporter: it is driven one series per HTTP call and re-renders
its exposition on every scrape; at 10,000 pods the set-up and the exporter's own CPU would
dominate the shared 2-core machine. Here the exposition is rendered once per fleet change.

With idle sessions (`bench scale --idle-sessions`, sessions.py), a row's sixth field marks an idle
Jupyter session: its agent series are the session's processes (fleet.SESSION_TABLE) and the
agent's idle-session facts, and /cadvisor/metrics serves cAdvisor's CPU counter of every pod.

Run: python -m ghostgpu.scale.exporter --port N --fleet FILE
     (FILE: JSON [[ns, pod, node, util, uid, session (optional, 0 or 1)]])
     POST /reload re-reads FILE.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import threading
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import yaml

from ghostgpu.agent.exporter import live_roles, role_series
from ghostgpu.devcluster import procs
from ghostgpu.devcluster.paths import Toolchain
from ghostgpu.quiet_http import QuietHTTPServer
from ghostgpu.scale import sessions
from ghostgpu.scale.fleet import BUSY_TABLE, IDLE_TABLE, SESSION_TABLE
from ghostgpu.signals.agent import PROCESSES_METRIC, PROGRAMS_LABEL, SCAN_METRIC
from ghostgpu.signals.processes import parse_ps
from ghostgpu.verdict import ProcessPolicy, count_roles

MODEL = "NVIDIA H100 80GB HBM3"
CONTAINER = "main"  # fleet.pod_body's one container


def exposition(rows: list[list[Any]]) -> bytes:
    util, fb, xid = [], [], []
    for k, (ns, pod, node, value, *_uid) in enumerate(rows):
        gpu = k % 8
        digest = hashlib.sha256(f"{node}/{gpu}".encode()).hexdigest()
        uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        labels = (
            f'gpu="{gpu}",UUID="{uuid}",device="nvidia{gpu}",modelName="{MODEL}",Hostname="{node}",'
            f'container="{CONTAINER}",namespace="{ns}",pod="{pod}"'
        )
        util.append(f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {value:g}")
        fb.append(f"DCGM_FI_DEV_FB_USED{{{labels}}} {4096 if value else 0}")
        xid.append(f"DCGM_FI_DEV_XID_ERRORS{{{labels}}} 0")
    out = [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge",
        *util,
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB).",
        "# TYPE DCGM_FI_DEV_FB_USED gauge",
        *fb,
        "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.",
        "# TYPE DCGM_FI_DEV_XID_ERRORS gauge",
        *xid,
    ]
    return ("\n".join(out) + "\n").encode()


def _agent_labels(row: list[Any]) -> str:
    ns, pod, _node, _value, uid = row[:5]
    return f'tracked_namespace="{ns}",tracked_pod="{pod}",tracked_uid="{uid}",tracked_container="{CONTAINER}"'


def _is_session(row: list[Any]) -> bool:
    return len(row) > 5 and bool(row[5])


def _table(row: list[Any]) -> str:
    """The processes of a row's container: an idle session's, an idle holder's or a busy job's."""
    if _is_session(row):
        return SESSION_TABLE
    return IDLE_TABLE if row[3] == 0 else BUSY_TABLE


def agent_exposition(rows: list[list[Any]], loaded_at: float = 0.0) -> bytes:
    """The node agents' per-container series for every pod, but the scan timestamps (`agent_scans`):
    the roles with processes, the live ones naming the programs that keep it alive, as the agent's
    collector prints them for the same rows (`role_series`); for an idle session, the agent's
    idle-session facts too, as its collector prints them for a scan at `loaded_at` (the youngest
    process's start time, which a later scan prints the same)."""
    policy = ProcessPolicy()
    series_of = {
        t: role_series(count_roles(parse_ps(t), policy)) for t in (IDLE_TABLE, BUSY_TABLE, SESSION_TABLE)
    }
    session = sessions.session_facts()
    procs_lines: list[str] = []
    facts: list[dict[str, str]] = []
    for row in rows:
        labels = _agent_labels(row)
        procs_lines += [
            f'{PROCESSES_METRIC}{{{labels},role="{r}",{PROGRAMS_LABEL}="{p}"}} {n}'
            for r, n, p in series_of[_table(row)]
        ]
        if _is_session(row):
            facts.append(sessions.facts_lines(labels, session, loaded_at))
    out = [f"# TYPE {PROCESSES_METRIC} gauge", *procs_lines, *sessions.facts_exposition(facts)]
    return ("\n".join(out) + "\n").encode()


def agent_scans(rows: list[list[Any]], now: float) -> bytes:
    """Every container's scan timestamp, `now`: rendered at scrape time, as fresh as a running agent's."""
    stamp = f"{now:.3f}"
    policy = ProcessPolicy()
    live = {t: live_roles(count_roles(parse_ps(t), policy)) for t in (IDLE_TABLE, BUSY_TABLE, SESSION_TABLE)}
    lines = [f"# TYPE {SCAN_METRIC} gauge"]
    lines += [
        f'{SCAN_METRIC}{{{_agent_labels(row)},live_roles="{live[_table(row)]}"}} {stamp}' for row in rows
    ]
    return ("\n".join(lines) + "\n").encode()


class _Body:
    """The exposition of the current fleet: the GPU series, and the agents' (a target of their own,
    /agent/metrics, as the agent's pods are): their static part rendered once per fleet change, and
    their scan timestamps rendered again when a scrape finds them over a second old."""

    def __init__(self, rows: list[list[Any]], agent: bool) -> None:
        self.loaded_at = time.time()
        self.all_rows = rows
        self.rows = rows if agent else []
        self.static = exposition(rows)
        self.agent = agent_exposition(rows, self.loaded_at) if agent else b""
        self._scans = b""
        self._scans_at = 0.0

    def render_cadvisor(self) -> bytes:
        """cAdvisor's CPU counters as of now (sessions.py); scraped only with --idle-sessions."""
        return sessions.cadvisor_exposition(self.all_rows, self.loaded_at, time.time())

    def render(self) -> bytes:
        return self.static

    def render_agent(self) -> bytes:
        if not self.rows:
            return self.agent
        now = time.time()
        if now - self._scans_at >= 1.0:
            self._scans, self._scans_at = agent_scans(self.rows, now), now
        return self.agent + self._scans


class _Handler(BaseHTTPRequestHandler):
    fleet: ClassVar[Path]
    agent: ClassVar[bool]
    lock: ClassVar[threading.Lock]
    body: ClassVar[list[_Body]]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _reply(self, code: int, data: bytes, ctype: str = "text/plain; version=0.0.4") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.startswith("/agent/metrics"):
            with self.lock:
                data = self.body[0].render_agent()
            self._reply(200, data)
        elif self.path.startswith(sessions.CADVISOR_PATH):
            with self.lock:
                body = self.body[0]
            self._reply(200, body.render_cadvisor())
        elif self.path.startswith("/metrics"):
            with self.lock:
                data = self.body[0].render()
            self._reply(200, data)
        else:
            self._reply(200 if self.path == "/healthz" else 404, b"ok\n")

    def do_POST(self) -> None:
        if self.path == "/reload":
            data = _Body(json.loads(self.fleet.read_text()), self.agent)
            with self.lock:
                self.body[0] = data
            self._reply(200, b'{"ok":true}', "application/json")
        else:
            self._reply(404, b"not found\n")


def serve(port: int, fleet: Path, *, agent: bool = True) -> None:
    body = [_Body(json.loads(fleet.read_text()) if fleet.exists() else [], agent)]
    attrs = {"fleet": fleet, "agent": agent, "lock": threading.Lock(), "body": body}
    handler = type("Handler", (_Handler,), attrs)
    QuietHTTPServer(("127.0.0.1", port), handler).serve_forever()


def prometheus_config(exporter_port: int, scrape_interval: str, *, cadvisor: bool = False) -> dict[str, Any]:
    """The bench's scrapes: the GPU series, the agents' and, for idle sessions, the kubelet's
    cAdvisor (the CPU rung's source; left out otherwise, so the head series of the runs without
    idle sessions stay comparable)."""
    doc: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": "dcgm-exporter",
                "honor_labels": True,
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
            },
            {
                # The agents' series, scraped as the bundle's ServiceMonitor does: no honor_labels,
                # the target's job and namespace (the controller's metrics.agentSource).
                "job_name": "ghostgpu-agent",
                "metrics_path": "/agent/metrics",
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{exporter_port}"], "labels": {"namespace": "ghostgpu-agent"}}
                ],
            },
        ],
    }
    if cadvisor:
        doc["scrape_configs"].append(sessions.cadvisor_scrape(exporter_port, scrape_interval))
    return doc


SCRAPE_INTERVAL = "5s"


def start_metrics(
    state: Path, fleet_file: Path, *, scrape_interval: str = SCRAPE_INTERVAL, cadvisor: bool = False
) -> tuple[list[procs.ProcessRecord], str, str]:
    """Start the exporter and a Prometheus scraping it. Returns (processes, exporter URL, Prom URL)."""
    import sys

    logs = state / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    eport, pport = procs.free_port(), procs.free_port()
    exp = procs.start(
        "scale-exporter",
        [sys.executable, "-m", "ghostgpu.scale.exporter", f"--port={eport}", f"--fleet={fleet_file}"],
        logs,
    )
    # A fresh TSDB: a re-run in the same state dir within Prometheus's lookback would otherwise
    # read the last run's series beside this one's (the same pods under other uids: UNKNOWN).
    shutil.rmtree(state / "prometheus", ignore_errors=True)
    cfg = state / "prometheus.yml"
    cfg.write_text(
        yaml.safe_dump(prometheus_config(eport, scrape_interval, cadvisor=cadvisor), sort_keys=True)
    )
    prom = procs.start(
        "scale-prometheus",
        [
            str(Toolchain.locate().prometheus),
            f"--config.file={cfg}",
            f"--storage.tsdb.path={state / 'prometheus'}",
            f"--web.listen-address=127.0.0.1:{pport}",
            "--storage.tsdb.retention.time=2h",
            "--log.level=warn",
        ],
        logs,
    )
    return [exp, prom], f"http://127.0.0.1:{eport}", f"http://127.0.0.1:{pport}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--fleet", type=Path, required=True)
    ap.add_argument("--no-agent", action="store_true", help="serve dcgm-exporter's series only")
    args = ap.parse_args()
    serve(args.port, args.fleet, agent=not args.no_agent)


if __name__ == "__main__":
    main()
