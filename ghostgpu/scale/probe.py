"""The controller under measurement: `ghostgpu.controller.app.run_controller`, unchanged, in its own
process, with `--max-polls`. The controller code is not edited; this module wraps, from outside:
  - `Informers.snapshot` (the first thing of each poll cycle)   -> cycle start
  - `accounting_from` (the last thing of each poll cycle)       -> cycle end
  - `Reconciler.poll_once`                                      -> the verdict states of the poll
  - `httpx.AsyncClient.send`                                    -> requests by class (meter.py)
  - `ExecProcessSource.list_processes`, `AgentProcessSource.list_many` -> process-signal failures
  - `IdleSessions.tend`                                          -> the idle-session steps
Per cycle it writes one JSON line: wall time, CPU time (user+sys of the process), RSS, peak RSS,
Prometheus queries, apiserver requests (exec, watch, other) and the states.

Run: python -m ghostgpu.scale.probe --config CFG --kubeconfig KC --polls P --out FILE --prom-port N
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from ghostgpu.scale.meter import HISTORY, RequestCounter, cpu_seconds, delta, memory_mib


class Recorder:
    def __init__(self, out: Path, counter: RequestCounter) -> None:
        self.out = out
        self.counter = counter
        self.poll = 0
        self._start: tuple[float, float, dict[str, int], dict[str, int]] | None = None
        self.states: dict[str, int] = {}
        self.t0 = time.perf_counter()
        self.cpu0 = cpu_seconds()
        self._gc0: tuple[float, int] = (0.0, 0)
        self.process_failures, self.process_failure_samples = {}, []
        self.idle_steps, self.idle_candidates, self.idle_tend_s = {}, 0, 0.0
        self.history_reads: dict[str, int] = {}

    gc_freeze = False  # EXPERIMENT, not the controller as shipped: gc.freeze() after sync/polls
    profile_from: int | None = None  # cProfile polls from this one on (`--profile`)
    profiler: Any = None
    gc_s = 0.0  # CPU time inside the cyclic garbage collector (gc.callbacks), process lifetime
    gc_full = 0  # generation-2 collections
    _gc_t = 0.0

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        # process CPU time, not wall: a busy machine would inflate a wall-clock measure
        if phase == "start":
            self._gc_t = time.process_time()
        else:
            self.gc_s += time.process_time() - self._gc_t
            self.gc_full += info.get("generation") == 2

    process_failures: dict[str, int]
    process_failure_samples: list[str]
    idle_steps: dict[str, int]
    idle_candidates: int
    idle_tend_s: float
    _history0 = 0.0

    def idle_tended(self, candidates: int, actions: list[str], wall_s: float) -> None:
        self.idle_candidates += candidates
        self.idle_tend_s += wall_s
        for a in actions:
            self.idle_steps[a] = self.idle_steps.get(a, 0) + 1

    def failed_listing(self, pod: Any, failure: Any) -> None:
        reason = str(failure.reason.value)
        self.process_failures[reason] = self.process_failures.get(reason, 0) + 1
        if len(self.process_failure_samples) < 5:
            self.process_failure_samples.append(
                f"{pod.namespace}/{pod.name}: {reason}: {failure.detail}"[:300]
            )

    def begin(self) -> None:
        self.process_failures, self.process_failure_samples = {}, []
        self.idle_steps, self.idle_candidates, self.idle_tend_s = {}, 0, 0.0
        self.history_reads = {}
        self._history0 = self.counter.history_wall_s
        self._gc0 = (self.gc_s, self.gc_full)
        if self.profile_from is not None and self.poll + 1 >= self.profile_from and self.profiler:
            self.profiler.enable()
        self._start = (
            time.perf_counter(),
            cpu_seconds(),
            self.counter.snapshot(),
            dict(self.counter.by_verb),
        )

    def end(self) -> None:
        if self._start is None:
            return
        t, cpu, counts, verbs = self._start
        self._start = None
        self.poll += 1
        rss, hwm = memory_mib()
        d = delta(self.counter.snapshot(), counts)
        by_verb = {k: v for k, v in delta(dict(self.counter.by_verb), verbs).items() if v}
        # Leader election (a lease GET/PUT every retry period, 2 s) is counted apart: it follows
        # the clock, not the poll, so a poll that waits on the apiserver budget meets more of it.
        leases = sum(v for k, v in by_verb.items() if k.endswith(" leases"))
        row: dict[str, Any] = {
            "poll": self.poll,
            "wall_s": round(time.perf_counter() - t, 4),
            "cpu_s": round(cpu_seconds() - cpu, 4),
            "rss_mib": round(rss, 1),
            "peak_rss_mib": round(hwm, 1),
            "prometheus_queries": d.get("prometheus_query", 0),
            "apiserver_requests": sum(v for k, v in d.items() if k.startswith("apiserver")) - leases,
            "lease_requests": leases,
            "exec_calls": d.get("apiserver_exec", 0),
            "requests": d,
            "apiserver_by_verb": by_verb,
            # what the controller's apiserver budget governs: writes (leader election aside) and exec
            "budgeted_requests": d.get("apiserver_exec", 0)
            + sum(v for k, v in by_verb.items() if not k.startswith("GET ") and not k.endswith(" leases")),
            "states": self.states,
            # why the processes signal failed this poll (exec or the agent's series; each is an
            # UNKNOWN verdict): reason -> count, and the first few failures' pod and detail
            "process_failures": dict(sorted(self.process_failures.items())),
            "process_failure_samples": self.process_failure_samples,
            "gc_s": round(self.gc_s - self._gc0[0], 4),
            "gc_full_collections": self.gc_full - self._gc0[1],
            # The idle-session history queries (idle_history.py) and their wall time to the answer,
            # the act room's idle-session step (IdleSessions.tend: history, ladder, step) and the
            # steps it took, by action (`none` included)
            "history_queries": d.get(HISTORY, 0),
            "history_wall_s": round(self.counter.history_wall_s - self._history0, 4),
            "idle_tend_wall_s": round(self.idle_tend_s, 4),
            "idle_candidates": self.idle_candidates,
            "idle_steps": dict(sorted(self.idle_steps.items())),
            "history_reads": dict(sorted(self.history_reads.items())),
            "process_cpu_s": round(cpu_seconds() - self.cpu0, 3),
            "process_wall_s": round(time.perf_counter() - self.t0, 3),
        }
        if self.profiler is not None:
            self.profiler.disable()
        if self.gc_freeze:
            import gc

            gc.freeze()  # what survived this poll (caches, rings) is never traversed again
        with self.out.open("a", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")

    def synced(self) -> None:
        """One line before the first poll: what the watch caches alone cost."""
        rss, hwm = memory_mib()
        row = {
            "poll": 0,
            "synced_after_s": round(time.perf_counter() - self.t0, 3),
            "cpu_s": round(cpu_seconds() - self.cpu0, 3),
            "rss_mib": round(rss, 1),
            "peak_rss_mib": round(hwm, 1),
        }
        with self.out.with_suffix(".startup.json").open("w", encoding="utf-8") as f:
            f.write(json.dumps(row, sort_keys=True) + "\n")


def install(recorder: Recorder) -> None:
    from ghostgpu.controller import app

    original_snapshot = app.Informers.snapshot
    original_accounting = app.accounting_from
    base = app.Reconciler

    original_synced = app.Informers.wait_synced

    async def wait_synced(self: Any) -> None:
        await original_synced(self)
        recorder.synced()
        if recorder.gc_freeze:
            import gc

            gc.collect()
            gc.freeze()

    def snapshot(self: Any, flavors: Any) -> Any:
        recorder.begin()
        return original_snapshot(self, flavors)

    def accounting(*args: Any, **kwargs: Any) -> Any:
        try:
            return original_accounting(*args, **kwargs)
        finally:
            recorder.end()

    class MeasuredReconciler(base):  # type: ignore[misc,valid-type]
        async def poll_once(self, snap: Any) -> Any:
            result = await super().poll_once(snap)
            recorder.states = dict(sorted(result.states.items()))
            return result

    from ghostgpu.signals.processes import ExecProcessSource
    from ghostgpu.verdict import SignalFailure

    original_list = ExecProcessSource.list_processes

    async def list_processes(self: Any, pod: Any) -> Any:
        outcome = await original_list(self, pod)
        if isinstance(outcome, SignalFailure):
            recorder.failed_listing(pod, outcome)
        return outcome

    from ghostgpu.signals.agent import AgentProcessSource

    original_many = AgentProcessSource.list_many

    async def list_many(self: Any, pods: Any) -> Any:
        outcomes = await original_many(self, pods)
        for pod, outcome in outcomes.items():
            if isinstance(outcome, SignalFailure):
                recorder.failed_listing(pod, outcome)
        return outcomes

    from ghostgpu.controller.act.idle import IdleSessions

    original_tend = IdleSessions.tend

    async def tend(self: Any, candidates: Any) -> Any:
        t0 = time.perf_counter()
        done = await original_tend(self, candidates)
        recorder.idle_tended(len(candidates), [step.action for _c, step in done], time.perf_counter() - t0)
        return done

    original_history = IdleSessions._history

    async def history(self: Any, group: Any, window: float) -> Any:
        # one call per distinct `after` (the ladder, every candidate of that window) and one per
        # candidate whose ladder asks for after + warnBefore (a stop's, or in shadow a would-stop's,
        # re-read): by window, so the two are told apart
        key = f"{window:g}"
        recorder.history_reads[key] = recorder.history_reads.get(key, 0) + 1
        return await original_history(self, group, window)

    IdleSessions._history = history  # type: ignore[method-assign]
    IdleSessions.tend = tend  # type: ignore[method-assign]
    AgentProcessSource.list_many = list_many  # type: ignore[method-assign]
    ExecProcessSource.list_processes = list_processes  # type: ignore[method-assign]
    app.Informers.snapshot = snapshot  # type: ignore[method-assign]
    app.Informers.wait_synced = wait_synced  # type: ignore[method-assign]
    app.accounting_from = accounting  # type: ignore[assignment]
    app.Reconciler = MeasuredReconciler  # type: ignore[misc]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--polls", type=int, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--prom-port", type=int, required=True)
    ap.add_argument("--port", type=int, required=True, help="the controller's /metrics port")
    ap.add_argument("--decision-log", default="")
    ap.add_argument("--profile", type=Path, default=None, help="cProfile polls >= --profile-from")
    ap.add_argument("--profile-from", type=int, default=0)
    ap.add_argument(
        "--experiment-gc-freeze",
        action="store_true",
        help="what-if, not the shipped controller: freeze the GC's generations after sync and each poll",
    )
    args = ap.parse_args()

    import logging

    from ghostgpu.controller.app import load_any_config

    logging.basicConfig(level=logging.WARNING)
    counter = RequestCounter(prometheus_port=args.prom_port)
    counter.install()
    recorder = Recorder(args.out, counter)
    recorder.gc_freeze = args.experiment_gc_freeze
    import gc

    gc.callbacks.append(recorder.on_gc)
    if args.profile:
        import cProfile

        recorder.profiler = cProfile.Profile()
        recorder.profile_from = args.profile_from
    install(recorder)
    from ghostgpu.controller import app  # patched above

    asyncio.run(
        app.run_controller(
            load_any_config(args.config),
            kubeconfig=args.kubeconfig,
            identity="scale-probe",
            host="127.0.0.1",
            port=args.port,
            decision_log=args.decision_log or None,
            max_polls=args.polls,
        )
    )
    if args.profile and recorder.profiler is not None:
        import pstats

        with args.profile.open("w", encoding="utf-8") as f:
            pstats.Stats(recorder.profiler, stream=f).sort_stats("cumulative").print_stats(60)
            pstats.Stats(recorder.profiler, stream=f).sort_stats("tottime").print_stats(40)


if __name__ == "__main__":
    main()
