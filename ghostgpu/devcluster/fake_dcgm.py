"""A fake NVIDIA dcgm-exporter: serves DCGM_FI_DEV_GPU_UTIL, DCGM_FI_DEV_FB_USED and
DCGM_FI_DEV_XID_ERRORS in Prometheus text format with dcgm-exporter's own label names
(gpu, UUID, device, modelName, Hostname, container, namespace, pod), values set by the test.

It also serves the node agent's series (`ghostgpu agent`, docs/agent.md) for any
pod, on their own path, scraped as their own target: the controller's agent mode is tested against
the series the agent exports, set by the test (the agent itself is tested on the real node).

HTTP API (127.0.0.1 only):
  GET  /metrics            the exposition Prometheus scrapes
  GET  /agent/metrics      the node agent's series (503 while the agent target is down)
  POST /set    {"namespace", "pod", "container", "node", "gpu": 0, "model": "...",
                "values": {"DCGM_FI_DEV_GPU_UTIL": 0, ...},
                "dra": null | {"claim", "claim_namespace", "driver", "pool", "device",
                               "mig_profile", "mig_device_uuid"}}
                                                               upsert one GPU's series
  POST /agent  {"namespace", "pod", "uid", "container", "roles": {"work": 1, ...},
                "programs": [...], "scan_timestamp": null | unix time, "unseen": null | reason}
                                                               upsert one container's agent series
                                                               (scan_timestamp null: the time of
                                                               each scrape, as a live agent)
  POST /agent/down {"down": true}                              the agent target fails its scrapes
  POST /remove {"namespace", "pod"}                            drop every series of that pod
  POST /clear                                                  drop everything

A GPU allocated through DRA: give `dra` (FakeDcgmClient.set(..., dra=DraLabels(claim=..., pool=...,
device=...))) and its series carry the labels dcgm-exporter >= 4.3.1-4.4.0 with
`--kubernetes-enable-dra` adds (internal/pkg/transformation/kubernetes.go): `dra_claim_name`,
`dra_claim_namespace` (defaults to the pod's namespace), `dra_driver_name` (defaults to
`gpu.nvidia.com`, the only driver dcgm-exporter maps), `dra_pool_name`, `dra_device_name`, and for a
MIG device `dra_mig_profile` and `dra_mig_device_uuid` (both given, or neither). dcgm-exporter prints
a series' pod attributes in sorted order after its fixed labels, so they come out as container,
dra_claim_name, dra_claim_namespace, dra_device_name, dra_driver_name, [dra_mig_device_uuid,
dra_mig_profile,] dra_pool_name, namespace, pod; a DRA series has no pod_uid. Like dcgm-exporter,
one series per GPU and container: a device two containers name is two calls, one per container,
with the same `gpu` and `dra`. A later /set of that GPU without `dra` keeps its DRA labels (to
change them, /remove the pod first). A MIG device's series is its parent GPU's (dcgm-exporter
labels the parent GPU's series with the MIG device), so give the parent's `gpu`. (The fake's fixed
labels are those listed above; dcgm-exporter also prints pci_bus_id, which no query here reads.)

Run: python -m ghostgpu.devcluster.fake_dcgm --port N
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ghostgpu.agent.exporter import live_roles, role_series
from ghostgpu.quiet_http import QuietHTTPServer
from ghostgpu.verdict import ProcessCounts

METRICS: dict[str, tuple[str, str]] = {
    # name: (type, help) as dcgm-exporter's default counters file declares them
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
}


class DraLabels(BaseModel):
    """A DRA device's labels on its GPU series, as dcgm-exporter sets them (see the module)."""

    model_config = ConfigDict(extra="forbid")

    claim: str
    claim_namespace: str | None = None  # None: the pod's namespace
    driver: str = "gpu.nvidia.com"
    pool: str
    device: str
    mig_profile: str | None = None
    mig_device_uuid: str | None = None

    @model_validator(mode="after")
    def _mig_both_or_neither(self) -> DraLabels:
        if (self.mig_profile is None) != (self.mig_device_uuid is None):
            raise ValueError("dra: give mig_profile and mig_device_uuid together (a MIG device) or neither")
        return self

    def pairs(self, namespace: str) -> list[tuple[str, str]]:
        """Its labels in dcgm-exporter's (sorted) order, without container/namespace/pod."""
        mig = (
            [("dra_mig_device_uuid", self.mig_device_uuid), ("dra_mig_profile", self.mig_profile)]
            if self.mig_profile is not None and self.mig_device_uuid is not None
            else []
        )
        return [
            ("dra_claim_name", self.claim),
            ("dra_claim_namespace", self.claim_namespace or namespace),
            ("dra_device_name", self.device),
            ("dra_driver_name", self.driver),
            *mig,
            ("dra_pool_name", self.pool),
        ]


