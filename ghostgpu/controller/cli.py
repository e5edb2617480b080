"""`ghostgpu controller | status | report | restore` (registered on the main app in ghostgpu/cli.py).
Heavy imports (kr8s, boto3) happen inside the commands so `ghostgpu render` stays fast."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import typer

ConfigOpt = typer.Option(None, "--config", "-c", help="ghostgpu.yaml, or the ConfigMap's controller section.")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
KubeconfigOpt = typer.Option(
    None, "--kubeconfig", help="Kubeconfig file (default: in-cluster or ~/.kube/config)."
)


def controller(
    config: Path | None = ConfigOpt,
    kubeconfig: str | None = KubeconfigOpt,
    mode: str | None = typer.Option(None, "--mode", help="Override controller.mode: shadow or enforce."),
    prometheus_url: str | None = typer.Option(
        None, "--prometheus-url", help="Override controller.prometheus.url."
    ),
    poll_interval: str | None = typer.Option(None, "--poll-interval", help="Override pollInterval, e.g. 5s."),
    startup_grace: str | None = typer.Option(None, "--startup-grace", help="Override startupGrace, e.g. 0s."),
    host: str = typer.Option("0.0.0.0", "--host", help="Address of the /metrics, /healthz, /readyz server."),
    port: int | None = typer.Option(
        None, "--port", min=0, max=65535, help="Port of that server (default controller.port; 0: any free)."
    ),
    identity: str | None = typer.Option(
        None, "--identity", help="Leader-election identity (default POD_NAME)."
    ),
    lease_namespace: str | None = typer.Option(None, "--lease-namespace", help="Namespace of the Lease."),
    lease_duration: float = typer.Option(15.0, "--lease-duration", help="Lease duration in seconds."),
    renew_deadline: float = typer.Option(10.0, "--renew-deadline", help="Leader steps down after this."),
    retry_period: float = typer.Option(2.0, "--retry-period", help="Seconds between lease attempts."),
    decision_log: str = typer.Option(
        "/var/lib/ghostgpu/decisions.jsonl", "--decision-log", help="JSONL decision history ('' = off)."
    ),
    max_polls: int | None = typer.Option(None, "--max-polls", help="Stop after N polls (testing)."),
    kueue_nudge: bool | None = typer.Option(
        None,
        "--kueue-nudge/--no-kueue-nudge",
        help="Override controller.kueueNudge: annotate Nodes freed by a reclaim so Kueue's TAS "
        "retries pending work (needs patch on nodes).",
    ),
    log_level: str = typer.Option(
        "INFO", "--log-level", help="Lowest level logged (JSON lines on stderr): DEBUG, INFO, WARNING, ERROR."
    ),
) -> None:
    """Run the reclaim controller (shadow mode unless the config says enforce)."""
    from ghostgpu.boundary import Override, input_error, validated_overrides
    from ghostgpu.config import ControllerConfig
    from ghostgpu.controller import jsonlog
    from ghostgpu.controller.app import LoadedConfig, load_any_config, run_controller
    from ghostgpu.controller.replica import lease_namespace_of

    if log_level.upper() not in LOG_LEVELS:
        raise input_error(f"--log-level {log_level!r}: not a level", f"give one of {', '.join(LOG_LEVELS)}")
    if not 0 < retry_period < renew_deadline < lease_duration:
        raise input_error(
            f"--retry-period {retry_period:g} < --renew-deadline {renew_deadline:g} < --lease-duration "
            f"{lease_duration:g} does not hold",
            "give the three so that each is shorter than the next (defaults 2 < 10 < 15 seconds)",
        )
    loaded = load_any_config(config)
    lease_namespace_of(lease_namespace, loaded.controller)  # refused before connecting
    flags = [
        Override(key, flag, given)
        for key, flag, given in (
            ("mode", "--mode", mode),
            ("pollInterval", "--poll-interval", poll_interval),
            ("startupGrace", "--startup-grace", startup_grace),
            ("kueueNudge", "--kueue-nudge", kueue_nudge),
        )
        if given is not None
    ]
    if prometheus_url is not None:
        prometheus = loaded.controller.prometheus.model_dump(by_alias=True, mode="json")
        merged = {**prometheus, "url": prometheus_url}
        flags.append(Override("prometheus", "--prometheus-url", prometheus_url, merged))
    if flags:
        base = loaded.controller.model_dump(by_alias=True, mode="json")
        loaded = LoadedConfig(validated_overrides(ControllerConfig, base, flags), loaded.flavors)
    jsonlog.setup(log_level)
    asyncio.run(
        run_controller(
            loaded,
            kubeconfig=kubeconfig,
            identity=identity,
            host=host,
            port=port,
            decision_log=decision_log or None,
            lease_namespace=lease_namespace,
            lease_duration=lease_duration,
            renew_deadline=renew_deadline,
            retry_period=retry_period,
            max_polls=max_polls,
        )
    )


def status(
    config: Path | None = ConfigOpt,
    kubeconfig: str | None = KubeconfigOpt,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    by: str = typer.Option(
        "flavor",
        "--by",
        help="flavor: the accounting gap per flavor; owner: GPUs outside Kueue by top owner kind.",
    ),
) -> None:
    """The accounting gap per GPU flavor: allocatable, admitted by Kueue, held outside Kueue by
    verdict, truly free, and what Kueue believes is free. `--by owner`: the top owner kinds holding
    GPUs outside Kueue, and whether ghostgpu can act on them (a kind it cannot is one to add an
    actuator row for)."""
    from ghostgpu.boundary import input_error
    from ghostgpu.controller.app import load_any_config
    from ghostgpu.controller.ops import status as get_status

    if by not in ("flavor", "owner"):
        raise input_error(f"--by {by!r}: not a grouping", "give --by flavor (the default) or --by owner")
    if by == "owner":
        _status_by_owner(load_any_config(config), kubeconfig, as_json)
        return
    accounts = asyncio.run(get_status(load_any_config(config), kubeconfig=kubeconfig))
    if as_json:
        typer.echo(json.dumps([a.as_dict() for a in accounts], indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title="GPU accounting gap (ghostgpu status)",
        caption="alloc: node allocatable · admitted: Kueue flavorsUsage · outside: held outside Kueue "
        "in opted-in namespaces, by verdict (UNTRACKED_OWNER: GPU pods no tracked workload owns; "
        "counted, never acted on) · reserved: of those, reserved in Kueue by placeholder Workloads "
        "(controller.reservation; admitted includes them) · free: truly free · Kueue free: nominal "
        "quota - admitted · ?: unknown (a DRA flavor whose devices cannot be counted for sure: "
        "`--json` says why in capacityUnknown; or a pod on its nodes whose claims are not known yet)",
    )
    cols = ("flavor", "alloc", "admitted", "outside", "by verdict", "reserved", "free", "Kueue free", "gap")
    for col in cols:
        table.add_column(col, justify="left" if col in ("flavor", "by verdict") else "right", no_wrap=True)
    for a in accounts:
        by = ", ".join(f"{k} {v:g}" for k, v in sorted(a.outside_kueue.items())) or "-"
        table.add_row(
            a.flavor,
            f"{a.allocatable:g}" if a.allocatable_known else "?",
            f"{a.kueue_admitted:g}",
            f"{a.held_outside_kueue:g}",
            by,
            f"{a.reserved_outside:g}",
            f"{a.truly_free:g}" if a.free_known else "?",
            f"{a.kueue_believes_free:g}",
            f"{a.gap:g}" if a.free_known else "?",
        )
    console = Console()
    console.print(table)
    for line in multikueue_lines(accounts):
        console.print(line, highlight=False, soft_wrap=True)


def multikueue_lines(accounts: Any) -> list[str]:
    """What `status` sees of MultiKueue: on a manager, the ClusterQueues the reservation skips and
    why; on a worker, the Workloads a manager sent that Kueue admitted here."""
    skipped: dict[str, str] = {}
    for a in accounts:
        skipped.update(a.reservation_skipped)
    lines = [f"reservation skips ClusterQueue {cq}: {why}" for cq, why in sorted(skipped.items())]
    sent = {a.flavor: a.multikueue_workloads for a in accounts if a.multikueue_workloads}
    if sent:
        per = ", ".join(f"{n} on {flavor}" for flavor, n in sorted(sent.items()))
        lines.append(
            f"MultiKueue worker: Workloads a manager sent, admitted here: {per} (the reservation "
            "counts in this cluster's ClusterQueues as usual)"
        )
    return lines


def _status_by_owner(loaded: Any, kubeconfig: str | None, as_json: bool) -> None:
    from ghostgpu.controller.ops import status_by_owner

    rows = asyncio.run(status_by_owner(loaded, kubeconfig=kubeconfig))
    if as_json:
        typer.echo(json.dumps([r.as_dict() for r in rows], indent=2, sort_keys=True))
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(
        title="GPUs outside Kueue by owner kind (ghostgpu status --by owner)",
        caption="kind, group: the top of the pods' controller chain (two groups may name a kind alike) · "
        "acts: ghostgpu can stop it (no: counted and reserved only; add a row under controller.actuators)",
    )
    for col in ("kind", "group", "acts", "holders", "GPUs"):
        table.add_column(col, justify="left" if col in ("kind", "group") else "right", no_wrap=True)
    for r in rows:
        table.add_row(r.kind, r.group or "(core)", "yes" if r.acts else "no", str(r.holders), f"{r.gpus:g}")
    Console().print(table)


def report(
    source: str = typer.Argument(
        "/var/lib/ghostgpu/decisions.jsonl",
        help="Decision log file, '-' for stdin, or a controller's http://HOST:PORT[/decisions] URL "
        "(the Service or any replica: each answers with the leader's log).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Summarise the shadow-mode decision history: GPU-hours that would have been reclaimed,
    misses (UNKNOWN runs) and whether each cleared on a later poll or persisted."""
    from ghostgpu.boundary import input_error
    from ghostgpu.controller.books.decisions import DecisionLogError, parse_lines, summarize

    if source.startswith(("http://", "https://")):
        text = _fetch_decisions(source)
    elif source == "-":
        text = sys.stdin.read()
    else:
        try:
            text = Path(source).read_text(encoding="utf-8")  # OSError: named by the boundary
        except UnicodeDecodeError as exc:
            why = f"{source}: not a text file ({exc.reason})"
            raise input_error(why, "give the JSONL decision log") from None
    try:
        rep = summarize(parse_lines(text.splitlines()))
    except DecisionLogError as exc:
        raise input_error(
            f"{source}: {exc}",
            "give the controller's decision log (its --decision-log file), '-' for stdin, or its "
            "http://HOST:PORT/decisions URL",
        ) from None
    if as_json:
        typer.echo(json.dumps(rep.as_dict(), indent=2, sort_keys=True))
        return
    typer.echo(f"polls: {rep.polls}   workloads: {rep.workloads}")
    typer.echo(
        "latest verdicts: " + (", ".join(f"{k} {v}" for k, v in sorted(rep.by_verdict.items())) or "-")
    )
    typer.echo(f"GPU-hours that would have been reclaimed: {rep.gpu_hours_would_reclaim:.2f}")
    for k, v in sorted(rep.gpu_hours_by_verdict.items()):
        typer.echo(f"  {k}: {v:.2f}")
    typer.echo(f"would reclaim: {', '.join(rep.would_reclaim_workloads) or '-'}")
    typer.echo(f"misses (UNKNOWN runs, kept): {len(rep.misses)}")
    for m in rep.misses:
        end = f"cleared -> {m.cleared_to}" if m.outcome == "cleared" else "persisted"
        typer.echo(
            f"  {m.workload}: polls {m.from_poll}-{m.to_poll} ({m.polls}) {end}; {', '.join(m.reasons)}"
        )
    typer.echo(f"reversals (reclaimable, later live): {len(rep.reversals)}")
    for r in rep.reversals:
        typer.echo(
            f"  {r.workload}: {r.verdict} at poll {r.reclaimable_at_poll}, "
            f"{r.live_verdict} at poll {r.live_at_poll}"
        )


