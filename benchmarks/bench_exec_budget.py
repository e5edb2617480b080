"""Exec benchmark: CPU per process listing, through the apiserver budget, on the devcluster.

    ghostgpu devcluster up
    python benchmarks/bench_exec_budget.py [--execs 200] [--qps 20] [--batches 1,8] [--free] [--compiled]

Creates (once) N bare kwok pods answering `ps` with an idle table (the scale bench's fleet, see
ghostgpu/scale/fleet.py), then lists their processes the way a steady poll does: the controller's
`KubeExec` (one TCP + TLS connection per exec), 8 at a time, each waiting on a `RequestBudget` of
`--qps` (burst 30, spent first). Prints the process CPU per exec for each batch size of the budget
(how many waiters it releases at once once the bucket is empty); `--free` adds a run without a
budget. Why it matters: at 50,000 pods a steady poll makes 500 execs, and the budget spreads them
over 25 s; a process woken 20 times a second for one exec each pays more CPU per exec than one
woken 2.5 times a second for 8. On a 2-core VM: 4.30 ms one at a time, 2.30 ms in eights, 1.95 ms
with no budget at all (the same execs back to back).

`--compiled` runs the same execs, paced the same way, from a compiled client as well
(benchmarks/exec_floor, Go, built from the Go module proxy into ~/.cache/ghostgpu/bench): what any
client of the apiserver's exec pays on this machine, against what the controller pays in Python.
`--state-dir` points at another cluster of the devcluster's layout (the scale bench's:
/tmp/ghostgpu-scale/cluster, with its 50,000-pod fleet running).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import time
from pathlib import Path

import kr8s.asyncio
import yaml

from ghostgpu.controller.budget import BudgetedExec, RequestBudget
from ghostgpu.devcluster.cluster import default_state_dir
from ghostgpu.scale.fleet import FleetSpec, KubeHTTP, ensure_base, grow_pods, running_pods
from ghostgpu.signals.podexec import KubeExec, PodExec, PodRef, _exec_query
from ghostgpu.signals.processes import PS_ARGV

CONCURRENCY = 8  # the controller's exec concurrency (app.py: ExecProcessSource)
COMPILED_SRC = Path(__file__).resolve().parent / "exec_floor"


async def ensure_fleet(cluster: Path, n: int) -> FleetSpec:
    spec = FleetSpec(nodes=max(1, -(-n // 8)), idle_fraction=1.0)
    server = yaml.safe_load((cluster / "kubeconfig").read_text())["clusters"][0]["cluster"]["server"]
    kube = KubeHTTP(server, cluster / "pki")
    try:
        if await running_pods(kube) < n:
            await ensure_base(kube, spec, cluster / "bench-exec-table.txt")
            await grow_pods(kube, spec, 0, n)
    finally:
        await kube.aclose()
    return spec


async def cpu_per_exec(executor: PodExec, pods: list[PodRef]) -> tuple[float, float, int]:
    """(CPU ms per exec, wall s, failures) for listing every pod once, CONCURRENCY at a time."""
    sem = asyncio.Semaphore(CONCURRENCY)
    failures = 0

    async def one(pod: PodRef) -> None:
        nonlocal failures
        async with sem:
            try:
                await executor.run(pod, PS_ARGV, timeout=10)
            except Exception:
                failures += 1

    t0, c0 = time.perf_counter(), os.times()
    await asyncio.gather(*(one(p) for p in pods))
    t1, c1 = time.perf_counter(), os.times()
    cpu = (c1.user - c0.user) + (c1.system - c0.system)
    return 1000 * cpu / len(pods), t1 - t0, failures


def build_compiled() -> Path:
    out = Path.home() / ".cache" / "ghostgpu" / "bench" / "exec-floor"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["go", "build", "-o", str(out), "."], cwd=COMPILED_SRC, check=True)
    return out


def compiled_per_exec(binary: Path, cluster: Path, pods: list[PodRef], *, qps: float, batch: int) -> dict:
    """The compiled client's result (JSON) for the same pods, `qps` 0 meaning back to back."""
    kubeconfig = yaml.safe_load((cluster / "kubeconfig").read_text())
    server = kubeconfig["clusters"][0]["cluster"]
    user = kubeconfig["users"][0]["user"]
    argv = [
        str(binary),
        f"-server={server['server']}",
        f"-ca={server['certificate-authority']}",
        f"-cert={user['client-certificate']}",
        f"-key={user['client-key']}",
        f"-query={_exec_query(PS_ARGV, 'main')}",  # the controller's own exec, argv and all
        f"-concurrency={CONCURRENCY}",
        f"-qps={qps}",
        f"-batch={batch}",
    ]
    stdin = "".join(f"{p.namespace}/{p.name}\n" for p in pods)
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=True)
    return json.loads(done.stdout)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--execs", type=int, default=200)
    ap.add_argument("--qps", type=float, default=20.0)
    ap.add_argument("--batches", default="1,8", help="comma-separated batch sizes of the budget")
    ap.add_argument("--free", action="store_true", help="also measure without a budget")
    ap.add_argument("--compiled", action="store_true", help="also run the execs from a compiled client (Go)")
    ap.add_argument("--state-dir", type=Path, default=None, help="the cluster's state directory")
    args = ap.parse_args()
    cluster = args.state_dir or default_state_dir()
    spec = await ensure_fleet(cluster, args.execs)
    api = await kr8s.asyncio.api(kubeconfig=str(cluster / "kubeconfig"))
    pods = [PodRef(spec.namespace(i), spec.pod(i), "main") for i in range(args.execs)]
    plain = KubeExec(api)
    await plain.run(pods[0], PS_ARGV, timeout=10)  # connect once: imports, TLS context
    runs: list[tuple[str, PodExec]] = [("no budget", plain)] if args.free else []
    for batch in (int(b) for b in args.batches.split(",")):
        budget = RequestBudget(args.qps, 30, batch=batch)
        for _ in range(30):
            await budget.acquire()  # spend the burst: the steady state is the bucket's rate
        runs.append((f"{args.qps:g} qps, batches of {batch}", BudgetedExec(KubeExec(api), budget)))
    binary = build_compiled() if args.compiled else None
    print(f"{args.execs} execs, {CONCURRENCY} at a time (process CPU per exec, user + system):")
    for name, executor in runs:
        ms, wall, failed = await cpu_per_exec(executor, pods)
        print(f"  {name:>28}: {ms:5.2f} ms/exec  wall {wall:6.2f} s  failed {failed}")
        if binary is not None:
            budget = executor.budget if isinstance(executor, BudgetedExec) else None
            qps, batch = (budget.qps, budget.batch) if budget else (0.0, CONCURRENCY)  # 0: back to back
            r = compiled_per_exec(binary, cluster, pods, qps=qps, batch=batch)
            print(
                f"  {'compiled (Go), same pacing':>28}: {r['cpu_ms_per_exec']:5.2f} ms/exec  "
                f"wall {r['wall_s']:6.2f} s  failed {r['failed']}  "
                f"(user {r['user_ms_per_exec']:.2f}, system {r['sys_ms_per_exec']:.2f}; "
                f"resumed {r['resumed']} of {r['execs']})"
            )


if __name__ == "__main__":
    asyncio.run(main())
