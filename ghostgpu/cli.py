"""The `ghostgpu` command line. Each command imports its implementation lazily so that
`ghostgpu render` never pays for kr8s or matplotlib."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from typer.core import TyperGroup

from ghostgpu import __version__


class _BoundaryGroup(TyperGroup):
    """The root command every subcommand runs in (also under typer's CliRunner): a failure
    ghostgpu can name (ghostgpu.boundary.explain, a bad flag or argument included) ends in its
    `error:` and `fix:` lines and exit 2, for every command alike; `--debug` keeps the traceback."""

    def make_context(self, info_name: str | None, args: list[str], parent: Any = None, **extra: Any) -> Any:
        # The root's own options (`ghostgpu --bogus`) fail here, before `--debug` is parsed.
        with _boundary("--debug" in args):
            return super().make_context(info_name, args, parent=parent, **extra)

    def invoke(self, ctx: Any) -> Any:
        with _boundary(bool(ctx.params.get("debug"))):
            return super().invoke(ctx)


@contextlib.contextmanager
def _boundary(debug: bool) -> Iterator[None]:
    try:
        yield
    except (typer.Exit, typer.Abort):
        raise  # an exit code the command chose (typer's own exceptions are Exceptions)
    except Exception as exc:
        from ghostgpu.boundary import EXIT_CODE, explain

        lines = None if debug else explain(exc)
        if lines is None:
            raise
        for line in lines:
            print(line, file=sys.stderr)
        raise typer.Exit(EXIT_CODE) from None


app = typer.Typer(
    name="ghostgpu",
    help="Find GPU workloads that bypass Kueue, prove they are idle, and reclaim them safely.",
    cls=_BoundaryGroup,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"ghostgpu {__version__}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version."
    ),
    debug: bool = typer.Option(
        False, "--debug", help="Print the full traceback of a failure instead of its one-line message."
    ),
) -> None:
    """ghostgpu command line."""


# --- render ---


_RENDER_CONFIG = typer.Option(
    None, "-c", "--config", help="ghostgpu.yaml to render (default: the embedded examples/ghostgpu.yaml)."
)
_RENDER_OUT = typer.Option(..., "-o", "--out", help="Directory that receives policies/, kueue/, controller/.")
_RENDER_CHECK = typer.Option(False, "--check", help="Write nothing; exit 1 with a diff if OUT is stale.")


@app.command()
def render(
    config: Path | None = _RENDER_CONFIG, out: Path = _RENDER_OUT, check: bool = _RENDER_CHECK
) -> None:
    """Render the Kyverno, Kueue and controller GitOps bundles from one cluster file."""
    from ghostgpu.render import run_render_command

    code = run_render_command(config, out, check, echo=typer.echo)
    if code:
        raise typer.Exit(code)


# --- bench ---

# A group so that `bench scale` can join; plain `ghostgpu bench` runs the detectors.
bench_app = typer.Typer(
    help="Reproduce the published ghost-occupancy benchmark through the verdict function.",
    invoke_without_command=True,
)
app.add_typer(bench_app, name="bench")

_SEEDS = typer.Option(5, "--seeds", min=1, help="Number of seeds (instances are per seed).")
_FIRST_SEED = typer.Option(0, "--first-seed", min=0, help="First seed; seeds are consecutive.")
_INSTANCES = typer.Option(2000, "--instances", min=1, help="Synthetic workloads per seed.")
_WINDOW = typer.Option(5, "--window", min=1, max=100, help="Utilization window K (samples).")
_FAULT_RATE = typer.Option(
    0.0, "--fault-rate", min=0.0, max=1.0, help="Inject failed readings at this rate; report false reclaims."
)
_JSON = typer.Option(False, "--json", help="Print the full result as JSON.")
_MARKDOWN = typer.Option(False, "--markdown", help="Print Markdown tables (docs/bench.md's).")
_PLOT = typer.Option(None, "--plot", help="Write the FPR-vs-window plot to this PNG.")


def _bench_detectors(
    seeds: int,
    first_seed: int,
    instances: int,
    window: int,
    fault_rate: float,
    as_json: bool,
    as_markdown: bool,
    plot: Path | None,
) -> None:
    from ghostgpu.sim.command import run_detector_command
    from ghostgpu.sim.runner import BenchConfig

    if as_json and as_markdown:
        raise typer.BadParameter("choose one of --json and --markdown")
    config = BenchConfig(
        seeds=seeds, first_seed=first_seed, instances=instances, window=window, fault_rate=fault_rate
    )
    run_detector_command(config, as_json=as_json, as_markdown=as_markdown, plot=plot)


@bench_app.callback()
def bench(
    ctx: typer.Context,
    seeds: int = _SEEDS,
    first_seed: int = _FIRST_SEED,
    instances: int = _INSTANCES,
    window: int = _WINDOW,
    fault_rate: float = _FAULT_RATE,
    as_json: bool = _JSON,
    as_markdown: bool = _MARKDOWN,
    plot: Path | None = _PLOT,
) -> None:
    """Run the detector benchmark (the same as `ghostgpu bench detectors`)."""
    if ctx.invoked_subcommand is None:
        _bench_detectors(seeds, first_seed, instances, window, fault_rate, as_json, as_markdown, plot)


@bench_app.command("detectors")
def bench_detectors(
    seeds: int = _SEEDS,
    first_seed: int = _FIRST_SEED,
    instances: int = _INSTANCES,
    window: int = _WINDOW,
    fault_rate: float = _FAULT_RATE,
    as_json: bool = _JSON,
    as_markdown: bool = _MARKDOWN,
    plot: Path | None = _PLOT,
) -> None:
    """Detector table: TP/FP/TN/FN, FPR, recall, precision, accuracy beside the published figures."""
    _bench_detectors(seeds, first_seed, instances, window, fault_rate, as_json, as_markdown, plot)


_SC_SIZES = typer.Option("100,1000,10000,50000", "--sizes", help="Comma-separated fleet sizes N.")
_SC_NODES = typer.Option(
    0, "--nodes", min=0, help="kwok GPU nodes (8 GPUs each); 0: enough for the largest N (6,250 for 50,000)."
)
_SC_IDLE = typer.Option(0.01, "--idle-fraction", min=0.0, max=1.0, help="Fraction of idle pods.")
_SC_STEADY = typer.Option(3, "--steady-polls", min=1, help="Measured polls after the warm-up.")
_SC_SAMPLE = typer.Option(1000, "--naive-sample", min=1, help="The baseline visits at most this many pods.")
_SC_STATE = typer.Option(Path("/tmp/ghostgpu-scale"), "--state-dir", help="Cluster state and logs.")
_SC_JSON_OUT = typer.Option(None, "--json-out", help="Save the raw results here.")
_SC_FROM_JSON = typer.Option(None, "--from-json", help="Re-render saved results instead of running.")
_SC_PLOT = typer.Option(None, "--plot", help="Write the log-log cost plot (PNG).")
_SC_IDLE_SESSIONS = typer.Option(
    False,
    "--idle-sessions",
    help="Make a share of the idle pods idle Jupyter sessions (IDLE_HELD) and run the agent-mode "
    "controller once more with controller.idleSessions in shadow mode: the history query's cost per "
    "poll, in the controller and in Prometheus (docs/idle-sessions.md).",
)
_SC_SESSION_FRACTION = typer.Option(
    0.5, "--session-fraction", min=0.0, max=1.0, help="With --idle-sessions: the idle pods that are sessions."
)
_SC_BACKEND = typer.Option(
    "prometheus",
    "--backend",
    help="Comma-separated metrics stores, prometheus and/or victoriametrics: the first is measured in "
    "full, each other one runs the agent-mode controller again (one store runs at a time).",
)


@bench_app.command("scale")
def bench_scale(
    sizes: str = _SC_SIZES,
    nodes: int = _SC_NODES,
    idle_fraction: float = _SC_IDLE,
    steady_polls: int = _SC_STEADY,
    naive_sample: int = _SC_SAMPLE,
    state_dir: Path = _SC_STATE,
    json_out: Path | None = _SC_JSON_OUT,
    from_json: Path | None = _SC_FROM_JSON,
    plot: Path | None = _SC_PLOT,
    backend: str = _SC_BACKEND,
    idle_sessions: bool = _SC_IDLE_SESSIONS,
    session_fraction: float = _SC_SESSION_FRACTION,
) -> None:
    """Scale bench: per-poll cost of the controller vs a naive cron script at each N.

    CPU is judged against the floor of one poll measured in the same run, on the same machine.

    The first-verdict poll is checked against the apiserver budget in the apiserver's audit log.
    """
    from ghostgpu.boundary import input_error
    from ghostgpu.extras import require

    try:
        fleet_sizes = [int(s) for s in sizes.split(",") if s.strip()]
    except ValueError:
        fleet_sizes = []
    if not fleet_sizes or min(fleet_sizes) < 1:
        raise input_error(f"--sizes {sizes!r}: expected fleet sizes >= 1", "give e.g. --sizes 100,1000")
    from ghostgpu.scale.backends import parse_backends

    try:
        stores = parse_backends(backend)
    except ValueError as exc:
        raise input_error(
            f"--backend {backend!r}: {exc}", "give e.g. --backend prometheus,victoriametrics"
        ) from None
    require("kubernetes", "devcluster", "ghostgpu bench scale")  # it runs the local test cluster
    from ghostgpu.scale.command import run_scale_command

    code = run_scale_command(
        fleet_sizes,
        nodes=nodes,
        idle_fraction=idle_fraction,
        steady_polls=steady_polls,
        naive_sample=naive_sample,
        state_dir=state_dir,
        json_out=json_out,
        from_json_file=from_json,
        plot_path=plot,
        echo=typer.echo,
        backends=stores,
        idle_sessions=idle_sessions,
        session_fraction=session_fraction,
    )
    if code:
        raise typer.Exit(code)


# --- calibrate ---

_CAL_INCIDENTS = typer.Option(
    None, "--incidents", help="YAML/CSV rows: manifest, action, incident_type, dangerous (default: built-in)."
)
_CAL_CONFIG = typer.Option(
    None, "-c", "--config", help="ghostgpu.yaml whose controller.autonomy weights score the events."
)
_CAL_CEILING = typer.Option(None, "--ceiling", min=0.0, max=1.0, help="Max catastrophic rate [0.02].")
_CAL_FAST = typer.Option(None, "--autonomous-latency", min=0.001, help="Seconds to repair acting alone [40].")
_CAL_SLOW = typer.Option(None, "--escalation-latency", min=0.001, help="Seconds to repair escalated [1200].")
_CAL_STEP = typer.Option(None, "--step", min=0.001, max=1.0, help="tau grid step [0.025].")
_CAL_PER_TYPE = typer.Option(
    None, "--per-type-ceiling", help="pooled: ceiling on the whole per-type policy [pooled]; each: per type."
)
_CAL_JSON = typer.Option(False, "--json", help="Print the full result as JSON.")
_CAL_PLOT = typer.Option(None, "--plot", help="Write MTTR reduction and catastrophic rate vs tau (PNG).")


@app.command()
def calibrate(
    incidents: Path | None = _CAL_INCIDENTS,
    config: Path | None = _CAL_CONFIG,
    ceiling: float | None = _CAL_CEILING,
    autonomous_latency: float | None = _CAL_FAST,
    escalation_latency: float | None = _CAL_SLOW,
    step: float | None = _CAL_STEP,
    per_type_ceiling: str | None = _CAL_PER_TYPE,
    as_json: bool = _CAL_JSON,
    plot: Path | None = _CAL_PLOT,
) -> None:
    """Choose the risk-gate thresholds: sweep tau, keep the catastrophic rate under the ceiling."""
    from ghostgpu.calibration.command import run_calibrate_command

    code = run_calibrate_command(
        incidents,
        config,
        ceiling,
        autonomous_latency,
        escalation_latency,
        step,
        per_type_ceiling,
        as_json,
        plot,
        typer.echo,
    )
    if code:
        raise typer.Exit(code)


# --- dashboard ---

dashboard_app = typer.Typer(
    help="The controller's Grafana dashboard (rendered into controller/).", no_args_is_help=True
)
app.add_typer(dashboard_app, name="dashboard")


@dashboard_app.command("json")
def dashboard_json() -> None:
    """Print the Grafana dashboard JSON (the one in controller/grafana-dashboard.yaml)."""
    import json

    from ghostgpu.render import grafana_dashboard

    typer.echo(json.dumps(grafana_dashboard(), indent=2, ensure_ascii=False))


_DP_PROM = typer.Option(None, "--prometheus", help="Prometheus base URL, e.g. http://127.0.0.1:9090.")
_DP_OUT = typer.Option(..., "-o", "--out", help="PNG to write.")
_DP_START = typer.Option(None, "--start", help="Range start, unix seconds [end - --minutes].")
_DP_END = typer.Option(None, "--end", help="Range end, unix seconds [now].")
_DP_MINUTES = typer.Option(15.0, "--minutes", min=0.1, help="Range length when --start is not given.")
_DP_JSON = typer.Option(
    None, "--json-out", help="Also save the query results here (redraw with --from-json)."
)
_DP_FROM = typer.Option(None, "--from-json", help="Draw saved query results instead of querying Prometheus.")


@dashboard_app.command("preview")
def dashboard_preview(
    prometheus: str | None = _DP_PROM,
    out: Path = _DP_OUT,
    start: float | None = _DP_START,
    end: float | None = _DP_END,
    minutes: float = _DP_MINUTES,
    json_out: Path | None = _DP_JSON,
    from_json: Path | None = _DP_FROM,
) -> None:
    """Run every panel's PromQL against a Prometheus and draw the dashboard into a PNG."""
    from ghostgpu.dashboard.preview import run_preview_command

    code = run_preview_command(prometheus, out, start, end, minutes, json_out, from_json, echo=typer.echo)
    if code:
        raise typer.Exit(code)


# --- doctor ---

_DOC_CONFIG = typer.Option(
    None,
    "-c",
    "--config",
    help="ghostgpu.yaml the bundles were rendered from (default: the embedded example).",
)
_DOC_KUBECONFIG = typer.Option(
    None, "--kubeconfig", help="Kubeconfig file (default: KUBECONFIG, ~/.kube/config)."
)
_DOC_PROM = typer.Option(
    None, "--prometheus-url", help="Override controller.prometheus.url (e.g. a port-forward to it)."
)
_DOC_JSON = typer.Option(False, "--json", help="Print the rows as JSON (for CI).")


@app.command()
def doctor(
    config: Path | None = _DOC_CONFIG,
    kubeconfig: str | None = _DOC_KUBECONFIG,
    prometheus_url: str | None = _DOC_PROM,
    as_json: bool = _DOC_JSON,
) -> None:
    """Check, read-only, what ghostgpu needs from this cluster and its Prometheus: one row per
    prerequisite (ok, warn, fail, skip) with what was found and the fix; exit 1 when a row fails."""
    from ghostgpu.doctor.command import run_doctor_command

    code = run_doctor_command(config, kubeconfig, prometheus_url, as_json, echo=typer.echo)
    if code:
        raise typer.Exit(code)


# --- agent ---

_AGENT_CONFIG = typer.Option(None, "--config", "-c", help="ghostgpu.yaml (the controller's ConfigMap).")
_AGENT_NODE = typer.Option(
    ..., "--node-name", envvar="NODE_NAME", help="This node (downward API spec.nodeName)."
)
_AGENT_PROC = typer.Option(Path("/proc"), "--proc", help="The host's proc root (hostPID: /proc).")
_AGENT_LISTEN = typer.Option("0.0.0.0:9402", "--listen", help="HOST:PORT of /metrics, /healthz, /readyz.")
_AGENT_INTERVAL = typer.Option(15.0, "--interval", help="Seconds between scans.")
_AGENT_KUBECONFIG = typer.Option(None, "--kubeconfig", help="Kubeconfig file (default: in-cluster).")


@app.command()
def agent(
    config: Path | None = _AGENT_CONFIG,
    node_name: str = _AGENT_NODE,
    proc: Path = _AGENT_PROC,
    listen: str = _AGENT_LISTEN,
    interval: float = _AGENT_INTERVAL,
    kubeconfig: str | None = _AGENT_KUBECONFIG,
) -> None:
    """Run the node agent: the processes of this node's GPU containers, read from the host's proc
    root and classified with controller.processes, exported as Prometheus series (no exec)."""
    from ghostgpu.agent.command import run_agent_command

    code = run_agent_command(config, node_name, proc, listen, interval, kubeconfig, echo=typer.echo)
    if code:
        raise typer.Exit(code)


# --- devcluster ---
from ghostgpu.devcluster.cli import app as _devcluster_app  # noqa: E402 (typer + stdlib at import)

app.add_typer(_devcluster_app, name="devcluster")

# --- controller, status, report, restore ---
from ghostgpu.controller.cli import register as _register_controller  # noqa: E402 (typer only at import)

_register_controller(app)


if __name__ == "__main__":
    app()