def _fetch_decisions(url: str) -> str:
    """The leader's decision log from any replica's URL (a follower fetches it from the leader:
    books/leader_decisions.py); a base URL gets /decisions appended."""
    from urllib.parse import urlsplit, urlunsplit

    import httpx

    from ghostgpu.boundary import input_error, name_endpoint

    parts = urlsplit(url)
    if parts.path in ("", "/"):
        url = urlunsplit(parts._replace(path="/decisions"))
    name_endpoint(f"{parts.scheme}://{parts.netloc}", "the controller")
    r = httpx.get(url, timeout=60)  # a transport failure is named by the boundary
    if r.status_code != 200:
        raise input_error(
            f"{url} answered {r.status_code}: {r.text.strip()[:300]}",
            "point at the controller's Service or a controller pod (port-forward its port, 8080 by "
            "default) while one replica leads; docs/controller.md",
        )
    return r.text


LedgerConfigOpt = typer.Option(
    None, "--config", "-c", help="ghostgpu.yaml or the controller section: where the replica ledger is."
)


def restore(
    target: str = typer.Argument(
        ...,
        help="KIND/NAME when the kind names one API group (deployment/notebook-7, raycluster/ray-1), or "
        "KIND.GROUP/NAME, kubectl's spelling, always (job.batch.volcano.sh/train: kind Job is also "
        "batch/v1's, so job/train is refused and both spellings are named).",
    ),
    namespace: str = typer.Option(..., "--namespace", "-n", help="Namespace of the object to restore."),
    kubeconfig: str | None = KubeconfigOpt,
    config: Path | None = LedgerConfigOpt,
) -> None:
    """Undo a reclaim: scale a Deployment/StatefulSet (or a scale-stopped manager) back to its
    recorded replica count (the `ghostgpu.io/reclaimed-from-replicas` annotation, else the
    controller's replica ledger), or undo a manager's annotation/field stop (RayCluster suspend,
    Notebook stop annotation, ...) from its `ghostgpu.io/reclaimed-from` record, or a created stop
    (a Volcano Job's AbortJob Command) by creating its restore object (a ResumeJob Command)
    (docs/managers.md)."""
    from ghostgpu.actuators import ActuatorTable
    from ghostgpu.boundary import input_error
    from ghostgpu.controller.app import load_any_config
    from ghostgpu.controller.ops import RestoreError, parse_target
    from ghostgpu.controller.ops import restore as do_restore

    ctrl = load_any_config(config).controller
    table = ActuatorTable(ctrl.actuators)
    try:
        parse_target(target, namespace, table)
    except RestoreError as exc:
        raise input_error(
            str(exc), "give KIND/NAME (deployment/notebook-7), or KIND.GROUP/NAME for a kind two groups name"
        ) from None
    try:
        done = asyncio.run(
            do_restore(target, namespace, kubeconfig=kubeconfig, ledger_namespace=ctrl.namespace, table=table)
        )
    except RestoreError as exc:
        # Ran and found nothing it may undo: exit 1, like doctor's failed row (docs/doctor.md).
        typer.echo(f"error: {exc}", err=True)
        typer.echo(
            f"fix: nothing was changed; `kubectl -n {namespace} get {target} -o yaml` shows its "
            "ghostgpu.io/ annotations (docs/managers.md says how each kind is restored)",
            err=True,
        )
        raise typer.Exit(1) from None
    typer.echo(done.summary())


def register(app: typer.Typer) -> None:
    app.command("controller")(controller)
    app.command("status")(status)
    app.command("report")(report)
    app.command("restore")(restore)