class GpuSample(BaseModel):
    namespace: str
    pod: str
    container: str = "main"
    node: str = "gpu-h100-0"
    gpu: int = Field(default=0, ge=0)
    model: str = "NVIDIA H100 80GB HBM3"
    values: dict[str, float] = Field(default_factory=dict)
    dra: DraLabels | None = None  # a GPU allocated through DRA (see the module)

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
            *(self.dra.pairs(self.namespace) if self.dra is not None else []),
            ("namespace", self.namespace),
            ("pod", self.pod),
        ]
        return ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)


AGENT_ROLES = ("work", "wrapper", "holder", "timer", "session", "defunct")
AGENT_METRICS: dict[str, tuple[str, str]] = {
    "ghostgpu_agent_container_processes": ("gauge", "Processes of a tracked GPU container, by role."),
    "ghostgpu_agent_container_scan_timestamp_seconds": ("gauge", "Unix time of the container's scan."),
    "ghostgpu_agent_container_unseen": ("gauge", "A tracked container the agent cannot see, by reason."),
}


class AgentContainer(BaseModel):
    """One container as the node agent reports it."""

    namespace: str
    pod: str
    uid: str = ""
    container: str = "main"
    roles: dict[str, int] = Field(default_factory=lambda: {"work": 1})
    programs: list[str] = Field(default_factory=list)
    scan_timestamp: float | None = None  # None: the time of each scrape (a live agent)
    unseen: str | None = None

    def key(self) -> tuple[str, str, str]:
        return (self.namespace, self.pod, self.container)

    def lines(self, now: float) -> dict[str, list[str]]:
        base = ",".join(
            f'{k}="{_escape(v)}"'
            for k, v in (
                ("tracked_namespace", self.namespace),
                ("tracked_pod", self.pod),
                ("tracked_uid", self.uid),
                ("tracked_container", self.container),
            )
        )
        out: dict[str, list[str]] = {name: [] for name in AGENT_METRICS}
        if self.unseen is not None:
            out["ghostgpu_agent_container_unseen"].append(
                f'ghostgpu_agent_container_unseen{{{base},reason="{_escape(self.unseen)}"}} 1'
            )
            return out
        # The agent's own contract (agent/exporter.role_series): the roles with processes, the
        # live ones naming the programs; no series for a role means none beside a fresh scan time.
        counts = ProcessCounts(**self.roles, programs=tuple(self.programs))
        for role, n, programs in role_series(counts):
            labels = f'{base},role="{role}",programs="{_escape(programs)}"'
            out["ghostgpu_agent_container_processes"].append(
                f"ghostgpu_agent_container_processes{{{labels}}} {n}"
            )
        ts = now if self.scan_timestamp is None else self.scan_timestamp
        stamp = f'{base},live_roles="{live_roles(counts)}"'
        out["ghostgpu_agent_container_scan_timestamp_seconds"].append(
            f"ghostgpu_agent_container_scan_timestamp_seconds{{{stamp}}} {ts:.3f}"
        )
        return out


