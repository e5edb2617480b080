"""The metrics source of the scale bench: an exporter that serves dcgm-exporter's series for N
GPU pods (DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_XID_ERRORS with dcgm-exporter's
label names), and the real Prometheus scraping it.

Why not the devcluster's fake dcgm-exporter: it is driven one series per HTTP call and re-renders
its exposition on every scrape; at 10,000 pods the set-up and the exporter's own CPU would
dominate the shared 2-core machine. Here the exposition is rendered once per fleet change.

Run: python -m ghostgpu.scale.exporter --port N --fleet FILE   (FILE: JSON [[ns, pod, node, util]])
     POST /reload re-reads FILE.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import yaml

from ghostgpu.devcluster import procs
from ghostgpu.devcluster.paths import Toolchain

MODEL = "NVIDIA H100 80GB HBM3"


def exposition(rows: list[list[Any]]) -> bytes:
    util, fb, xid = [], [], []
    for k, (ns, pod, node, value) in enumerate(rows):
        gpu = k % 8
        digest = hashlib.sha256(f"{node}/{gpu}".encode()).hexdigest()
        uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        labels = (
            f'gpu="{gpu}",UUID="{uuid}",device="nvidia{gpu}",modelName="{MODEL}",Hostname="{node}",'
            f'container="main",namespace="{ns}",pod="{pod}"'
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


class _Handler(BaseHTTPRequestHandler):
    fleet: ClassVar[Path]
    lock: ClassVar[threading.Lock]
    body: ClassVar[list[bytes]]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _reply(self, code: int, data: bytes, ctype: str = "text/plain; version=0.0.4") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.startswith("/metrics"):
            with self.lock:
                data = self.body[0]
            self._reply(200, data)
        else:
            self._reply(200 if self.path == "/healthz" else 404, b"ok\n")

    def do_POST(self) -> None:
        if self.path == "/reload":
            data = exposition(json.loads(self.fleet.read_text()))
            with self.lock:
                self.body[0] = data
            self._reply(200, b'{"ok":true}', "application/json")
        else:
            self._reply(404, b"not found\n")


def serve(port: int, fleet: Path) -> None:
    body = [exposition(json.loads(fleet.read_text())) if fleet.exists() else b""]
    handler = type("Handler", (_Handler,), {"fleet": fleet, "lock": threading.Lock(), "body": body})
    ThreadingHTTPServer(("127.0.0.1", port), handler).serve_forever()


def prometheus_config(exporter_port: int, scrape_interval: str) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": "dcgm-exporter",
                "honor_labels": True,
                "scrape_interval": scrape_interval,
                "scrape_timeout": scrape_interval,
                "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}],
            }
        ],
    }


def start_metrics(
    state: Path, fleet_file: Path, *, scrape_interval: str = "5s"
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
    cfg = state / "prometheus.yml"
    cfg.write_text(yaml.safe_dump(prometheus_config(eport, scrape_interval), sort_keys=True))
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
    args = ap.parse_args()
    serve(args.port, args.fleet)


if __name__ == "__main__":
    main()
