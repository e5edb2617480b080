"""The devcluster's Prometheus configuration: the real node's kubelet is scraped as the source the
idle-session CPU rung reads by default (controller.idleSessions.cpuSource), so a real-node session
is not held for a CPU series no scrape produces."""

from __future__ import annotations

import re
from pathlib import Path

from ghostgpu.devcluster import components
from ghostgpu.idle_policy import IdleSessionsConfig

KUBELET = components.KubeletScrape(
    port=10250, ca_file=Path("/pki/ca.crt"), cert_file=Path("/pki/c.crt"), key_file=Path("/pki/c.key")
)


def _target_labels(job: dict) -> dict[str, str]:
    """The labels every series of the job carries: its name and its targets' static labels."""
    (static,) = job["static_configs"]
    return {"job": job["job_name"], **static.get("labels", {})}


def test_kubelet_cadvisor_job_is_what_the_default_cpu_source_selects() -> None:
    cfg = components.prometheus_config(9400, kubelet=KUBELET)
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == components.KUBELET_SCRAPE_JOB]
    assert job["metrics_path"] == "/metrics/cadvisor"
    assert job["scheme"] == "https"
    # cAdvisor's own stamps (its housekeeping, every 10 s) would leave a 1 s scrape too few samples.
    assert job["honor_timestamps"] is False
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:10250"]
    assert job["tls_config"] == {
        "ca_file": "/pki/ca.crt",
        "cert_file": "/pki/c.crt",
        "key_file": "/pki/c.key",
    }
    labels = _target_labels(job)
    for name, regex in IdleSessionsConfig().cpu_source.items():
        assert re.fullmatch(regex, labels.get(name, "")), (name, regex, labels)


def test_no_kubelet_job_without_a_real_node() -> None:
    cfg = components.prometheus_config(9400)
    assert components.KUBELET_SCRAPE_JOB not in {j["job_name"] for j in cfg["scrape_configs"]}
