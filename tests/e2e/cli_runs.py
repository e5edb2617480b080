"""The `ghostgpu` command as a user runs it: the real CLI in a subprocess against the devcluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Protocol

REPO = Path(__file__).resolve().parents[2]


class Cluster(Protocol):
    """A devcluster or a kind cluster: what the CLI is pointed at."""

    @property
    def kubeconfig(self) -> Path: ...


def run_cli(dc: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`ghostgpu ARGS... --kubeconfig <the cluster's>`; the caller reads the exit code."""
    argv = [sys.executable, "-m", "ghostgpu.cli", *args, "--kubeconfig", str(dc.kubeconfig)]
    return subprocess.run(argv, capture_output=True, text=True, cwd=REPO, check=False)


def restore(dc: Cluster, target: str, ns: str) -> subprocess.CompletedProcess[str]:
    """`ghostgpu restore TARGET -n NS` (TARGET: kind/name)."""
    return run_cli(dc, "restore", target, "-n", ns)
