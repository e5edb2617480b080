"""Human renderings of a `BenchResult`: rich tables for the terminal, Markdown for docs/bench.md."""

from __future__ import annotations

from rich.table import Table

from ghostgpu.sim.runner import BenchResult

TABLE_HEADERS = (
    "detector",
    "TP",
    "FP",
    "TN",
    "FN",
    "FPR",
    "published",
    "Δ",
    "recall",
    "published",
    "Δ",
    "precision",
    "accuracy",
    "published",
    "Δ",
)


def pct(value: float | None) -> str:
    return "—" if value is None else f"{100 * value:.2f}%"


def pp(value: float | None) -> str:
    """A difference in percentage points, signed."""
    return "—" if value is None else f"{100 * value:+.2f} pp"


def headline(result: BenchResult) -> str:
    c = result.config
    seeds = c.seed_list
    named = f"seed {seeds[0]}" if len(seeds) == 1 else f"seeds {seeds[0]}-{seeds[-1]}"
    plural = "seed" if c.seeds == 1 else "seeds"
    return (
        f"{c.total_instances:,} instances = {c.seeds} {plural} x {c.instances:,} ({named}), window {c.window}"
    )


def detector_rows(result: BenchResult) -> list[tuple[str, ...]]:
    rows = []
    for d in result.detectors:
        c, p = d.confusion, d.published
        rows.append(
            (
                d.label,
                f"{c.tp:,}",
                f"{c.fp:,}",
                f"{c.tn:,}",
                f"{c.fn:,}",
                pct(c.fpr),
                pct(p and p.fpr),
                pp(d.fpr_diff),
                pct(c.recall),
                pct(p and p.recall),
                pp(d.recall_diff),
                pct(c.precision),
                pct(c.accuracy),
                pct(p and p.accuracy),
                pp(d.accuracy_diff),
            )
        )
    return rows


def beyond_lines(result: BenchResult) -> list[str]:
    b = result.beyond
    kinds = ", ".join(f"{k} {n:,}" for k, n in b.ghostgpu_kinds_of_missed.items()) or "none"
    signals = ", ".join(
        f"{r} {b.ghostgpu_reasons_of_missed.get(r, 0):,}"
        for r in ("defunct-only", "fault-xid", "fault-restart")
    )
    return [
        f"The published multi-signal rule keeps {b.paper_missed:,} of {b.zombies:,} crashed workloads "
        f"({b.paper_missed_with_defunct_child:,} of them because a defunct child was counted as a process).",
        f"The ghostgpu rule reclaims {b.ghostgpu_reclaimed_of_missed:,} of those {b.paper_missed:,}: "
        f"{kinds} (evidence: {signals}).",
    ]


def kind_matrix_rows(result: BenchResult) -> tuple[list[str], list[tuple[str, ...]]]:
    matrix = result.beyond.ghostgpu_kind_matrix
    kinds = ["ACTIVE", "IDLE_HELD", "UNKNOWN", "FINISHED_IDLE", "ZOMBIE_CRASHED"]
    rows = [(truth, *(f"{matrix[truth].get(k, 0):,}" for k in kinds)) for truth in matrix]
    return ["ground truth / ghostgpu verdict", *kinds], rows


def fault_rows(result: BenchResult) -> list[tuple[str, ...]]:
    if result.faults is None:
        return []
    return [
        (
            d.label,
            f"{d.false_reclaims:,}",
            f"{d.unknown:,}",
            pct(d.confusion.recall),
            f"{d.silent_false_reclaims:,}",
        )
        for d in result.faults.detectors
    ]


FAULT_HEADERS = (
    "detector",
    "false reclaims",
    "UNKNOWN (kept)",
    "recall",
    "false reclaims if failures read as 0",
)


EXTENDED_HEADERS = ("detector", "false reclaims", "of them periodic jobs", "FPR", "recall", "accuracy")


def extended_intro(result: BenchResult) -> str:
    e = result.extended
    assert e is not None
    return (
        f"Extension beside the published model: the same fleet plus {e.periodic_jobs:,} periodic GPU jobs "
        f"(ACTIVE; {e.asleep:,} of them asleep between two runs for the whole window: a shell loop's "
        "`sleep 3600`, a cron daemon). The published table above does not include them."
    )


