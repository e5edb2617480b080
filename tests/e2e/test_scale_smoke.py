"""The scale bench at small N, in CI: the structural targets that hold at any N.
The N = 10,000 figures come from `ghostgpu bench scale` (docs/scale.md), not from a test.

Runs the real bench machinery on its own small control plane (etcd, kube-apiserver, kwok, no
add-ons; a Prometheus scraping an exporter of dcgm's and the node agent's series): the unchanged
controller in a subprocess in agent mode, then in exec mode, then the naive cron baseline, at two
fleet sizes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ghostgpu.devcluster.paths import Toolchain
from ghostgpu.scale.bench import BenchConfig, run_scale
from ghostgpu.scale.report import markdown, targets

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(900)]


def _missing() -> list[str]:
    try:
        t = Toolchain.locate()
    except FileNotFoundError as exc:
        return [str(exc)]
    needed = ("etcd", "kube_apiserver", "kube_controller_manager", "kube_scheduler", "kwok", "prometheus")
    return t.missing(*needed)


@pytest.mark.skipif(bool(_missing()), reason="devcluster binaries not built (run hack/testbin)")
def test_small_fleet_costs_one_query_per_poll_and_exec_only_in_exec_mode_for_idle(tmp_path: Path) -> None:
    cfg = BenchConfig(
        sizes=(40, 120),
        nodes=16,
        idle_fraction=0.1,
        window=3,
        steady_polls=2,
        naive_polls=1,
        naive_sample=1000,
        state_dir=tmp_path,
    )
    results = run_scale(cfg, log=print)
    print(markdown(results))
    small, large = results
    assert (small.n, large.n) == (40, 120)
    assert (small.idle, large.idle) == (4, 12)
    # ONE Prometheus query per poll whatever N; the baseline needs one per pod
    assert small.ghostgpu.prometheus_queries == large.ghostgpu.prometheus_queries == 1
    assert (small.naive.prometheus_queries, large.naive.prometheus_queries) == (40, 120)
    # agent mode: the processes signal rides on the one query, no exec; exec mode execs only into
    # the utilization-idle candidates; the baseline execs into every pod
    assert (small.ghostgpu.exec_calls, large.ghostgpu.exec_calls) == (0, 0)
    assert small.exec_mode is not None and large.exec_mode is not None
    assert (small.exec_mode.exec_calls, large.exec_mode.exec_calls) == (4, 12)
    assert small.exec_mode.prometheus_queries == large.exec_mode.prometheus_queries == 1
    assert (small.naive.exec_calls, large.naive.exec_calls) == (40, 120)
    # apart from exec, a steady poll's apiserver traffic does not grow with N (watches, no polling:
    # the ClusterQueue list and lease renewals only)
    for r in results:
        assert r.ghostgpu.apiserver_requests <= 5, r.ghostgpu
        assert r.exec_mode is not None and r.exec_mode.apiserver_requests - r.exec_mode.exec_calls <= 5
    # server side agrees with the client-side count: Prometheus's own counter saw one query a poll
    for r in results:
        assert r.server_side["controller_prometheus_queries_total"] == r.server_side["controller_polls"]
        assert r.server_side["controller_exec_total"] == 0
    # the verdicts are right in both modes: the idle pods are FINISHED_IDLE, the rest ACTIVE
    assert large.states == large.exec_states == {"ACTIVE": 108, "FINISHED_IDLE": 12}
    met = {name: ok for name, ok, _ in targets(results)}
    for target in (
        "Prometheus queries per poll constant in N",
        "agent mode: no exec",
        "agent mode: steady apiserver requests per poll <= 5 + writes",
        "agent mode and exec mode reach the same verdicts",
        "exec mode: exec calls only for utilization-idle candidates",
    ):
        assert met[target], target
