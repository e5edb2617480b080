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
AGENT = (
    'job="ghostgpu-agent",namespace="ghostgpu-agent",tracked_namespace="ml",tracked_uid="u",'
    'tracked_container="main"'
)


def agent(
    pod: str,
    *,
    cls: str,
    newest: str,
    running: str,
    tty: str,
    monitor: str | None = None,
    frontend: str | None = None,
) -> list[dict]:
    """The node agent's idle-session series of one pod's container (agent/idle_facts.py)."""
    out = [
        {
            "series": (
                f'ghostgpu_agent_container_newest_start_seconds{{{AGENT},tracked_pod="{pod}",class="{cls}"}}'
            ),
            "values": newest,
        },
        {"series": f'ghostgpu_agent_container_running{{{AGENT},tracked_pod="{pod}"}}', "values": running},
        {"series": f'ghostgpu_agent_container_tty_wakeups{{{AGENT},tracked_pod="{pod}"}}', "values": tty},
    ]
    for family, values in (("monitor", monitor), ("frontend", frontend)):
        if values is not None:
            out.append(
                {
                    "series": f'ghostgpu_agent_container_{family}_cpu_seconds{{{AGENT},tracked_pod="{pod}"}}',
                    "values": values,
                }
            )
    return out


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
        CFG.metrics.agent_source,
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
        # The agent: nb-0 a kernel started at minute 1, nothing running, no terminal, a watch
        # using 0.05 s a minute; nb-1 a terminal into which someone typed at minute 25.
        *agent(
            "nb-0",
            cls="notebook",
            newest="60x45",
            running="0x45",
            tty="0x45",
            monitor="0+0.05x45",
            frontend="0+0.02x45",
        ),
        *agent("nb-1", cls="terminal", newest="60x45", running="0x45", tty="10x25 14x20"),
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
    assert (nb0["newest_start"], nb0["running"], nb0["tty_changes"]) == (60.0, 0.0, 0.0)
    assert nb0["monitor_cpu"] == pytest.approx(0.5)
    assert nb0["frontend_cpu"] == pytest.approx(0.2)  # the front-end server's own, read apart
    assert "frontend_cpu" not in nb1 and "monitor_cpu" not in nb1  # none runs: nothing discounted
    assert nb0["class_notebook"] == 1.0 and nb1["class_terminal"] == 1.0
    assert nb1["tty_changes"] == 1.0  # the keystrokes at minute 25


def test_the_ladder_on_prometheus_answers(tmp_path: Path) -> None:
    """From the series through Prometheus's engine to the ladder: the idle kernel beside a watch
    is idle since its work ended; a terminal someone typed into is active; a pod nobody reports
    on fails its rungs."""
    from ghostgpu.idle_sessions import climb

    series = (
        [
            {"series": f'DCGM_FI_DEV_GPU_UTIL{{{GPU},pod="{p}",gpu="0"}}', "values": "50x5 0x40"}
            for p in ("a", "b")
        ]
        + [
            {"series": f'DCGM_FI_DEV_FB_USED{{{GPU},pod="{p}",gpu="0"}}', "values": "4000x45"}
            for p in ("a", "b")
        ]
        + [
            {
                "series": f'container_cpu_usage_seconds_total{{{KUBELET},pod="{p}",container="main"}}',
                "values": "0+0.5x45",
            }
            for p in ("a", "b")
        ]
    )
    series += agent("a", cls="notebook", newest="60x45", running="0x45", tty="0x45", monitor="0+0.4x45")
    series += agent("b", cls="terminal", newest="60x45", running="0x45", tty="10x25 14x20")
    now = 1800.0  # promtool's clock starts at 0: minute 30
    got = evaluate(query([("ml", "a"), ("ml", "b"), ("ml", "c")]), series, "30m", tmp_path)
    hist = {k: PodHistory(v) for k, v in got.items()}
    policy = CFG.idle_sessions.for_team(None).model_copy(update={"after_s": 600.0})
    ladders = {}
    for pod in ("a", "b", "c"):
        wh = workload_history([("ml", pod)], hist)
        ev = wh.evidence(window_s=600, expected_samples=10, lookback_s=3600, now=now)
        ladders[pod] = (wh.session_class, climb(ev, policy, now=now, zero_threshold=0.0))
    cls, ladder = ladders["a"]
    # 0.5 s a minute of CPU, of which 0.4 s is the watch: 0.0017 cores of work.
    assert cls is not None and cls.value == "notebook"
    assert ladder.outcome == "idle", ladder.findings
    assert ladder.idle_since == 300.0  # minute 5, when the GPU was last busy
    cls, ladder = ladders["b"]
    assert cls is not None and cls.value == "terminal"
    assert ladder.outcome == "active" and "terminal" in ladder.keeps()
    cls, ladder = ladders["c"]
    assert cls is None and ladder.outcome == "unknown"


def test_a_pod_without_an_answer_fails_the_workload() -> None:
    hist = {
        ("ml", "a"): PodHistory(
            {"util_max": 0.0, "util_count": 20.0, "cpu": 1.0, "last_busy": 5.0, "class_notebook": 1.0}
        )
    }
    w = workload_history([("ml", "a"), ("ml", "b")], hist)
    assert isinstance(w.gpu_util_max, SignalFailure)  # pod b was not read: it may be the one at work
    assert isinstance(w.cpu_seconds, SignalFailure)
    assert w.last_busy_at == 5.0
    assert w.session_class is None  # pod b tells no class


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
    assert isinstance(w.newest_start, SignalFailure)  # no agent series: the process rungs fail
