"""A fake NVIDIA dcgm-exporter: serves DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED and
DCGM_FI_DEV_XID_ERRORS in Prometheus text format with dcgm-exporter's own label names
(gpu, UUID, device, modelName, Hostname, container, namespace, pod), values set by the test.

HTTP API (127.0.0.1 only):
  GET  /metrics            the exposition Prometheus scrapes
  POST /set    {"namespace", "pod", "container", "node", "gpu": 0, "model": "...",
                "values": {"DCGM_FI_DEV_GPU_UTIL": 0, ...}}   upsert one GPU's series
  POST /remove {"namespace", "pod"}                            drop every series of that pod
  POST /clear                                                  drop everything
Run: python -m ghostgpu.devcluster.fake_dcgm --port N
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import httpx
from pydantic import BaseModel, Field, ValidationError

METRICS: dict[str, tuple[str, str]] = {
    # name: (type, help) as dcgm-exporter's default counters file declares them
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
}


class GpuSample(BaseModel):
    namespace: str
    pod: str
    container: str = "main"
    node: str = "gpu-h100-0"
    gpu: int = Field(default=0, ge=0)
    model: str = "NVIDIA H100 80GB HBM3"
    values: dict[str, float] = Field(default_factory=dict)

    def key(self) -> tuple[str, str, str, int]:
        return (self.namespace, self.pod, self.container, self.gpu)

    def labels(self) -> str:
        # Deterministic per (node, gpu), shaped like a real GPU UUID.
        digest = hashlib.sha256(f"{self.node}/{self.gpu}".encode()).hexdigest()
        uuid = f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
        pairs = [
            ("gpu", str(self.gpu)),
            ("UUID", uuid),
            ("device", f"nvidia{self.gpu}"),
            ("modelName", self.model),
            ("Hostname", self.node),
            ("container", self.container),
            ("namespace", self.namespace),
            ("pod", self.pod),
        ]
        return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Store:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[tuple[str, str, str, int], GpuSample] = {}

    def set(self, s: GpuSample) -> None:
        unknown = set(s.values) - set(METRICS)
        if unknown:
            raise ValueError(f"unknown metric(s) {sorted(unknown)}; expected some of {sorted(METRICS)}")
        with self._lock:
            old = self._samples.get(s.key())
            # dcgm-exporter reports every field of a GPU it watches: a new GPU series starts with
            # an empty framebuffer unless the caller says otherwise.
            base = old.values if old else {"DCGM_FI_DEV_FB_USED": 0.0}
            merged = {**base, **s.values}
            self._samples[s.key()] = s.model_copy(update={"values": merged})

    def remove(self, namespace: str, pod: str) -> int:
        with self._lock:
            keys = [k for k in self._samples if k[0] == namespace and k[1] == pod]
            for k in keys:
                del self._samples[k]
            return len(keys)

    def clear(self) -> None:
        with self._lock:
            self._samples.clear()

    def exposition(self) -> str:
        with self._lock:
            samples = [self._samples[k] for k in sorted(self._samples)]
        out: list[str] = []
        for name, (typ, help_) in METRICS.items():
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {typ}"]
            for s in samples:
                if name in s.values:
                    v = s.values[name]
                    out.append(f"{name}{{{s.labels()}}} {int(v) if float(v).is_integer() else v}")
        return "\n".join(out) + "\n"


class _Handler(BaseHTTPRequestHandler):
    store: ClassVar[Store]

    def log_message(self, format: str, *args: object) -> None:  # keep the log quiet
        pass

    def _reply(self, code: int, body: str, ctype: str = "application/json") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.split("?")[0] == "/metrics":
            self._reply(200, self.store.exposition(), "text/plain; version=0.0.4")
        elif self.path == "/healthz":
            self._reply(200, "ok", "text/plain")
        else:
            self._reply(404, '{"error":"not found"}')

    def do_POST(self) -> None:
        try:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            if self.path == "/set":
                self.store.set(GpuSample.model_validate(body))
                self._reply(200, '{"ok":true}')
            elif self.path == "/remove":
                n = self.store.remove(str(body["namespace"]), str(body["pod"]))
                self._reply(200, json.dumps({"removed": n}))
            elif self.path == "/clear":
                self.store.clear()
                self._reply(200, '{"ok":true}')
            else:
                self._reply(404, '{"error":"not found"}')
        except (ValueError, KeyError, ValidationError) as e:
            self._reply(400, json.dumps({"error": str(e)}))


def make_server(port: int, store: Store | None = None) -> ThreadingHTTPServer:
    handler = type("Handler", (_Handler,), {"store": store or Store()})
    return ThreadingHTTPServer(("127.0.0.1", port), handler)


class FakeDcgmClient:
    """What a test uses to drive the exporter of a running devcluster."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def set(
        self,
        namespace: str,
        pod: str,
        *,
        util: float | None = None,
        fb_used_mib: float | None = None,
        xid: float | None = None,
        container: str = "main",
        node: str = "gpu-h100-0",
        gpu: int = 0,
    ) -> None:
        values = {
            k: v
            for k, v in (
                ("DCGM_FI_DEV_GPU_UTIL", util),
                ("DCGM_FI_DEV_FB_USED", fb_used_mib),
                ("DCGM_FI_DEV_XID_ERRORS", xid),
            )
            if v is not None
        }
        body = {"namespace": namespace, "pod": pod, "container": container, "node": node, "gpu": gpu}
        r = httpx.post(f"{self.url}/set", json={**body, "values": values}, timeout=5)
        r.raise_for_status()

    def remove(self, namespace: str, pod: str) -> None:
        httpx.post(
            f"{self.url}/remove", json={"namespace": namespace, "pod": pod}, timeout=5
        ).raise_for_status()

    def clear(self) -> None:
        httpx.post(f"{self.url}/clear", timeout=5).raise_for_status()

    def metrics(self) -> str:
        r = httpx.get(f"{self.url}/metrics", timeout=5)
        r.raise_for_status()
        return r.text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    args = ap.parse_args()
    make_server(args.port).serve_forever()


if __name__ == "__main__":
    main()
