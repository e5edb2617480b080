"""`ghostgpu dashboard preview`: run every panel's PromQL (ghostgpu.dashboard.panels) as a range
query against a Prometheus and draw the panels with matplotlib, laid out like the Grafana
dashboard. The query results can be saved as JSON and drawn again later without a Prometheus."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import BaseModel

from ghostgpu.dashboard.panels import PANELS

_LEGEND_FIELD = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")


class PreviewError(Exception):
    """Prometheus could not be reached or refused a query."""


class Series(BaseModel):
    name: str  # the query's legend with this series' labels filled in
    labels: dict[str, str]
    points: list[tuple[float, float]]  # (unix seconds, value)


class QueryResult(BaseModel):
    expr: str
    legend: str
    empty_ok: str | None
    series: list[Series]


class PanelResult(BaseModel):
    title: str
    axis_label: str
    stacked: bool
    full_width: bool
    display: str = "timeseries"  # panels.Panel.display (results saved before it: time series)
    queries: list[QueryResult]


class Preview(BaseModel):
    start: float
    end: float
    step: float
    panels: list[PanelResult]


def legend(fmt: str, labels: dict[str, str]) -> str:
    """Grafana's legendFormat: {{name}} becomes the label's value ("" when absent)."""
    return _LEGEND_FIELD.sub(lambda m: labels.get(m.group(1), ""), fmt).strip()


def _range_query(
    client: httpx.Client, expr: str, start: float, end: float, step: float
) -> list[dict[str, Any]]:
    try:
        r = client.get(
            "/api/v1/query_range", params={"query": expr, "start": start, "end": end, "step": step}
        )
    except httpx.HTTPError as exc:
        raise PreviewError(f"{client.base_url}: {type(exc).__name__}: {exc}") from None
    try:
        body = r.json()
    except ValueError:
        raise PreviewError(f"{client.base_url}: HTTP {r.status_code}, not a Prometheus API answer") from None
    if body.get("status") != "success":
        raise PreviewError(f"query refused ({body.get('errorType')}: {body.get('error')}): {expr}")
    return list(body["data"]["result"])


def fetch(prometheus_url: str, start: float, end: float, step: float, timeout: float = 30) -> Preview:
    """Every panel's queries over [start, end] (unix seconds) at `step` seconds."""
    if end <= start:
        raise PreviewError(f"the range is empty: start {start} is not before end {end}")
    panels: list[PanelResult] = []
    with httpx.Client(base_url=prometheus_url.rstrip("/"), timeout=timeout) as client:
        for p in PANELS:
            results = []
            for q in p.queries:
                series = [
                    Series(
                        name=legend(q.legend, s["metric"]) or q.expr,
                        labels=s["metric"],
                        # NaN (histogram_quantile over no polls) and ±Inf are gaps, as in Grafana.
                        points=[(float(t), float(v)) for t, v in s["values"] if math.isfinite(float(v))],
                    )
                    for s in _range_query(client, q.expr, start, end, step)
                ]
                series.sort(key=lambda s: s.name)
                results.append(QueryResult(expr=q.expr, legend=q.legend, empty_ok=q.empty_ok, series=series))
            panels.append(
                PanelResult(
                    title=p.title,
                    axis_label=p.axis_label,
                    stacked=p.stacked,
                    full_width=p.full_width,
                    display=p.display,
                    queries=results,
                )
            )
    return Preview(start=start, end=end, step=step, panels=panels)


def draw(preview: Preview, path: Path, title: str = "ghostgpu controller dashboard") -> Path:
    import matplotlib

    matplotlib.use("Agg")  # headless
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from matplotlib.gridspec import GridSpec

    # Two panels per row like the Grafana layout; a full_width panel takes a row of its own.
    rows: list[list[PanelResult]] = []
    for p in preview.panels:
        if p.full_width or not rows or len(rows[-1]) == 2 or rows[-1][0].full_width:
            rows.append([p])
        else:
            rows[-1].append(p)
    fig = plt.figure(figsize=(15, 4.2 * len(rows)), constrained_layout=True)
    grid = GridSpec(len(rows), 2, figure=fig)
    t0, t1 = _utc(preview.start), _utc(preview.end)
    for r, row in enumerate(rows):
        for c, panel in enumerate(row):
            ax = fig.add_subplot(grid[r, :] if panel.full_width else grid[r, c])
            if panel.display == "bargauge":
                _draw_bars(ax, panel)
                continue
            _draw_panel(ax, panel)
            ax.set_xlim(t0, t1)
            # A half-width panel fits about 6 HH:MM:SS labels before they run into each other.
            ticks = 10 if panel.full_width else 6
            ax.xaxis.set_major_locator(mdates.AutoDateLocator(minticks=3, maxticks=ticks))
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
    span = preview.end - preview.start
    length = f"{span / 60:.0f} min" if span >= 120 else f"{span:.0f} s"
    fig.suptitle(f"{title} ({length} to {t1:%Y-%m-%d %H:%M:%S} UTC, step {preview.step:g} s)", fontsize=13)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
    return path


def _utc(ts: float) -> Any:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC)


_STYLES = (("-", 3.2), ("--", 2.2), (":", 2.2), ("-.", 1.5))