def _escape(v: str) -> str:
    return v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Store:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._samples: dict[tuple[str, str, str, int], GpuSample] = {}
        self._agent: dict[tuple[str, str, str], AgentContainer] = {}
        self.agent_down = False

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
            # A GPU stays a DRA device across updates that do not name `dra` (set only the values).
            dra = s.dra if s.dra is not None or old is None else old.dra
            self._samples[s.key()] = s.model_copy(update={"values": merged, "dra": dra})

    def set_agent(self, c: AgentContainer) -> None:
        unknown = set(c.roles) - set(AGENT_ROLES)
        if unknown:
            raise ValueError(f"unknown role(s) {sorted(unknown)}; expected some of {list(AGENT_ROLES)}")
        with self._lock:
            self._agent[c.key()] = c

    def remove(self, namespace: str, pod: str) -> int:
        with self._lock:
            keys = [k for k in self._samples if k[0] == namespace and k[1] == pod]
            for k in keys:
                del self._samples[k]
            agent = [k for k in self._agent if k[0] == namespace and k[1] == pod]
            for a in agent:
                del self._agent[a]
            return len(keys) + len(agent)

    def clear(self) -> None:
        with self._lock:
            self._samples.clear()
            self._agent.clear()
            self.agent_down = False

    def agent_exposition(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        with self._lock:
            containers = [self._agent[k] for k in sorted(self._agent)]
        lines: dict[str, list[str]] = {name: [] for name in AGENT_METRICS}
        for c in containers:
            for name, more in c.lines(now).items():
                lines[name] += more
        out: list[str] = []
        for name, (typ, help_) in AGENT_METRICS.items():
            out += [f"# HELP {name} {help_}", f"# TYPE {name} {typ}", *lines[name]]
        return "\n".join(out) + "\n"

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
        elif self.path.split("?")[0] == "/agent/metrics":
            if self.store.agent_down:
                self._reply(503, "agent down", "text/plain")
            else:
                self._reply(200, self.store.agent_exposition(), "text/plain; version=0.0.4")
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
            elif self.path == "/agent":
                self.store.set_agent(AgentContainer.model_validate(body))
                self._reply(200, '{"ok":true}')
            elif self.path == "/agent/down":
                self.store.agent_down = bool(body.get("down", True))
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


def make_server(port: int, store: Store | None = None) -> QuietHTTPServer:
    handler = type("Handler", (_Handler,), {"store": store or Store()})
    return QuietHTTPServer(("127.0.0.1", port), handler)


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
        dra: DraLabels | None = None,
    ) -> None:
        """Upsert one GPU's series of `pod`; `dra`: the GPU is a DRA device of one of its claims."""
        values = {
            k: v
            for k, v in (
                ("DCGM_FI_DEV_GPU_UTIL", util),
                ("DCGM_FI_DEV_FB_USED", fb_used_mib),
                ("DCGM_FI_DEV_XID_ERRORS", xid),
            )
            if v is not None
        }
        body: dict[str, object] = {
            "namespace": namespace,
            "pod": pod,
            "container": container,
            "node": node,
            "gpu": gpu,
        }
        if dra is not None:
            body["dra"] = dra.model_dump()
        r = httpx.post(f"{self.url}/set", json={**body, "values": values}, timeout=5)
        r.raise_for_status()

    def agent(
        self,
        namespace: str,
        pod: str,
        *,
        uid: str = "",
        container: str = "main",
        roles: dict[str, int] | None = None,
        programs: list[str] | None = None,
        scan_timestamp: float | None = None,
        unseen: str | None = None,
    ) -> None:
        """What the node agent reports for one container (replaces what it reported before)."""
        body = AgentContainer(
            namespace=namespace,
            pod=pod,
            uid=uid,
            container=container,
            roles=roles if roles is not None else {"work": 1},
            programs=programs or [],
            scan_timestamp=scan_timestamp,
            unseen=unseen,
        )
        httpx.post(f"{self.url}/agent", json=body.model_dump(), timeout=5).raise_for_status()

    def agent_down(self, down: bool = True) -> None:
        httpx.post(f"{self.url}/agent/down", json={"down": down}, timeout=5).raise_for_status()

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
