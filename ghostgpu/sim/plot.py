"""The window plot: utilization-only FPR against window length, beside the multi-signal rules."""

from __future__ import annotations

from pathlib import Path

from ghostgpu.extras import require
from ghostgpu.sim.published import PUBLISHED, PUBLISHED_WINDOW
from ghostgpu.sim.runner import BenchResult


def plot_window_sweep(result: BenchResult, path: Path) -> Path:
    matplotlib = require("matplotlib", "plot", "--plot")

    matplotlib.use("Agg")  # headless and deterministic: no display, no GUI backend
    import matplotlib.pyplot as plt

    pts = result.sweep
    ks = [p.window for p in pts]
    fine = [k / 10 for k in range(10, 10 * ks[-1] + 1)]
    model = result.config.model

    fig, (ax_fpr, ax_rec) = plt.subplots(1, 2, figsize=(11, 4.2), constrained_layout=True)
    ax_fpr.plot(
        fine,
        [100 * model.expected_window_fpr(k) for k in fine],
        color="0.55",
        lw=1.2,
        label=f"closed form ${model.gap_prob:g} \\cdot {1 - model.gap_nonzero_prob:g}^k$",
    )
    ax_fpr.plot(
        ks, [100 * p.window_util_fpr for p in pts], "o", color="C3", label="utilization only (measured)"
    )
    ax_fpr.plot(ks, [100 * p.paper_fpr for p in pts], "s--", color="C0", ms=5, label="paper multi-signal")
    ax_fpr.plot(ks, [100 * p.ghostgpu_fpr for p in pts], "^:", color="C2", ms=5, label="ghostgpu (both 0)")
    published = [(1, PUBLISHED["single-util"].fpr), (PUBLISHED_WINDOW, PUBLISHED["window-util"].fpr)]
    ax_fpr.plot(
        [k for k, _ in published],
        [100 * (v or 0.0) for _, v in published],
        "D",
        mfc="none",
        mec="k",
        ms=9,
        label="published",
    )
    ax_fpr.set(xlabel="window length k (samples)", ylabel="false-positive rate (%)", xticks=ks)
    ax_fpr.set_title("False reclaims of ACTIVE jobs")
    ax_fpr.set_ylim(bottom=-0.5)
    ax_fpr.grid(alpha=0.3)
    ax_fpr.legend(fontsize=8)

    ax_rec.plot(ks, [100 * p.paper_recall for p in pts], "s--", color="C0", ms=5, label="paper multi-signal")
    ax_rec.plot(ks, [100 * p.ghostgpu_recall for p in pts], "^:", color="C2", ms=5, label="ghostgpu")
    ax_rec.plot(
        [PUBLISHED_WINDOW],
        [100 * (PUBLISHED["paper-multi-signal"].recall or 0.0)],
        "D",
        mfc="none",
        mec="k",
        ms=9,
        label="published (paper multi-signal)",
    )
    ax_rec.set(xlabel="window length k (samples)", ylabel="recall (%)", xticks=ks, ylim=(90, 100.8))
    ax_rec.set_title("Reclaimable workloads found")
    ax_rec.grid(alpha=0.3)
    ax_rec.legend(fontsize=8, loc="lower right")

    c = result.config
    fig.suptitle(
        f"ghostgpu bench: {c.total_instances:,} synthetic workloads ({c.seeds} seeds x {c.instances:,})"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    # Fixed metadata so the PNG bytes do not change between identical runs.
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path