def bars(panel: PanelResult) -> tuple[float | None, list[tuple[str, float]]]:
    """A bar gauge's bars: each series' value at the panel's last sample time, largest first (as
    Grafana's instant query: a series gone by then has no bar), and that time (None: no data)."""
    series = [s for q in panel.queries for s in q.series if s.points]
    if not series:
        return None, []
    at = max(s.points[-1][0] for s in series)
    now = [(s.name, s.points[-1][1]) for s in series if s.points[-1][0] == at]
    return at, sorted(now, key=lambda b: (-b[1], b[0]))


def _draw_bars(ax: Any, panel: PanelResult) -> None:
    at, now = bars(panel)
    ax.set_title(
        panel.title + (f" (at {_utc(at):%H:%M:%S})" if at is not None else ""), fontsize=11, loc="left"
    )
    ax.set_xlabel(panel.axis_label)
    ax.grid(alpha=0.3, axis="x")
    if not now:
        notes = [f"{q.legend}: {q.empty_ok}" if q.empty_ok else f"NO DATA: {q.legend}" for q in panel.queries]
        ax.text(0.5, 0.5, "\n".join(notes), transform=ax.transAxes, ha="center", va="center", color="0.35")
        ax.set_yticks([])
        return
    names, values = [n for n, _ in now], [v for _, v in now]
    ax.barh(names, values, color="tab:blue", alpha=0.75)
    ax.invert_yaxis()  # largest on top
    ax.set_xlim(0, max(1.0, *values) * 1.12)
    for y, v in enumerate(values):
        ax.text(v, y, f" {v:g}", va="center", fontsize=9)


def _draw_panel(ax: Any, panel: PanelResult) -> None:
    notes: list[str] = []
    drawn, top = 0, 0.0
    if panel.stacked:
        series = [s for q in panel.queries for s in q.series]
        times = sorted({t for s in series for t, _ in s.points})
        if series:
            values = [[dict(s.points).get(t, 0.0) for t in times] for s in series]
            ax.stackplot([_utc(t) for t in times], values, labels=[s.name for s in series], alpha=0.75)
            drawn, top = len(series), max(sum(col) for col in zip(*values, strict=True))
    else:
        # One line style and width per query, later queries thinner and on top, so that series of
        # different queries with equal values (2 reclaims, 2 escalations) both show where they overlap.
        for i, q in enumerate(panel.queries):
            ls, lw = _STYLES[i % len(_STYLES)]
            for s in q.series:
                xs, ys = [_utc(t) for t, _ in s.points], [v for _, v in s.points]
                ax.plot(xs, ys, lw=lw, ls=ls, drawstyle="steps-post", label=s.name)
                drawn, top = drawn + 1, max([top, *ys])
    for q in panel.queries:
        if not q.series:
            notes.append(f"{q.legend}: {q.empty_ok}" if q.empty_ok else f"NO DATA: {q.legend}")
    ax.set_title(panel.title, fontsize=11, loc="left")
    ax.set_ylabel(panel.axis_label)
    # Headroom above the data for the legend in the upper left corner (more rows, more room).
    rows = (drawn + 1) // 2 if drawn > 4 else drawn
    ax.set_ylim(0, max(1.0, top) * (1.15 + 0.1 * rows))
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8, loc="upper left", ncol=2 if drawn > 4 else 1, framealpha=0.85)
    if notes:
        ax.text(
            0.99,
            0.02,
            "\n".join(notes),
            transform=ax.transAxes,
            ha="right",
            va="bottom",
            fontsize=7.5,
            color="0.35",
        )


def run_preview_command(
    prometheus: str | None,
    out: Path,
    start: float | None,
    end: float | None,
    minutes: float,
    json_out: Path | None,
    from_json: Path | None,
    echo: Any = print,
) -> int:
    import time

    from ghostgpu.boundary import input_error

    if from_json is not None:
        text = from_json.read_text()  # a missing file: FileNotFoundError, named by the boundary
        try:
            preview = Preview.model_validate_json(text)
        except ValueError as exc:  # pydantic's ValidationError, bad JSON included
            what = str(exc).splitlines()[1:2] or [str(exc)]
            raise input_error(
                f"--from-json {from_json}: not saved query results ({what[0].strip()})",
                "give a file written by `ghostgpu dashboard preview --json-out FILE`",
            ) from None
    else:
        if not prometheus:
            raise input_error(
                "no --prometheus and no --from-json: nothing to draw from",
                "give --prometheus URL (e.g. a port-forward: http://127.0.0.1:9090), or --from-json FILE "
                "to redraw saved results",
            )
        parts = urlsplit(prometheus)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise input_error(
                f"--prometheus {prometheus!r}: not an http:// or https:// URL",
                "give the Prometheus base URL, e.g. http://127.0.0.1:9090",
            )
        end = end if end is not None else time.time()
        start = start if start is not None else end - 60 * minutes
        step = max(1.0, round((end - start) / 400))
        try:
            preview = fetch(prometheus, start, end, step)
        except PreviewError as exc:
            raise input_error(
                f"Prometheus: {exc}",
                "check that --prometheus is a Prometheus base URL that answers, and the range "
                "(--start, --end, --minutes)",
            ) from None
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(preview.model_dump_json(indent=1) + "\n")
    draw(preview, out)
    empty = [q.legend for p in preview.panels for q in p.queries if not q.series and not q.empty_ok]
    echo(f"wrote {out}" + (f"; no data for: {', '.join(empty)}" if empty else ""))
    return 0
