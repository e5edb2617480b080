"""Node agent benchmark: CPU per scan and RSS of `ghostgpu agent`'s scan on a node of real processes.

    sudo python benchmarks/bench_agent_scan.py [--pods 110] [--per-pod 5] [--gpu-pods 56]
        [--extra 0,1000,10000] [--scans 20] [--json out.json] [--python VENV/bin/python]

Builds a node's worth of real containers on this machine without a kubelet: for each pod, a
cgroup `<own cgroup>/ghostgpu-agent-bench-*/kubepods/burstable/pod<uid>/<container id>` (the v1
memory hierarchy on a hybrid host, the unified one on cgroup v2) holding a real pid namespace
(`unshare --pid --fork`) of `--per-pod` processes (a shell and its sleeps), plus a sandbox cgroup
with a `sleep` as its pause. `--gpu-pods` of them are pod objects asking for a GPU (the kubelet's
default maxPods 110; 56 = 8 GPUs x 7 MIG slices), the rest CPU pods the agent must skip. For each
`--extra` count, that many more host processes (in one more, untracked pod's cgroup) make the
node busier: the agent reads every pid's cgroup file, and only the tracked ones' other files.

The scans run in a fresh interpreter that imports the agent as `ghostgpu agent` does, so its RSS
is the agent's: CPU (user+sys) per scan (scan_node + publishing + one /metrics rendering, the
work of one 15 s interval), the share of a core at a 15 s interval, and the peak RSS.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# The node's processes hold no pipe of ours (a caller reading our output would wait on them).
QUIET: dict[str, Any] = {
    "stdin": subprocess.DEVNULL,
    "stdout": subprocess.DEVNULL,
    "stderr": subprocess.DEVNULL,
}


def own_cgroup_dir() -> Path:
    """Where this process may make child cgroups: below its own, in the v1 memory hierarchy on a
    hybrid host, or in the unified hierarchy on cgroup v2."""
    unified = (Path("/sys/fs/cgroup") / "cgroup.controllers").exists()
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if unified and controllers == "":
            return Path("/sys/fs/cgroup") / path.lstrip("/")
        if not unified and controllers == "memory":
            return Path("/sys/fs/cgroup/memory") / path.lstrip("/")
    raise SystemExit("no writable cgroup hierarchy found")


def start_container(leaf: Path, processes: int) -> subprocess.Popen[bytes]:
    """A real pid namespace of `processes` processes (sh + sleeps) in the cgroup `leaf`."""
    leaf.mkdir(parents=True)
    sleeps = " ".join(["sleep 1000000 &"] * (processes - 1))
    script = f"echo 0 > {leaf}/cgroup.procs; {sleeps} " + ("wait" if processes > 1 else "exec sleep 1000000")
    return subprocess.Popen(["unshare", "--pid", "--fork", "sh", "-c", script], **QUIET)


def start_many(leaf: Path, count: int) -> subprocess.Popen[bytes]:
    leaf.mkdir(parents=True)
    loop = f"i=0; while [ $i -lt {count} ]; do sleep 1000000 & i=$((i+1)); done; wait"
    script = f"echo 0 > {leaf}/cgroup.procs; {loop}"
    return subprocess.Popen(["sh", "-c", script], **QUIET)


def wait_count(leaf: Path, n: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len((leaf / "cgroup.procs").read_text().split()) < n:
        if time.monotonic() > deadline:
            raise SystemExit(f"{leaf}: {len((leaf / 'cgroup.procs').read_text().split())} of {n} processes")
        time.sleep(0.1)


def pod_object(i: int, uid: str, cid: str, gpu: bool) -> dict[str, Any]:
    res = {"limits": {"nvidia.com/mig-1g.10gb": "1"}} if gpu else {"requests": {"cpu": "100m"}}
    return {
        "metadata": {"namespace": "bench", "name": f"pod-{i}", "uid": uid},
        "spec": {"nodeName": "bench-node", "containers": [{"name": "main", "resources": res}]},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {"name": "main", "containerID": f"containerd://{cid}", "state": {"running": {}}}
            ],
        },
    }


def kill_tree(top: Path) -> None:
    for procs in top.rglob("cgroup.procs"):
        for pid in procs.read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)
    deadline = time.monotonic() + 30
    for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        while (d / "cgroup.procs").read_text().split() and time.monotonic() < deadline:
            time.sleep(0.05)
        d.rmdir()
    top.rmdir()


MEASURE = """
import json, resource, sys, time
from pathlib import Path
from prometheus_client import generate_latest
import ghostgpu.agent.command  # everything `ghostgpu agent` imports (kr8s, the controller's server)
import ghostgpu.controller.app  # its config loader (load_any_config)
from ghostgpu.agent.exporter import AgentExporter
from ghostgpu.agent.scan import ScanResult, scan_node
from ghostgpu.config import ControllerConfig
from ghostgpu.controller.inventory import gpu_predicate

