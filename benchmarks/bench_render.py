"""Render benchmark: a cluster file with 50 teams and 500 statically listed namespaces.

    python benchmarks/bench_render.py [--teams 50] [--namespaces 500] [--runs 5]

Prints the best-of-N wall time for parsing+validating the YAML, rendering in memory, and
rendering to a temporary directory (fresh directory each run, so every file is written).
The target is < 2 s for the whole render (50 teams, 500 namespaces): render runs in CI and pre-commit hooks.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from ghostgpu.config import load_config_text
from ghostgpu.render import render_bundles, write_bundles

FLAVORS = [
    ("h100", "nvidia.com/gpu", "NVIDIA-H100-80GB-HBM3"),
    ("a100", "nvidia.com/gpu", "NVIDIA-A100-SXM4-80GB"),
    ("mig-1g-10gb", "nvidia.com/mig-1g.10gb", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"),
    ("mig-3g-40gb", "nvidia.com/mig-3g.40gb", "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb"),
]


def make_config(teams: int, namespaces: int, cohorts: int = 5) -> str:
    """A large but realistic ghostgpu.yaml as text (so YAML parsing is part of the measurement)."""
    doc = {
        "apiVersion": "ghostgpu.io/v1alpha1",
        "kind": "GhostgpuConfig",
        "flavors": [
            {
                "name": name,
                "resource": resource,
                "nodeLabels": {"nvidia.com/gpu.product": product},
                "nodeTaints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}],
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            }
            for name, resource, product in FLAVORS
        ],
        "cohorts": [{"name": f"pool-{i}", "fairSharing": {"weight": "1"}} for i in range(cohorts)],
        "priorityClasses": [
            {"name": "production", "value": 1000},
            {"name": "batch", "value": 100},
            {"name": "preemptible", "value": 10},
        ],
        "teams": [
            {
                "name": f"team-{i:02d}",
                "cohort": f"pool-{i % cohorts}",
                "quota": {
                    "h100": {"nominalQuota": 8, "borrowingLimit": 8, "lendingLimit": 4},
                    "a100": {"nominalQuota": 4, "borrowingLimit": 4},
                    "mig-1g-10gb": 14,
                    "mig-3g-40gb": {"nominalQuota": 4, "lendingLimit": 2},
                },
                "preemption": {
                    "reclaimWithinCohort": "Any",
                    "withinClusterQueue": "LowerPriority",
                    "borrowWithinCohort": {"policy": "Never"},
                },
                "fairSharing": {"weight": str(1 + i % 3)},
                "namespaceQuota": {"h100": 4, "mig-1g-10gb": 7},
            }
            for i in range(teams)
        ],
        "namespaces": [{"name": f"ns-{i:04d}", "team": f"team-{i % teams:02d}"} for i in range(namespaces)],
    }
    return yaml.safe_dump(doc, sort_keys=False)


def best_of(runs: int, fn: Callable[[], object]) -> float:
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--teams", type=int, default=50)
    parser.add_argument("--namespaces", type=int, default=500)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)

    text = make_config(args.teams, args.namespaces)
    cfg = load_config_text(text, "bench.yaml")
    files = render_bundles(cfg)
    n_objects = sum(1 for body in files.values() for d in yaml.safe_load_all(body) if d)
    size = sum(len(body) for body in files.values())

    def to_disk() -> None:
        with tempfile.TemporaryDirectory() as tmp:
            write_bundles(render_bundles(load_config_text(text, "bench.yaml")), Path(tmp))

    t_load = best_of(args.runs, lambda: load_config_text(text, "bench.yaml"))
    t_render = best_of(args.runs, lambda: render_bundles(cfg))
    t_total = best_of(args.runs, lambda: render_bundles(load_config_text(text, "bench.yaml")))
    t_disk = best_of(args.runs, to_disk)

    print(f"config: {args.teams} teams, {args.namespaces} static namespaces, {len(FLAVORS)} flavors")
    print(f"output: {len(files)} files, {n_objects} objects, {size / 1024:.0f} KiB")
    print(f"best of {args.runs} runs:")
    print(f"  parse + validate ghostgpu.yaml   {t_load * 1000:8.1f} ms")
    print(f"  render in memory                 {t_render * 1000:8.1f} ms")
    print(f"  parse + validate + render        {t_total * 1000:8.1f} ms")
    print(f"  parse + validate + render + write {t_disk * 1000:7.1f} ms")
    target = 2.0
    verdict = "OK" if t_disk < target else "TOO SLOW"
    print(f"target < {target:.0f} s for the whole render to disk: {verdict}")
    return 0 if t_disk < target else 1


if __name__ == "__main__":
    sys.exit(main())
