"""The scale bench's table (Markdown) and log-log plot of per-poll cost against N."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ghostgpu.extras import require
from ghostgpu.scale.bench import SizeResult

CPU_TARGET_S = 1.0  # one poll at N = 10,000 costs at most 1 s of controller CPU
RSS_TARGET_MB = 300.0  # "under 300 MB" (decimal megabytes: 286.1 MiB)
RSS_TARGET_MIB = RSS_TARGET_MB * 1e6 / 2**20


def _n(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else (f"{x:,.1f}" if x >= 10 else f"{x:,.3g}")


def _ratio(r: float | None) -> str:
    return "—" if r is None else f"{r:,.0f}x" if r >= 10 else f"{r:,.1f}x"


def markdown(results: Sequence[SizeResult]) -> str:
    lines = [
        "| N pods (idle) | impl | wall s/poll | CPU s/poll | CPU s/cycle | peak RSS MiB "
        "| Prometheus queries/poll | apiserver requests/poll | exec calls/poll |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for name, side in (("ghostgpu", r.ghostgpu), ("naive cron (baseline)", r.naive)):
            label = name
            if side.extrapolated_from:
                label += f" — extrapolated from {side.extrapolated_from:,} pods"
            cycle = "—" if side.cycle_cpu_s is None else f"{side.cycle_cpu_s:.3f}"
            lines.append(
                f"| {r.n:,} ({r.idle:,}) | {label} | {side.wall_s:.3f} | {side.cpu_s:.3f} | {cycle} | "
                f"{side.peak_rss_mib:.0f} | {_n(side.prometheus_queries)} | {_n(side.apiserver_requests)} | "
                f"{_n(side.exec_calls)} |"
            )
    lines += [
        "",
        "| N | naive/ghostgpu CPU | wall | Prometheus queries | exec calls | apiserver requests |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.n:,} | {_ratio(r.ratio('cpu_s'))} | {_ratio(r.ratio('wall_s'))} | "
            f"{_ratio(r.ratio('prometheus_queries'))} | {_ratio(r.ratio('exec_calls'))} | "
            f"{_ratio(r.ratio('apiserver_requests'))} |"
        )
    return "\n".join(lines) + "\n"


def warmup_markdown(results: Sequence[SizeResult]) -> str:
    lines = [
        "| N | poll | wall s | CPU s | apiserver requests | exec calls |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        for w in r.warmup:
            lines.append(
                f"| {r.n:,} | {w['poll']} | {w['wall_s']:.2f} | {w['cpu_s']:.2f} | "
                f"{w['apiserver_requests']:,} | {w['exec_calls']:,} |"
            )
    return "\n".join(lines) + "\n"


def targets(results: Sequence[SizeResult]) -> list[tuple[str, bool, str]]:
    """(target, met, evidence) for the structural and cost targets."""
    out: list[tuple[str, bool, str]] = []
    queries = {r.n: r.ghostgpu.prometheus_queries for r in results}
    out.append(
        (
            "Prometheus queries per poll constant in N",
            len(set(queries.values())) == 1,
            ", ".join(f"N={n:,}: {q:g}" for n, q in queries.items()),
        )
    )
    out.append(
        (
            "exec calls only for utilization-idle candidates",
            all(r.ghostgpu.exec_calls == r.idle for r in results),
            ", ".join(f"N={r.n:,}: {r.ghostgpu.exec_calls:g} exec for {r.idle} idle" for r in results),
        )
    )
    big = max(results, key=lambda r: r.n)
    # The stricter of the poll alone and the whole poll-to-poll cycle (absent in older JSON).
    worst = max(big.ghostgpu.cpu_s, big.ghostgpu.cycle_cpu_s or 0.0)
    out.append(
        (
            f"CPU per poll at N={big.n:,} <= {CPU_TARGET_S:g} s",
            worst <= CPU_TARGET_S,
            f"{big.ghostgpu.cpu_s:.3f} s in the poll"
            + ("" if big.ghostgpu.cycle_cpu_s is None else f", {big.ghostgpu.cycle_cpu_s:.3f} s per cycle"),
        )
    )
    out.append(
        (
            f"peak RSS at N={big.n:,} < {RSS_TARGET_MB:g} MB ({RSS_TARGET_MIB:.1f} MiB)",
            big.ghostgpu.peak_rss_mib < RSS_TARGET_MIB,
            f"{big.ghostgpu.peak_rss_mib:.0f} MiB ({big.ghostgpu.peak_rss_mib * 2**20 / 1e6:.0f} MB)",
        )
    )
    return out


def plot(results: Sequence[SizeResult], path: Path) -> None:
    matplotlib = require("matplotlib", "plot", "--plot")

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r.n for r in results]
    panels = (
        ("cpu_s", "controller CPU s per poll"),
        ("wall_s", "wall time s per poll"),
        ("prometheus_queries", "Prometheus queries per poll"),
        ("exec_calls", "exec calls per poll"),
        ("apiserver_requests", "apiserver requests per poll"),
        ("peak_rss_mib", "peak RSS MiB (process)"),
    )
    fig, axes = plt.subplots(2, 3, figsize=(14, 7.5))
    for ax, (attr, title) in zip(axes.flat, panels, strict=True):
        mine = [getattr(r.ghostgpu, attr) for r in results]
        theirs = [getattr(r.naive, attr) for r in results]
        ax.plot(ns, theirs, "s--", color="tab:red", label="naive cron (baseline)")
        ax.plot(ns, mine, "o-", color="tab:blue", label="ghostgpu")
        for r, y in zip(results, theirs, strict=True):
            if r.naive.extrapolated_from and attr != "peak_rss_mib":  # RSS is measured, not scaled
                ax.annotate("extrapolated", (r.n, y), textcoords="offset points", xytext=(-30, 6), fontsize=7)
        if attr == "cpu_s":
            ax.axhline(CPU_TARGET_S, color="grey", lw=0.8, ls=":", label="target 1 s at N=10,000")
        if attr == "peak_rss_mib":
            target = f"target {RSS_TARGET_MB:g} MB at N=10,000"
            ax.axhline(RSS_TARGET_MIB, color="grey", lw=0.8, ls=":", label=target)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("tracked GPU pods N")
        ax.grid(True, which="both", lw=0.3, alpha=0.5)
        ax.legend(fontsize=7)
    idle = ", ".join(f"{r.idle:,}" for r in results)
    fig.suptitle(f"ghostgpu bench scale: one poll, steady state (idle candidates: {idle})", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