pods = json.loads(Path(sys.argv[1]).read_text())
scans = int(sys.argv[2])
policy = ControllerConfig().processes.policy()
is_gpu = gpu_predicate()
exporter = AgentExporter("bench-node")
cpu, wall, pids, tracked, body = [], [], 0, 0, 0
for i in range(scans + 1):
    c0, t0 = time.process_time(), time.perf_counter()
    r = scan_node(pods, Path("/proc"), policy, is_gpu, now=time.time())
    exporter.publish(ScanResult(r.timestamp, r.containers, r.scanned_pids, time.perf_counter() - t0))
    text = generate_latest(exporter.registry)
    body = len(text)
    if i:  # the first scan warms the caches (imports, regexes): a steady interval is the rest
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - t0)
    pids, tracked = r.scanned_pids, len(r.containers)
    seen = sum(1 for v in r.containers.values() if hasattr(v, "counts"))
# what Prometheus stores of the last scan: the per-container series (no zero-valued role series)
series = sum(1 for line in text.decode().splitlines() if line.startswith("ghostgpu_agent_container_"))
print(json.dumps({
    "cpu_per_scan_ms": 1000 * sorted(cpu)[len(cpu) // 2],
    "wall_per_scan_ms": 1000 * sorted(wall)[len(wall) // 2],
    "scanned_pids": pids, "tracked": tracked, "seen": seen, "metrics_bytes": body,
    "container_series": series, "series_per_container": round(series / tracked, 3) if tracked else None,
    "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
}))
"""


def measure(pods: list[dict[str, Any]], scans: int, tmp: Path, python: str) -> dict[str, Any]:
    path = tmp / "pods.json"
    path.write_text(json.dumps(pods))
    out = subprocess.run(
        [python, "-c", MEASURE, str(path), str(scans)],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return dict(json.loads(out.stdout))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=110)
    ap.add_argument("--per-pod", type=int, default=5)
    ap.add_argument("--gpu-pods", type=int, default=56)
    ap.add_argument("--extra", default="0,1000,10000", help="more host processes, comma-separated counts")
    ap.add_argument("--scans", type=int, default=20)
    ap.add_argument("--interval", type=float, default=15.0, help="seconds between scans (the core share)")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument(
        "--python",
        default=sys.executable,
        help="the interpreter the scans run in: a virtualenv with only the runtime dependencies "
        "(pip install . without extras) measures the RSS the image's agent has; a development one "
        "also loads what the test extras add to its imports",
    )
    a = ap.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root: it makes cgroups and moves processes into them")
    top = own_cgroup_dir() / f"ghostgpu-agent-bench-{uuid.uuid4().hex[:8]}"
    kube = top / "kubepods" / "burstable"
    tmp = Path(f"/tmp/{top.name}")
    tmp.mkdir()
    pods: list[dict[str, Any]] = []
    results: list[dict[str, Any]] = []
    try:
        t0 = time.monotonic()
        for i in range(a.pods):
            uid, cid, sandbox = str(uuid.uuid4()), uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
            start_container(kube / f"pod{uid}" / sandbox, 1)  # the pause
            start_container(kube / f"pod{uid}" / cid, a.per_pod)
            pods.append(pod_object(i, uid, cid, gpu=i < a.gpu_pods))
        for d in (d for d in kube.iterdir() if d.is_dir()):
            for leaf in (x for x in d.iterdir() if x.is_dir()):
                wait_count(leaf, 1)
        for p in pods:
            cid = p["status"]["containerStatuses"][0]["containerID"].split("//")[1]
            wait_count(kube / f"pod{p['metadata']['uid']}" / cid, a.per_pod)
        print(f"{a.pods} pods x {a.per_pod} processes (+ a pause each) in {time.monotonic() - t0:.1f}s")
        extra_leaf = kube / f"pod{uuid.uuid4()}" / (uuid.uuid4().hex * 2)
        have = 0
        for extra in sorted(int(x) for x in a.extra.split(",")):
            if extra > have:
                start_many(
                    extra_leaf if not have else extra_leaf.parent / (uuid.uuid4().hex * 2), extra - have
                )
                have = extra
                want = sum(
                    len((d / "cgroup.procs").read_text().split())
                    for d in extra_leaf.parent.iterdir()
                    if d.is_dir()
                )
                deadline = time.monotonic() + 300
                while want < extra and time.monotonic() < deadline:
                    time.sleep(0.2)
                    want = sum(
                        len((d / "cgroup.procs").read_text().split())
                        for d in extra_leaf.parent.iterdir()
                        if d.is_dir()
                    )
            r = measure(pods, a.scans, tmp, a.python)
            r.update(extra_processes=extra, core_share_pct=100 * r["cpu_per_scan_ms"] / 1000 / a.interval)
            results.append(r)
            print(json.dumps(r))
    finally:
        kill_tree(top)
        for f in tmp.iterdir():
            f.unlink()
        tmp.rmdir()
    if a.json:
        a.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
