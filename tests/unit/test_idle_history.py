"""The idle-session history query (ghostgpu/signals/idle_history.py): evaluated by Prometheus's own
engine (`promtool test rules`) over series written here, and the fold of a workload's pods."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from ghostgpu.config import load_default_config
from ghostgpu.signals.idle_history import PodHistory, history_query, parse_history, workload_history
from ghostgpu.verdict import SignalFailure

CFG = load_default_config().controller
KUBELET = 'job="kubelet",metrics_path="/metrics/cadvisor",namespace="ml"'
GPU = 'job="dcgm-exporter",namespace="ml"'


def evaluate(query: str, series: list[dict[str, str]], at: str, tmp: Path) -> dict[tuple[str, str], dict]:
    """Prometheus's answer to `query` at `at` over `series` (one sample a minute), per pod."""
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool (Debian's prometheus package) is not installed")
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "promql_expr_test": [{"expr": query, "eval_time": at, "exp_samples": []}],
            }
        ],
    }
    path = tmp / "history.yaml"
    path.write_text(yaml.safe_dump(test))
    out = subprocess.run([promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr  # promtool reports a failed expectation on stderr
    got = text[text.index("got:") :] if "got:" in text else ""
    rows = []
    for labels, value in re.findall(r"\{([^}]*)\} ([-+0-9.eE]+)", got):
        rows.append((dict(re.findall(r'(\w+)="([^"]*)"', labels)), float(value)))
    parsed = parse_history(rows, "namespace", "pod")
    return {k: v.values for k, v in parsed.items()}


def query(pods: list[tuple[str, str]]) -> str:
    return history_query(
        CFG.metrics.dcgm,
        CFG.idle_sessions.cpu_source,
        pods,
        window_s=600,
        lookback_s=3600,
        step_s=60,
        zero_threshold=0.0,
    )


def test_history_of_an_idle_kernel_and_a_silent_computation(tmp_path: Path) -> None:
    series = [
        # nb-0: busy for the first 5 minutes, idle since; flat memory; 0.001 cores.
        {"series": f'DCGM_FI_DEV_GPU_UTIL{{{GPU},pod="nb-0",gpu="0"}}', "values": "50x5 0x40"},
        {"series": f'DCGM_FI_DEV_FB_USED{{{GPU},pod="nb-0",gpu="0"}}', "values": "4000x45"},
        {
            "series": f'container_cpu_usage_seconds_total{{{KUBELET},pod="nb-0",container="main"}}',
            "values": "0+0.06x45",
        },
        # The pod's own cgroup total (container="") is not summed again.
        {
            "series": f'container_cpu_usage_seconds_total{{{KUBELET},pod="nb-0",container=""}}',
            "values": "0+100x45",
        },
        # Another scrape's series with the same name and pod labels is not read.
        {
            "series": 'DCGM_FI_DEV_GPU_UTIL{job="forger",namespace="ml",pod="nb-0",gpu="0"}',
            "values": "0x45",
        },
        {
            "series": 'DCGM_FI_DEV_GPU_UTIL{job="forger",namespace="ml",pod="nb-1",gpu="0"}',
            "values": "99x45",
        },
        # nb-1: GPU idle throughout, but a CPU computation that prints nothing (one core).
        {"series": f'DCGM_FI_DEV_GPU_UTIL{{{GPU},pod="nb-1",gpu="0"}}', "values": "0x45"},
        {"series": f'DCGM_FI_DEV_FB_USED{{{GPU},pod="nb-1",gpu="0"}}', "values": "100+100x45"},
        {
            "series": f'container_cpu_usage_seconds_total{{{KUBELET},pod="nb-1",container="main"}}',
            "values": "0+60x45",
        },
    ]
    got = evaluate(query([("ml", "nb-0"), ("ml", "nb-1")]), series, "30m", tmp_path)
    nb0, nb1 = got[("ml", "nb-0")], got[("ml", "nb-1")]
    assert nb0["util_max"] == 0.0
    assert nb0["util_count"] >= 10  # Prometheus 2 counts both ends of the range, 3 the right one
    assert nb0["fb_min"] == nb0["fb_max"] == 4000 * 1048576
    assert nb0["cpu"] == pytest.approx(0.6)
    assert nb0["last_busy"] == 300.0  # minute 5: when the work ended, whenever the controller started
    assert nb1["util_max"] == 0.0  # the forger's 99 % is not this pod's
    assert "last_busy" not in nb1  # not busy within the lookback
    assert nb1["cpu"] == pytest.approx(600.0)  # a core for the whole window: the CPU rung keeps it
    assert nb1["fb_max"] - nb1["fb_min"] == 1000 * 1048576  # memory growing


def test_a_pod_without_an_answer_fails_the_workload() -> None:
    hist = {("ml", "a"): PodHistory({"util_max": 0.0, "util_count": 20.0, "cpu": 1.0, "last_busy": 5.0})}
    w = workload_history([("ml", "a"), ("ml", "b")], hist)
    assert isinstance(w.gpu_util_max, SignalFailure)  # pod b was not read: it may be the one at work
    assert isinstance(w.cpu_seconds, SignalFailure)
    assert w.last_busy_at == 5.0


def test_the_workload_takes_the_busiest_pod_and_the_fewest_samples() -> None:
    full = {"util_count": 20.0, "cpu_count": 20.0, "fb_min": 1.0, "fb_max": 2.0, "cpu": 1.0}
    hist = {
        ("ml", "a"): PodHistory({**full, "util_max": 0.0}),
        ("ml", "b"): PodHistory({**full, "util_max": 7.0, "util_count": 3.0, "cpu": 2.0}),
    }
    w = workload_history([("ml", "a"), ("ml", "b")], hist)
    assert (w.gpu_util_max, w.gpu_samples, w.cpu_seconds) == (7.0, 3, 3.0)
    assert (w.memory_min_bytes, w.memory_max_bytes) == (2.0, 4.0)
    assert w.last_busy_at is None
