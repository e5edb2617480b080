"""The scale bench's table (Markdown) and log-log plot of per-poll cost against N."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ghostgpu.config import ControllerConfig
from ghostgpu.extras import require
from ghostgpu.scale.bench import SizeResult

# Targets that do not depend on how fast the machine is: the steady CPU of a poll-to-poll cycle
# as a multiple of the floor measured in the same run (SizeResult.floor_s), at the largest N.
FLOOR_RATIO_TARGET = 10.0
CPU_10K_TARGET_S = 1.0  # the earlier absolute target at N = 10,000, kept as a no-regression line
RSS_TARGET_MB = 300.0  # at most 300 MB (decimal megabytes: 286.1 MiB) at the largest N
RSS_TARGET_MIB = RSS_TARGET_MB * 1e6 / 2**20
EXTRA_REQUESTS = 5  # steady apiserver requests per poll: at most one per idle candidate + this
# The node agent's series per busy GPU container, on average, in the bench's Prometheus.
AGENT_SERIES_TARGET = 3.0
# The poll's whole query against the same query without the agent's parts (utilization, sample
# age, GPU memory, XIDs: what exec mode sends), on the same Prometheus at the largest N.
QUERY_RATIO_TARGET = 1.5
# A poll's wall time at the largest N under the default controller.pollInterval.
DEFAULT_POLL_INTERVAL_S = ControllerConfig.model_fields["poll_interval"].default.seconds


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
        sides = [("ghostgpu, agent mode", r.ghostgpu)]
        sides += [("ghostgpu, exec mode", r.exec_mode)] if r.exec_mode is not None else []
        for name, side in (*sides, ("naive cron (baseline)", r.naive)):
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
        "| N | naive/ghostgpu (agent mode) CPU | wall | Prometheus queries | exec calls "
        "| apiserver requests |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.n:,} | {_ratio(r.ratio('cpu_s'))} | {_ratio(r.ratio('wall_s'))} | "
            f"{_ratio(r.ratio('prometheus_queries'))} | {_ratio(r.ratio('exec_calls'))} | "
            f"{_ratio(r.ratio('apiserver_requests'))} |"
        )
    return "\n".join(lines) + "\n"


def floor_markdown(results: Sequence[SizeResult]) -> str:
    """The controller against the floor of one poll measured in the same run (3 series per pod),
    and beside it the floor with the agent's series of every pod (labelled apart)."""
    lines = [
        "| N pods (idle) | floor CPU s | CPU s/cycle | cycle ÷ floor | floor with the agent's series CPU s "
        "| cycle ÷ that floor | CPU s/poll | wall s/poll | peak RSS MB | apiserver requests/poll "
        "| 5 + writes |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        g = r.ghostgpu
        floor = "—" if r.floor_s is None else f"{r.floor_s:.4f}"
        ratio = "—" if r.floor_ratio is None else f"{r.floor_ratio:.1f}x"
        every = "—" if r.floor_agent_s is None else f"{r.floor_agent_s:.4f}"
        every_ratio = (
            "—"
            if r.floor_agent_s is None or g.cycle_cpu_s is None
            else f"{g.cycle_cpu_s / r.floor_agent_s:.1f}x"
        )
        cycle = "—" if g.cycle_cpu_s is None else f"{g.cycle_cpu_s:.3f}"
        lines.append(
            f"| {r.n:,} ({r.idle:,}) | {floor} | {cycle} | {ratio} | {every} | {every_ratio} | "
            f"{g.cpu_s:.3f} | {g.wall_s:.3f} | {g.peak_rss_mib * 2**20 / 1e6:.0f} | "
            f"{_n(g.apiserver_requests)} | {_n(EXTRA_REQUESTS + (g.writes or 0))} |"
        )
    return "\n".join(lines) + "\n"


def _s(x: float | None, digits: int = 2) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def prometheus_markdown(results: Sequence[SizeResult]) -> str:
    """What the poll's query and the node agent cost the bench's Prometheus (querycost.py)."""
    lines = [
        "| N pods (idle) | Prometheus head series | agent series | per container | per busy container "
        "| per idle container | utilization alone s | query without the agent's parts s "
        "| poll's query s | poll ÷ without the agent's | first poll's query s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        a, q = r.agent_series or {}, r.query_s or {}
        lines.append(
            f"| {r.n:,} ({r.idle:,}) | {_n(r.prometheus_series) if r.prometheus_series else '—'} | "
            f"{_n(a['series']) if a.get('series') else '—'} | {_s(a.get('per_container'))} | "
            f"{_s(a.get('per_busy_container'))} | {_s(a.get('per_idle_container'))} | "
            f"{_s(q.get('utilization'))} | {_s(q.get('without_agent'))} | {_s(q.get('poll'))} | "
            f"{_ratio_of(q.get('poll'), q.get('without_agent'))} | {_s(q.get('first_poll'))} |"
        )
    return "\n".join(lines) + "\n"


def _ratio_of(a: float | None, b: float | None) -> str:
    return "—" if a is None or not b else f"{a / b:.2f}x"


def sizing_markdown(results: Sequence[SizeResult]) -> str:
    """Pods → what the controller (agent mode) and Prometheus need, from the same run."""
    lines = [
        "| tracked GPU pods | controller CPU s per poll (cycle) | controller peak RSS MiB "
        "| Prometheus head series | poll's query s | poll wall s |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        g = r.ghostgpu
        series = _n(r.prometheus_series) if r.prometheus_series else "—"
        lines.append(
            f"| {r.n:,} | {_s(g.cycle_cpu_s, 3)} | {g.peak_rss_mib:.0f} | {series} | "
            f"{_s((r.query_s or {}).get('poll'))} | {g.wall_s:.2f} |"
        )
    return "\n".join(lines) + "\n"


def exec_markdown(results: Sequence[SizeResult]) -> str:
    """Exec mode beside agent mode: what the process signal costs when it is exec'd, per idle
    candidate (one `ps` exec each), and whether both modes reached the same verdicts."""
    lines = [
        "| N pods (idle) | exec mode CPU s/cycle | agent mode CPU s/cycle | exec mode extra CPU ms "
        "per idle candidate | exec calls/poll | apiserver requests/poll | same verdicts |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in results:
        e = r.exec_mode
        if e is None:
            continue
        per = r.exec_cpu_per_candidate_s
        lines.append(
            f"| {r.n:,} ({r.idle:,}) | {e.cycle_cpu_s or 0:.3f} | {r.ghostgpu.cycle_cpu_s or 0:.3f} | "
            f"{'—' if per is None else f'{per * 1e3:.2f}'} | {_n(e.exec_calls)} | "
            f"{_n(e.apiserver_requests)} | "
            f"{'yes' if r.exec_states == r.states else f'no: {r.exec_states} vs {r.states}'} |"
        )
    return "\n".join(lines) + "\n"


def budget_markdown(results: Sequence[SizeResult]) -> str:
    """The first-verdict poll against the apiserver budget: the probe's count (client side) and the
    apiserver's audit log (server side, the controller's User-Agent)."""
    lines = [
        "| N | budget qps/burst | first-verdict poll: requests (budgeted) | wall s | ≥ s at budget "
        "| audited writes+exec (run) | peak burst | max in 1 s | mean/s |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        fv, b = r.first_verdict, r.budget
        if not fv or not b:
            continue
        c = b.get("controller") or {}
        lines.append(
            f"| {r.n:,} | {b['qps']:g}/{b['burst']} | "
            f"{fv['apiserver_requests']:,} ({fv['budgeted_requests']:,}) | "
            f"{fv['wall_s']:.2f} | {fv['seconds_at_budget']:.2f} | {c.get('requests', 0):,} | "
            f"{c.get('peak_burst', 0):.1f} | {c.get('max_per_s', 0)} | {c.get('mean_per_s', 0):.1f} |"
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


def _steps(steps: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(steps.items())) or "—"


def _reads(history: dict[str, Any]) -> str:
    """History queries per poll, and by the window each read (the ladder's `after`, a re-read's
    after + warnBefore), when the probe told them apart."""
    total = f"{history.get('history_queries', 0):g}"
    reads = history.get("history_reads") or {}
    return total + (f" ({', '.join(f'{w} s: {n:g}' for w, n in reads.items())})" if reads else "")


def idle_sessions_markdown(results: Sequence[SizeResult]) -> str:
    """The run with idle sessions on beside the same run without (controller side), then the
    history query against the bench's Prometheus."""
    lines = [
        "| N pods (idle, sessions) | IDLE_HELD verdicts | ladder's steps (last poll) "
        "| history queries/poll (by window read) "
        "| history s/poll (controller) | CPU s/cycle without | CPU s/cycle with | extra CPU s/cycle "
        "| with ÷ floor | peak RSS MiB with | Prometheus queries/poll | apiserver requests/poll "
        "| exec calls/poll |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    rows = [r for r in results if r.idle_sessions is not None]
    for r in rows:
        i = r.idle_sessions
        assert i is not None
        h = i.history
        lines.append(
            f"| {r.n:,} ({r.idle:,}, {i.sessions:,}) | {i.states.get('IDLE_HELD', 0):,} | "
            f"{_steps(h.get('steps_last_poll') or {})} | {_reads(h)} | "
            f"{h.get('history_wall_s', 0.0):.3f} | {_s(r.ghostgpu.cycle_cpu_s, 3)} | "
            f"{_s(i.side.cycle_cpu_s, 3)} | {_s(r.idle_sessions_extra_cpu_s, 3)} | "
            f"{_ratio(r.idle_sessions_floor_ratio)} | {i.side.peak_rss_mib:.0f} | "
            f"{_n(i.side.prometheus_queries)} | {_n(i.side.apiserver_requests)} | {_n(i.side.exec_calls)} |"
        )
    lines += [
        "",
        "| N (sessions) | query | window s | wall s | Prometheus exec s | samples read | peak samples "
        "| answer series | answer bytes | query chars |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        i = r.idle_sessions
        assert i is not None
        after = float(str(i.policy.get("after", "0s")).rstrip("s") or 0)
        full = after + float(str(i.policy.get("warnBefore", "0s")).rstrip("s") or 0)
        windows = {"ladder": after, "reread": full, "default_policy": 3 * 3600.0}
        names = {
            "ladder": "the ladder's (over `after`)",
            "reread": "a stop's re-read (after + warnBefore)",
            "default_policy": "the default policy's (3 h, lookback 8 h)",
        }
        for key, c in sorted(
            i.cost.items(), key=lambda kv: list(names).index(kv[0]) if kv[0] in names else 9
        ):
            lines.append(
                f"| {r.n:,} ({i.sessions:,}) | {names.get(key, key)} | {windows.get(key, 0):,.0f} | "
                f"{_s(c.get('wall_s'), 3)} | {_s(c.get('exec_s'), 3)} | {_n(c.get('samples') or 0)} | "
                f"{_n(c.get('peak_samples') or 0)} | {c.get('series', 0):,} | {c.get('bytes', 0):,} | "
                f"{c.get('query_chars', 0):,} |"
            )
    return "\n".join(lines) + "\n"


def idle_session_targets(results: Sequence[SizeResult]) -> list[tuple[str, bool, str]]:
    """The agent-mode targets again for the run with idle sessions on, and that it ran the ladder."""
    rows = [r for r in results if r.idle_sessions is not None]
    if not rows:
        return []
    out: list[tuple[str, bool, str]] = []

    def each(check: str, ok: bool, evidence: str) -> None:
        out.append((f"idle sessions: {check}", ok, evidence))

    def runs(r: SizeResult) -> tuple[Any, dict[str, Any]]:
        assert r.idle_sessions is not None
        return r.idle_sessions, r.idle_sessions.history

    each(
        "every session reaches IDLE_HELD and the ladder runs on every steady poll (shadow: no writes)",
        all(
            i.states.get("IDLE_HELD", 0) == i.sessions > 0
            and h.get("history_queries", 0) >= 1
            and sum((h.get("steps_last_poll") or {}).values()) == i.sessions
            for i, h in map(runs, rows)
        ),
        ", ".join(
            f"N={r.n:,}: {runs(r)[0].states.get('IDLE_HELD', 0):,} IDLE_HELD of {runs(r)[0].sessions:,} "
            f"sessions, steps {_steps(runs(r)[1].get('steps_last_poll') or {})}"
            for r in rows
        ),
    )
    each(
        "one poll query per poll, plus the history",
        all(i.side.prometheus_queries - h.get("history_queries", 0) == 1 for i, h in map(runs, rows)),
        ", ".join(
            f"N={r.n:,}: {runs(r)[0].side.prometheus_queries:g} queries, "
            f"{runs(r)[1].get('history_queries', 0):g} of them the history"
            for r in rows
        ),
    )
    each(
        "no exec",
        all(i.side.exec_calls == 0 for i, _h in map(runs, rows)),
        ", ".join(f"N={r.n:,}: {runs(r)[0].side.exec_calls:g} exec" for r in rows),
    )
    each(
        f"steady apiserver requests per poll <= {EXTRA_REQUESTS} + writes",
        all(i.side.apiserver_requests <= EXTRA_REQUESTS + (i.side.writes or 0) for i, _h in map(runs, rows)),
        ", ".join(
            f"N={r.n:,}: {runs(r)[0].side.apiserver_requests:g} with {runs(r)[0].side.writes or 0:g} writes"
            for r in rows
        ),
    )
    big = max(rows, key=lambda r: r.n)
    i = big.idle_sessions
    assert i is not None
    ratio = big.idle_sessions_floor_ratio
    each(
        f"CPU per poll-to-poll cycle at N={big.n:,} <= {FLOOR_RATIO_TARGET:g}x the floor of one poll",
        ratio is not None and ratio <= FLOOR_RATIO_TARGET,
        "no floor measured"
        if ratio is None
        else f"{ratio:.1f}x ({i.side.cycle_cpu_s:.3f} s per cycle, {big.idle_sessions_extra_cpu_s:+.3f} s "
        f"against the same run without idle sessions, {big.ghostgpu.cycle_cpu_s:.3f} s; floor "
        f"{big.floor_s:.4f} s)",
    )
    each(
        f"peak RSS at N={big.n:,} <= {RSS_TARGET_MB:g} MB ({RSS_TARGET_MIB:.1f} MiB)",
        i.side.peak_rss_mib <= RSS_TARGET_MIB,
        f"{i.side.peak_rss_mib * 2**20 / 1e6:.0f} MB ({i.side.peak_rss_mib:.0f} MiB)",
    )
    each(
        f"a poll's wall time at N={big.n:,} < the default poll interval ({DEFAULT_POLL_INTERVAL_S:g} s)",
        i.side.wall_s < DEFAULT_POLL_INTERVAL_S,
        f"{i.side.wall_s:.2f} s ({i.history.get('history_wall_s', 0.0):.2f} s of it the history)",
    )
    return out


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
            "agent mode: no exec",
            all(r.ghostgpu.exec_calls == 0 for r in results),
            ", ".join(f"N={r.n:,}: {r.ghostgpu.exec_calls:g} exec" for r in results),
        )
    )
    out.append(
        (
            f"agent mode: steady apiserver requests per poll <= {EXTRA_REQUESTS} + writes",
            all(r.ghostgpu.apiserver_requests <= EXTRA_REQUESTS + (r.ghostgpu.writes or 0) for r in results),
            ", ".join(
                f"N={r.n:,}: {r.ghostgpu.apiserver_requests:g} with {r.ghostgpu.writes or 0:g} writes"
                for r in results
            ),
        )
    )
    timed = [r for r in results if r.exec_mode is not None]
    if timed:
        out.append(
            (
                "agent mode and exec mode reach the same verdicts",
                all(r.exec_states == r.states for r in timed),
                ", ".join(f"N={r.n:,}: {r.states}" for r in timed),
            )
        )
        out.append(
            (
                "exec mode: exec calls only for utilization-idle candidates",
                all(r.exec_mode is not None and r.exec_mode.exec_calls == r.idle for r in timed),
                ", ".join(
                    f"N={r.n:,}: {r.exec_mode.exec_calls:g} exec for {r.idle} idle"
                    for r in timed
                    if r.exec_mode is not None
                ),
            )
        )
    big = max(results, key=lambda r: r.n)
    g = big.ghostgpu
    out.append(
        (
            f"agent mode: CPU per poll-to-poll cycle at N={big.n:,} <= {FLOOR_RATIO_TARGET:g}x "
            "the floor of one poll",
            big.floor_ratio is not None and big.floor_ratio <= FLOOR_RATIO_TARGET,
            "no floor measured"
            if big.floor_ratio is None
            else f"{big.floor_ratio:.1f}x ({g.cycle_cpu_s:.3f} s per cycle, {g.cpu_s:.3f} s in the poll; "
            f"floor {big.floor_s:.4f} s)",
        )
    )
    out.append(
        (
            f"agent mode: peak RSS at N={big.n:,} <= {RSS_TARGET_MB:g} MB ({RSS_TARGET_MIB:.1f} MiB)",
            g.peak_rss_mib <= RSS_TARGET_MIB,
            f"{g.peak_rss_mib * 2**20 / 1e6:.0f} MB ({g.peak_rss_mib:.0f} MiB)",
        )
    )
    per_busy = (big.agent_series or {}).get("per_busy_container")
    out.append(
        (
            f"node agent: <= {AGENT_SERIES_TARGET:g} series per busy GPU container on average "
            f"(Prometheus, N={big.n:,})",
            per_busy is not None and per_busy <= AGENT_SERIES_TARGET,
            "not measured"
            if per_busy is None
            else f"{per_busy:.2f} per busy container, {big.agent_series['per_container']:.2f} per container "
            f"({big.agent_series['series']:,} series for {big.agent_series['containers']:,} containers)",
        )
    )
    q = big.query_s or {}
    if q.get("poll") and q.get("without_agent"):
        ratio = q["poll"] / q["without_agent"]
        out.append(
            (
                f"the poll's query at N={big.n:,} <= {QUERY_RATIO_TARGET:g}x the same query without the "
                "agent's parts (same Prometheus)",
                ratio <= QUERY_RATIO_TARGET,
                f"{ratio:.2f}x ({q['poll']:.2f} s against {q['without_agent']:.2f} s; the utilization "
                f"expression alone {q['utilization']:.2f} s"
                + (f"; the first poll's {q['first_poll']:.2f} s" if q.get("first_poll") else "")
                + ")",
            )
        )
    out.append(
        (
            f"agent mode: a poll's wall time at N={big.n:,} < the default poll interval "
            f"({DEFAULT_POLL_INTERVAL_S:g} s)",
            g.wall_s < DEFAULT_POLL_INTERVAL_S,
            f"{g.wall_s:.2f} s",
        )
    )
    ten = next((r for r in results if r.n == 10_000), None)
    if ten is not None:
        worst = max(ten.ghostgpu.cpu_s, ten.ghostgpu.cycle_cpu_s or 0.0)
        out.append(
            (
                f"no regression at N=10,000: CPU per poll and per cycle <= {CPU_10K_TARGET_S:g} s",
                worst <= CPU_10K_TARGET_S,
                f"{ten.ghostgpu.cpu_s:.3f} s in the poll, {ten.ghostgpu.cycle_cpu_s or 0:.3f} s per cycle",
            )
        )
    audited = [r for r in results if (r.budget or {}).get("controller", {}).get("requests")]
    if audited:
        out.append(
            (
                "the apiserver's audit log shows the controller within its budget (peak burst <= burst + 1)",
                # + 1: the log has the server's receive times; a request delayed on its way by one
                # token's interval (50 ms at 20 qps) arrives closer to the next one than it left.
                all(r.budget["controller"]["peak_burst"] <= r.budget["burst"] + 1 for r in audited),
                ", ".join(
                    f"N={r.n:,}: {r.budget['controller']['requests']:,} writes+exec, peak burst "
                    f"{r.budget['controller']['peak_burst']:.1f} of {r.budget['burst']}, "
                    f"at most {r.budget['controller']['max_per_s']} in 1 s"
                    for r in audited
                ),
            )
        )
    return out + idle_session_targets(results)


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
        execs = [(r.n, getattr(r.exec_mode, attr)) for r in results if r.exec_mode is not None]
        if execs and attr != "prometheus_queries":  # one query in both modes: one line
            ex, ey = zip(*execs, strict=True)
            ax.plot(
                ex,
                [max(y, 0.5) if attr == "exec_calls" else y for y in ey],
                "d-.",
                color="tab:purple",
                label="ghostgpu, exec mode",
            )
        if attr == "exec_calls":  # none in agent mode: drawn at 0.5 on the log axis, labelled
            mine = [max(y, 0.5) for y in mine]
        ax.plot(
            ns,
            mine,
            "o-",
            color="tab:blue",
            label="ghostgpu, agent mode" + (" (0)" if attr == "exec_calls" else ""),
        )
        for r, y in zip(results, theirs, strict=True):
            if r.naive.extrapolated_from and attr != "peak_rss_mib":  # RSS is measured, not scaled
                ax.annotate("extrapolated", (r.n, y), textcoords="offset points", xytext=(-30, 6), fontsize=7)
        if attr == "cpu_s":
            floors = [(r.n, r.floor_s) for r in results if r.floor_s]
            if floors:
                fx, fy = zip(*floors, strict=True)
                ax.plot(fx, fy, "^:", color="grey", label="floor of one poll (same run)")
                ax.plot(
                    fx,
                    [y * FLOOR_RATIO_TARGET for y in fy],
                    ":",
                    color="tab:green",
                    label="target: 10x floor",
                )
        if attr == "peak_rss_mib":
            target = f"target {RSS_TARGET_MB:g} MB at the largest N"
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
