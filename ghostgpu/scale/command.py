"""`ghostgpu bench scale`: run (or re-render from a saved JSON) and print the table, targets, plot."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

from ghostgpu.scale.backends import backends_markdown
from ghostgpu.scale.bench import BenchConfig, from_json, run_scale, to_json
from ghostgpu.scale.report import (
    budget_markdown,
    exec_markdown,
    floor_markdown,
    idle_sessions_markdown,
    markdown,
    plot,
    prometheus_markdown,
    sizing_markdown,
    targets,
    warmup_markdown,
)


def run_scale_command(
    sizes: Sequence[int],
    *,
    nodes: int,
    idle_fraction: float,
    steady_polls: int,
    naive_sample: int,
    state_dir: Path,
    json_out: Path | None,
    from_json_file: Path | None,
    plot_path: Path | None,
    echo: Callable[[str], None] = print,
    backends: Sequence[str] = ("prometheus",),
    idle_sessions: bool = False,
    session_fraction: float = 0.5,
) -> int:
    if from_json_file is not None:
        text = from_json_file.read_text()  # a missing file: FileNotFoundError, named by the boundary
        try:
            data = json.loads(text)
            results = from_json(data)
            data["config"]  # read below: a file without it is not a saved run
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            from ghostgpu.boundary import input_error

            raise input_error(
                f"--from-json {from_json_file}: not results saved by --json-out "
                f"({type(exc).__name__}: {exc})",
                "give a file written by `ghostgpu bench scale --json-out FILE` (benchmarks/results/)",
            ) from None
    else:
        cfg = BenchConfig(
            sizes=tuple(sorted(set(sizes))),
            nodes=nodes,
            idle_fraction=idle_fraction,
            steady_polls=steady_polls,
            naive_sample=naive_sample,
            state_dir=state_dir,
            backends=tuple(backends),
            idle_sessions=idle_sessions,
            session_fraction=session_fraction,
        )
        results = run_scale(cfg)
        data = to_json(results, cfg)
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    c = data["config"]
    echo(
        f"{', '.join(f'{r.n:,}' for r in results)} tracked GPU pods on {c['nodes']:,} kwok GPU nodes, "
        f"idle fraction {c['idle_fraction']:g}; steady-state medians over {c['steady_polls']} polls "
        f"after a {c['window'] + 1}-poll warm-up.\n"
    )
    echo(markdown(results))
    echo(
        "Agent mode against the floor of one poll, measured in the same run (parse one Prometheus "
        "answer with the reading, oldest sample time and GPU memory of all N pods, 3 series per pod, "
        "with orjson and map each sample to its pod; CPU seconds), and beside it, labelled apart, the "
        "same answer with the node agent's series of every pod's container too:\n"
    )
    echo(floor_markdown(results))
    echo(
        "What the poll's query and the node agent cost the bench's Prometheus (series in its head "
        "block; the agent's per-container series by container; each query's best wall time of 3 "
        "rounds, sent in turn):\n"
    )
    echo(prometheus_markdown(results))
    echo("Sizing, from the same run (agent mode):\n")
    echo(sizing_markdown(results))
    echo(
        "Exec mode beside agent mode (the same controller with processSource: exec, `ps` exec'd into "
        "each idle candidate; extra CPU: exec mode's steady cycle minus agent mode's, per idle "
        "candidate):\n"
    )
    echo(exec_markdown(results))
    echo(
        "The first-verdict poll against the apiserver budget (budgeted: writes and exec; the audit "
        "columns are the apiserver's own log of the controller's writes and exec over its whole run):\n"
    )
    echo(budget_markdown(results))
    echo(
        "Warm-up polls (polls 1..K-1 fill the windows and write nothing; poll K records the first "
        "verdicts that are findings: a dry-run, the write and Events per workload; a first ACTIVE "
        "verdict is not written):\n"
    )
    echo(warmup_markdown(results))
    if any(r.idle_sessions is not None for r in results):
        echo(
            "Idle sessions (the agent-mode controller again with controller.idleSessions in shadow "
            "mode, against the same fleet right after the run without it; the history query's count "
            "and wall time per steady poll in the controller, and the same query timed against the "
            "bench's Prometheus, best of 3, with Prometheus's own execution time and samples read):\n"
        )
        echo(idle_sessions_markdown(results))
    if any(r.backends for r in results):
        echo(
            f"Metrics stores (the tables above: {results[0].backend}): the agent-mode controller's "
            "steady poll against each, the poll's query as the store answers it (median of 3) and "
            "the store's memory after the run:\n"
        )
        echo(backends_markdown(results))
    ok = True
    for name, met, evidence in targets(results):
        echo(f"- [{'x' if met else ' '}] {name}: {evidence}")
        ok = ok and met
    if plot_path is not None:
        plot(results, plot_path)
        echo(f"\nplot: {plot_path}")
    return 0 if ok else 1
