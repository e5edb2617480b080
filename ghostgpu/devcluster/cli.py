"""`ghostgpu devcluster up|down|status`."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from ghostgpu.extras import require

app = typer.Typer(help="A local GPU test cluster: real control plane, kwok GPU nodes, Kueue, Kyverno.")

_STATE = typer.Option(None, "--state-dir", help="State directory (default ~/.cache/ghostgpu/cluster).")


def kueue_release() -> str:
    """The Kueue release `up` would run; GHOSTGPU_KUEUE_VERSION that names none is an input error."""
    from ghostgpu.boundary import input_error
    from ghostgpu.devcluster.paths import KUEUE_VERSION_ENV, kueue_version, read_versions

    versions = read_versions()
    try:
        return kueue_version(versions)
    except ValueError as e:
        raise input_error(
            str(e), f"unset {KUEUE_VERSION_ENV}, or set it to a release hack/testbin built (e.g. v0.17.0)"
        ) from None


def _up_kind(state_dir: Path | None, bundles: bool) -> None:
    """`up --provider kind`: a kind cluster (Docker, else podman) from images built here."""
    from ghostgpu.boundary import input_error
    from ghostgpu.devcluster import kind

    t0 = time.monotonic()
    try:
        cluster = kind.up(state_dir, bundles=bundles, log=lambda m: typer.echo(m, err=True))
    except kind.KindError as e:
        raise input_error(
            f"devcluster up --provider kind: {e}",
            "hack/testbin kind kind-node kyverno-init, then see docs/kind.md for what the host needs",
        ) from e
    typer.echo(f"kind cluster {cluster.name!r} ({cluster.engine}) ready in {time.monotonic() - t0:.1f}s")
    typer.echo(f"export KUBECONFIG={cluster.kubeconfig}")


@app.command()
def up(
    state_dir: Path | None = _STATE,
    provider: str = typer.Option(
        "local",
        help="local (binaries from hack/testbin) or kind (a kind cluster with Docker or podman, "
        "Kueue and Kyverno in-cluster; docs/kind.md).",
    ),
    no_kueue: bool = typer.Option(False, "--no-kueue", help="Skip the Kueue manager and CRDs."),
    no_kyverno: bool = typer.Option(False, "--no-kyverno", help="Skip the Kyverno controllers and CRDs."),
    no_prometheus: bool = typer.Option(False, "--no-prometheus", help="Skip Prometheus and fake dcgm."),
    metrics_store: str = typer.Option(
        "prometheus",
        "--metrics-store",
        help="What scrapes the fake dcgm-exporter and answers queries: prometheus or victoriametrics "
        "(VictoriaMetrics' single-node server from hack/testbin, on the same port).",
    ),
    no_real_node: bool = typer.Option(
        False,
        "--no-real-node",
        help="Skip the real node (kubelet, containerd, runc: real pods and processes).",
    ),
    bundles: bool = typer.Option(
        False, "--bundles", help="Then server-side apply kueue/ policies/ controller/."
    ),
) -> None:
    """Start the cluster (reuses a running one) and print its kubeconfig path.

    Kueue is hack/versions.env's KUEUE_VERSION; GHOSTGPU_KUEUE_VERSION=v0.17.0 (built by
    `hack/testbin kueue@v0.17.0`) starts another release."""
    require("kubernetes", "devcluster", "ghostgpu devcluster")
    from ghostgpu.boundary import input_error
    from ghostgpu.devcluster.cluster import ALL_ADDONS, DevCluster, status_lines
    from ghostgpu.devcluster.paths import TESTBIN_FIX

    if provider == "kind":
        _up_kind(state_dir, bundles)
        return
    if provider != "local":
        raise input_error(f"--provider {provider!r}: unknown", "give --provider local (the default) or kind")
    kueue_release()  # a bad GHOSTGPU_KUEUE_VERSION is refused before anything starts
    from ghostgpu.devcluster.victoriametrics import METRICS_STORES

    if metrics_store not in METRICS_STORES:
        raise input_error(
            f"--metrics-store {metrics_store!r}: unknown", f"give one of {', '.join(METRICS_STORES)}"
        )
    skip = {"kueue": no_kueue, "kyverno": no_kyverno, "prometheus": no_prometheus}
    addons = tuple(a for a in ALL_ADDONS if not skip[a])
    t0 = time.monotonic()
    try:
        cluster = DevCluster.up(
            state_dir, addons=addons, real_node=not no_real_node, metrics_store=metrics_store
        )
    except FileNotFoundError as e:
        raise input_error(f"devcluster up: {e}", TESTBIN_FIX) from e
    except (RuntimeError, TimeoutError, ValueError) as e:
        raise input_error(
            f"devcluster up failed: {e}",
            "read the component's log under the state directory's logs/, then "
            "`ghostgpu devcluster down` and up again (docs/devcluster.md)",
        ) from e
    for line in status_lines(cluster.state):
        typer.echo(line)
    if cluster.state.real_node_error:
        typer.echo(
            "devcluster up: the real node did not start (the rest of the cluster runs; "
            "--no-real-node starts without it)",
            err=True,
        )
        raise typer.Exit(1)
    if bundles:
        from ghostgpu.devcluster.bundles import apply_bundles

        errors = [e for errs in apply_bundles(cluster.kube).values() for e in errs]
        for e in errors:
            typer.echo(f"refused: {e}", err=True)
        if errors:
            raise typer.Exit(1)
        typer.echo("applied the rendered bundles: kueue/ policies/ controller/")
    typer.echo(f"ready in {time.monotonic() - t0:.1f}s; export KUBECONFIG={cluster.state.kubeconfig}")


@app.command()
def down(
    state_dir: Path | None = _STATE,
    provider: str = typer.Option("local", help="local, or kind (deletes the kind cluster)."),
) -> None:
    """Stop every process of the cluster and free its ports."""
    require("kubernetes", "devcluster", "ghostgpu devcluster")
    if provider == "kind":
        from ghostgpu.devcluster import kind

        gone = kind.down(state_dir)
        typer.echo("deleted the kind cluster" if gone else "no kind cluster was running")
        return
    from ghostgpu.devcluster.cluster import down as _down

    stopped = _down(state_dir)
    typer.echo(f"stopped: {', '.join(stopped) if stopped else 'nothing was running'}")


@app.command()
def status(state_dir: Path | None = _STATE) -> None:
    """Tell what runs; exit 1 unless every process of the cluster is up."""
    require("kubernetes", "devcluster", "ghostgpu devcluster")
    from ghostgpu.devcluster.cluster import status as _status
    from ghostgpu.devcluster.cluster import status_lines

    state = _status(state_dir)
    for line in status_lines(state):
        typer.echo(line)
    if state is None or not all(state.running().values()):
        raise typer.Exit(1)


_DEMO_STATE = typer.Option(
    None,
    "--state-dir",
    help="State directory (default ~/.cache/ghostgpu/demo; with --provider kind ~/.cache/ghostgpu/kind).",
)


@app.command()
def demo(
    state_dir: Path | None = _DEMO_STATE,
    keep: bool = typer.Option(False, "--keep", help="Leave the cluster up afterwards, for exploring."),
    polls: int = typer.Option(
        5, "--polls", min=1, help="Shadow-mode polls to show before enforcing (local provider)."
    ),
    provider: str = typer.Option(
        "local",
        help="local (the devcluster's real node: a fleet, shadow then enforce, a Kueue Job) or kind "
        "(one ghost on a kind cluster with Docker or podman, the rendered bundles applied, the "
        "controller in the cluster; state default ~/.cache/ghostgpu/kind; docs/kind.md).",
    ),
) -> None:
    """Watch the controller catch ghosts: a fleet on the real node judged in shadow mode
    (verdicts, `ghostgpu status`, `ghostgpu report`), then enforced (ghosts stopped, a waiting Kueue
    Job admitted), then one restored. Cleans up completely unless --keep. Needs root and hack/testbin.

    --provider kind: a kind cluster as `devcluster up --provider kind` makes it, the bundles
    rendered and applied as a user would, one finished notebook opted in, stopped by the controller
    in the cluster, then restored."""
    require("kubernetes", "devcluster", "ghostgpu devcluster")
    from rich.console import Console

    from ghostgpu.boundary import input_error

    if provider not in ("local", "kind"):
        raise input_error(f"--provider {provider!r}: unknown", "give --provider local (the default) or kind")
    console = Console()
    if not console.is_terminal:
        console = Console(width=140)  # a log or CI: wide enough that tables keep one row a line
    try:
        if provider == "kind":
            from ghostgpu.devcluster import kind_demo

            kind_demo.run(state_dir, keep=keep, console=console)  # DemoError: error:/fix:, exit 2
            return
        from ghostgpu.devcluster.demo import run

        run(state_dir, keep=keep, polls=polls, console=console)  # DemoError: error:/fix:, exit 2
    except KeyboardInterrupt:
        typer.echo("devcluster demo: interrupted", err=True)
        raise typer.Exit(130) from None