def extended_rows(result: BenchResult) -> list[tuple[str, ...]]:
    if result.extended is None:
        return []
    return [
        (
            r.label,
            f"{r.confusion.fp:,}",
            f"{r.periodic_false_reclaims:,}",
            pct(r.confusion.fpr),
            pct(r.confusion.recall),
            pct(r.confusion.accuracy),
        )
        for r in result.extended.rows
    ]


def fault_summary(result: BenchResult) -> str:
    f = result.faults
    assert f is not None
    return (
        f"Fault rate {f.rate:g}: {f.failed_utilization_samples:,} failed utilization samples, "
        f"{f.failed_process_listings:,} failed process listings, "
        f"{f.failed_artifact_reads:,} failed artifact reads."
    )


# --- rich ----------------------------------------------------------------------------------------


def rich_tables(result: BenchResult) -> list[Table | str]:
    """Transposed for the terminal (a column per detector) so it fits 80 columns."""
    out: list[Table | str] = []
    main = Table(title=f"Ghost-occupancy benchmark: {headline(result)}", title_justify="left")
    main.add_column("metric")
    for d in result.detectors:
        main.add_column(d.key, justify="right")
    rows = detector_rows(result)
    for i, name in enumerate(TABLE_HEADERS[1:], start=1):
        shown = name if name not in ("published", "Δ") else f"  {name}"
        main.add_row(shown, *(row[i] for row in rows), end_section=name == "FN" or (name == "Δ" and i < 12))
    out.append(main)
    out.extend(f"{d.key}: {d.label}" for d in result.detectors)

    headers, mrows = kind_matrix_rows(result)
    matrix = Table(title="Beyond the publication: the default rule's verdicts", title_justify="left")
    matrix.add_column("truth / verdict", no_wrap=True)
    for h in headers[1:]:
        matrix.add_column(h.replace("_", " "), justify="right")
    for row in mrows:
        matrix.add_row(*row)
    out.append(matrix)
    out.extend(beyond_lines(result))

    if result.faults is not None:
        faults = Table(title="Under injected signal faults", title_justify="left")
        faults.add_column("detector", no_wrap=True)
        for h in FAULT_HEADERS[1:]:
            faults.add_column(h, justify="right")
        for d, row in zip(result.faults.detectors, fault_rows(result), strict=True):
            faults.add_row(d.key, *row[1:])
        out.append(faults)
        out.append(fault_summary(result))
    if result.extended is not None:
        ext = Table(title="Extension: the fleet plus periodic jobs", title_justify="left")
        ext.add_column("detector", no_wrap=True)
        for h in EXTENDED_HEADERS[1:]:
            ext.add_column(h, justify="right")
        for r, row in zip(result.extended.rows, extended_rows(result), strict=True):
            ext.add_row(r.key, *row[1:])
        out.append(ext)
        out.append(extended_intro(result))
    return out


# --- markdown ------------------------------------------------------------------------------------


def _md_table(headers: tuple[str, ...] | list[str], rows: list[tuple[str, ...]]) -> list[str]:
    right = "---:"
    lines = ["| " + " | ".join(headers) + " |", "|---|" + "|".join(right for _ in headers[1:]) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def markdown(result: BenchResult) -> str:
    lines = [f"{headline(result)}.", ""]
    lines += _md_table(TABLE_HEADERS, detector_rows(result))
    lines += ["", "Beyond the publication: the default rule's verdicts on the same fleet.", ""]
    headers, rows = kind_matrix_rows(result)
    lines += _md_table(headers, rows)
    lines += ["", *(f"- {line}" for line in beyond_lines(result))]
    if result.faults is not None:
        lines += ["", f"Under injected signal faults. {fault_summary(result)}", ""]
        lines += _md_table(FAULT_HEADERS, fault_rows(result))
    if result.extended is not None:
        lines += ["", extended_intro(result), ""]
        lines += _md_table(EXTENDED_HEADERS, extended_rows(result))
    return "\n".join(lines) + "\n"
