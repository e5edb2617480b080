"""The Grafana dashboard in controller/: a ConfigMap with the sidecar's label holding valid,
deterministic dashboard JSON whose queries are exactly those of ghostgpu.dashboard.panels; and
the PNG preview drawn from (saved) query results. The queries themselves run against a real
Prometheus scraping a real controller in tests/e2e/test_dashboard.py."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from ghostgpu.cli import app
from ghostgpu.config import load_config_text, load_default_config
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.dashboard.panels import IDLE_METRIC, OWNER_KIND_METRIC, PANELS, REVERTS_METRIC, all_queries
from ghostgpu.dashboard.preview import PanelResult, Preview, QueryResult, Series, bars, draw, legend
from ghostgpu.render import GRAFANA_DASHBOARD_KEY, render_bundles

FILE = "controller/grafana-dashboard.yaml"
THREE_RESOURCES_HEAD = """\
flavors:
  - {name: h100, resource: nvidia.com/gpu, nodeLabels: {gpu: h100}}
teams:
  - {name: research, quota: {h100: 8}}
"""


def _dashboard(files: dict[str, str]) -> tuple[dict, dict]:
    [cm] = [d for d in yaml.safe_load_all(files[FILE]) if d]
    return cm, json.loads(cm["data"][GRAFANA_DASHBOARD_KEY])


def test_configmap_carries_the_sidecar_label_and_valid_json() -> None:
    files = render_bundles(load_default_config())
    cm, dash = _dashboard(files)
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["namespace"] == "ghostgpu-system"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert "grafana-dashboard.yaml" in yaml.safe_load(files["controller/kustomization.yaml"])["resources"]
    assert dash["uid"] == "ghostgpu-controller"
    assert [v["type"] for v in dash["templating"]["list"]] == ["datasource"]
    assert [p["title"] for p in dash["panels"]] == [p.title for p in PANELS]


def test_every_panel_query_is_in_the_dashboard_once() -> None:
    _, dash = _dashboard(render_bundles(load_default_config()))
    targets = [(p["title"], t["expr"], t["legendFormat"]) for p in dash["panels"] for t in p["targets"]]
    assert targets == [(p.title, q.expr, q.legend) for p, q in all_queries()]
    for panel, spec in zip(dash["panels"], PANELS, strict=True):
        assert panel["fieldConfig"]["defaults"]["unit"] == spec.unit
        assert [t["refId"] for t in panel["targets"]] == [chr(ord("A") + i) for i in range(len(spec.queries))]
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    # Grafana's grid: 24 columns, no two panels overlapping.
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, p["title"]
                cells.add((x, y))


def test_queries_use_the_controllers_metric_names() -> None:
    exported = {m.name for m in ControllerMetrics().registry.collect()}
    for _, q in all_queries():
        names = set(re.findall(r"\b(ghostgpu_[a-z_]+)", q.expr))
        assert names, q.expr
        for name in names - {REVERTS_METRIC}:
            # prometheus_client names counters without _total and histograms without _bucket
            assert re.sub(r"_(total|bucket)$", "", name) in exported, name
    # Only the reverts and the idle sessions may come back empty, and each says why.
    empty = [q for _, q in all_queries() if q.empty_ok]
    [reverts] = [q for q in empty if REVERTS_METRIC in q.expr]
    assert REVERTS_METRIC in (reverts.empty_ok or "")
    assert all(
        IDLE_METRIC in q.expr and "idle session" in (q.empty_ok or "") for q in empty if q is not reverts
    )


def test_owner_kinds_are_a_bar_gauge_of_the_leaders_gauge_beside_the_outside_kueue_panels() -> None:
    _, dash = _dashboard(render_bundles(load_default_config()))
    titles = [p["title"] for p in dash["panels"]]
    i = titles.index("GPUs outside Kueue by owner kind")
    assert titles[i - 1] == "GPUs held outside Kueue by verdict"
    panel = dash["panels"][i]
    assert panel["type"] == "bargauge" and panel["options"]["reduceOptions"]["calcs"] == ["lastNotNull"]
    # Its value now, not the range's last: a kind that stopped holding GPUs has no bar.
    [target] = panel["targets"]
    assert target["instant"] is True and target["range"] is False
    assert "{{owner_kind}}" in target["legendFormat"] and "{{stoppable}}" in target["legendFormat"]
    # The metric and the labels it groups by are those ControllerMetrics exports.
    metrics = ControllerMetrics()
    [family] = [m for m in metrics.registry.collect() if m.name == OWNER_KIND_METRIC]
    assert family.type == "gauge" and OWNER_KIND_METRIC in target["expr"]
    [by] = re.findall(r"by \(([^)]*)\)", target["expr"])
    assert [x.strip() for x in by.split(",")] == list(metrics.owner_kind_outside._labelnames)
    # Every other panel stays a time series over the range, the idle sessions' bars aside.
    others = [p for p in dash["panels"] if p is not panel and p["title"] != "Idle sessions warned"]
    assert {p["type"] for p in others} == {"timeseries"}
    assert not any("instant" in t for p in others for t in p["targets"])


def test_rendering_is_deterministic() -> None:
    a = render_bundles(load_default_config())[FILE]
    b = render_bundles(load_default_config())[FILE]
    assert a == b
    assert "timestamp" not in a.lower()


def test_label_is_configurable_and_the_dashboard_can_be_turned_off() -> None:
    text = THREE_RESOURCES_HEAD + "controller:\n  grafanaDashboard: {labels: {my-dashboards: 'yes'}}\n"
    cm, _ = _dashboard(render_bundles(load_config_text(text)))
    assert cm["metadata"]["labels"]["my-dashboards"] == "yes"
    assert "grafana_dashboard" not in cm["metadata"]["labels"]
    off = render_bundles(
        load_config_text(THREE_RESOURCES_HEAD + "controller:\n  grafanaDashboard: {enabled: false}\n")
    )
    assert FILE not in off
    assert "grafana-dashboard.yaml" not in off["controller/kustomization.yaml"]


def test_an_empty_label_map_is_refused() -> None:
    from ghostgpu.config_errors import ConfigError

    with pytest.raises(ConfigError, match=r"grafanaDashboard\.labels"):
        load_config_text(THREE_RESOURCES_HEAD + "controller:\n  grafanaDashboard: {labels: {}}\n")


def test_cli_json_is_the_rendered_dashboard() -> None:
    res = CliRunner().invoke(app, ["dashboard", "json"])
    assert res.exit_code == 0, res.output
    _, dash = _dashboard(render_bundles(load_default_config()))
    assert json.loads(res.output) == dash


# --- the PNG preview ----------------------------------------------------------------------------


def test_legend_format() -> None:
    assert legend("{{flavor}} gap", {"flavor": "h100"}) == "h100 gap"
    assert legend("{{ source }}: {{reason}}", {"source": "utilization", "reason": "missing"}) == (
        "utilization: missing"
    )
    assert legend("reclaimed {{verdict}}", {}) == "reclaimed"


def _synthetic() -> Preview:
    t = [1_700_000_000.0 + 5 * i for i in range(60)]
    panels = []
    for p in PANELS:
        queries = [
            QueryResult(
                expr=q.expr,
                legend=q.legend,
                empty_ok=q.empty_ok,
                series=[]
                if q.empty_ok
                else [Series(name=q.legend, labels={}, points=[(x, float(i % 7)) for i, x in enumerate(t)])],
            )
            for q in p.queries
        ]
        panels.append(
            PanelResult(
                title=p.title,
                axis_label=p.axis_label,
                stacked=p.stacked,
                full_width=p.full_width,
                display=p.display,
                queries=queries,
            )
        )
    return Preview(start=t[0], end=t[-1], step=5, panels=panels)


def test_bar_gauge_bars_are_the_series_present_at_the_last_sample_largest_first() -> None:
    def series(name: str, last: float, value: float) -> Series:
        return Series(name=name, labels={}, points=[(100.0, 1.0), (last, value)])

    q = QueryResult(
        expr="x",
        legend="{{owner_kind}}",
        empty_ok=None,
        series=[series("Job", 130.0, 6), series("RayJob", 130.0, 8), series("Notebook", 110.0, 4)],
    )
    panel = PanelResult(
        title="t", axis_label="GPUs", stacked=False, full_width=True, display="bargauge", queries=[q]
    )
    assert bars(panel) == (130.0, [("RayJob", 8.0), ("Job", 6.0)])  # the Notebook was gone by then
    assert bars(panel.model_copy(update={"queries": []})) == (None, [])


def test_results_saved_before_bar_gauges_load_as_time_series() -> None:
    saved = json.loads((Path(__file__).resolve().parents[2] / "docs" / "dashboard.json").read_text())
    assert {p.display for p in Preview.model_validate(saved).panels} == {"timeseries", "bargauge"}
    for panel in saved["panels"]:  # as results were saved before panels had a display
        panel.pop("display", None)
    assert {p.display for p in Preview.model_validate(saved).panels} == {"timeseries"}


def test_preview_draws_every_panel(tmp_path: Path) -> None:
    out = draw(_synthetic(), tmp_path / "d.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 20_000


def test_cli_redraws_saved_results_and_explains_bad_input(tmp_path: Path) -> None:
    saved = tmp_path / "results.json"
    saved.write_text(_synthetic().model_dump_json())
    res = CliRunner().invoke(
        app, ["dashboard", "preview", "--from-json", str(saved), "-o", str(tmp_path / "p.png")]
    )
    assert res.exit_code == 0, res.output
    assert (tmp_path / "p.png").stat().st_size > 20_000
    res = CliRunner().invoke(app, ["dashboard", "preview", "-o", str(tmp_path / "q.png")])
    assert res.exit_code == 2 and "--prometheus" in res.output
    res = CliRunner().invoke(
        app, ["dashboard", "preview", "--prometheus", "http://127.0.0.1:9", "-o", str(tmp_path / "q.png")]
    )
    assert res.exit_code == 2 and "error: Prometheus: http://127.0.0.1:9" in res.output
    assert "fix: check that --prometheus" in res.output
    assert not (tmp_path / "q.png").exists()
