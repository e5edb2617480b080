"""VictoriaMetrics' single-node server as the metrics store instead of Prometheus (the devcluster's
`metrics_store="victoriametrics"`, the scale bench's `--backend victoriametrics`).

It scrapes with its own Prometheus-compatible scraper (`-promscrape.config`) from the same scrape
configuration the devcluster writes for Prometheus, less the two fields its strict parser refuses:
`global.evaluation_interval` (it evaluates no rules) and `file_sd_configs[].refresh_interval` (one
flag, -promscrape.fileSDCheckInterval, sets how often every file is re-read). It serves the
Prometheus query API (`/api/v1/query`, `/-/ready`) on the same port, so the controller points at
it through `controller.prometheus.url` unchanged (docs/victoriametrics.md)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

PROMETHEUS = "prometheus"
VICTORIAMETRICS = "victoriametrics"
METRICS_STORES = (PROMETHEUS, VICTORIAMETRICS)

# The devcluster's file_sd targets are picked up within about a second, as with Prometheus.
FILE_SD_CHECK_INTERVAL = "1s"


def scrape_config(prometheus_config: dict[str, Any]) -> dict[str, Any]:
    """A Prometheus scrape configuration as VictoriaMetrics' strict parser takes it (a copy)."""
    cfg = copy.deepcopy(prometheus_config)
    cfg.get("global", {}).pop("evaluation_interval", None)
    for job in cfg.get("scrape_configs", []):
        for sd in job.get("file_sd_configs", []):
            sd.pop("refresh_interval", None)
    return cfg


def argv(
    binary: Path, config: Path, data_dir: Path, port: int, *extra: str, retention: str = "1d"
) -> list[str]:
    """The command line of a single-node server that scrapes `config` and listens on 127.0.0.1:port.

    Nothing here makes its query answers look like Prometheus's: the controller's client handles
    the differences itself (ghostgpu.signals.prometheus), so the tests see what a user's
    VictoriaMetrics with default flags answers."""
    return [
        str(binary),
        f"-promscrape.config={config}",
        f"-promscrape.fileSDCheckInterval={FILE_SD_CHECK_INTERVAL}",
        f"-storageDataPath={data_dir}",
        f"-retentionPeriod={retention}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-loggerLevel=WARN",
        *extra,
    ]
