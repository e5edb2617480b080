"""`ghostgpu calibrate --plot`: MTTR reduction and catastrophic-autonomy rate against tau."""

from __future__ import annotations

from pathlib import Path

from ghostgpu.autonomy import CalibrationResult, SweepPoint
from ghostgpu.extras import require


def _series(points: tuple[SweepPoint, ...]) -> tuple[list[float], list[float], list[float]]:
    return (
        [p.tau for p in points],
        [100 * p.mttr_reduction for p in points],
        [100 * p.catastrophic_rate for p in points],
    )


def plot_calibration(result: CalibrationResult, path: Path, title: str = "") -> Path:
    matplotlib = require("matplotlib", "plot", "--plot")

    matplotlib.use("Agg")  # headless and deterministic
    import matplotlib.pyplot as plt

    s = result.settings
    fig, (ax_m, ax_c, ax_f) = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    g = result.global_threshold
    taus, mttr, cat = _series(result.global_sweep)
    ax_m.step(taus, mttr, where="post", color="black", lw=2.2, label=f"global (tau={g.tau:.3f})")
    ax_c.step(taus, cat, where="post", color="black", lw=2.2, label="global")
    picks = {t.scope: t for t in result.per_type}
    for i, (name, points) in enumerate(sorted(result.per_type_sweeps.items())):
        color = f"C{i}"
        t_, m_, c_ = _series(points)
        pick = picks[name]
        ax_m.step(t_, m_, where="post", color=color, lw=1.3, label=f"{name} (tau={pick.tau:.3f})")
        ax_c.step(t_, c_, where="post", color=color, lw=1.3, label=name)
        ax_m.plot([pick.tau], [100 * pick.mttr_reduction], "o", color=color, ms=6)
    ax_m.plot([g.tau], [100 * g.mttr_reduction], "o", color="black", ms=8, mfc="white", mew=2)
    ax_m.axvline(g.tau, color="black", ls=":", lw=1)
    ax_c.axvline(g.tau, color="black", ls=":", lw=1)
    ax_c.axhline(100 * s.ceiling, color="C3", ls="--", lw=1.2, label=f"ceiling {100 * s.ceiling:g}%")

    ax_m.set_title("MTTR reduction (score < tau acts alone)")
    ax_m.set_ylabel("MTTR reduction vs always-escalate (%)")
    ax_c.set_title("Catastrophic autonomy (dangerous handled alone / dangerous)")
    ax_c.set_ylabel("catastrophic-autonomy rate (%)")
    for ax in (ax_m, ax_c):
        ax.set_xlabel("tau")
        ax.set_xlim(0, taus[-1])
        ax.set_ylim(-2, 102)
        ax.grid(alpha=0.3)
    ax_m.legend(fontsize=8, loc="lower right")
    ax_c.legend(fontsize=8, loc="upper left")

    # Frontier: risk on x, benefit on y; always-escalate at (0, 0), always-autonomous top right.
    xs = [100 * f.catastrophic_rate for f in result.frontier]
    ys = [100 * f.mttr_reduction for f in result.frontier]
    ax_f.plot(xs, ys, "-", color="0.6", lw=1)
    strict = [f for f in result.frontier if f.strict]
    ax_f.plot(xs, ys, "o", color="0.4", ms=4, label="global tau sweep (weak frontier)")
    ax_f.plot([100 * f.catastrophic_rate for f in strict], [100 * f.mttr_reduction for f in strict], "o",
              color="C0", ms=7, mfc="none", mew=1.5, label="strictly Pareto-optimal")  # fmt: skip
    ax_f.plot([100 * g.catastrophic_rate], [100 * g.mttr_reduction], "*", color="black", ms=14,
              label=f"chosen global tau {g.tau:.3f}")  # fmt: skip
    ov = result.per_type_overall
    ax_f.plot([100 * ov.catastrophic_rate], [100 * ov.mttr_reduction], "P", color="C2", ms=11,
              label="per-type taus")  # fmt: skip
    ax_f.annotate("always-escalate", (xs[0], ys[0]), textcoords="offset points", xytext=(8, 4), fontsize=8)
    ax_f.annotate(
        "always-autonomous", (xs[-1], ys[-1]), textcoords="offset points", xytext=(-95, -14), fontsize=8
    )
    ax_f.axvline(100 * s.ceiling, color="C3", ls="--", lw=1.2)
    ax_f.set_title("Pareto frontier")
    ax_f.set_xlabel("catastrophic-autonomy rate (%)")
    ax_f.set_ylabel("MTTR reduction (%)")
    ax_f.set_xlim(-3, 103)
    ax_f.set_ylim(-3, 103)
    ax_f.grid(alpha=0.3)
    ax_f.legend(fontsize=8, loc="lower right")
    if title:
        fig.suptitle(title, fontsize=11)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)
    return path
