"""The observe room's one entry point, `Observer.observe`: from the watch caches' snapshot to what
each eligible workload shows this poll.

  1. Eligible workloads: tracked, in an opted-in namespace, with a running pod; not exempt, not
     inside the start-up grace, not a workload this process just stopped whose old pods the cache
     still shows (their sample window is reset, so old zeros never count again).
  2. ONE PromQL query for all their pods; one sample per workload into its ring.
  3. Process listings (the ProcessSource: the node agent's series of the same query, or exec with
     bounded concurrency) only for workloads whose window is all zero; artifact sizes for those
     whose newest sample is zero; faults from pod status and XIDs; GPU memory where the processes
     were listed.

Every replica observes (a follower's windows stay warm for a failover); nothing here writes to the
cluster. Its state: each workload's memory (`WorkloadState`: sample ring, artifact history) and the
settle skip of workloads just stopped (`reclaimed_pods`, filled by the act room's outcomes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

from ghostgpu.actuators import RECLAIMED_FROM_RECORD
from ghostgpu.config import ControllerConfig
from ghostgpu.controller import keys
from ghostgpu.controller.inventory import PodView, Workload, WorkloadRef, pods_by_workload
from ghostgpu.controller.ledger import LedgerBook
from ghostgpu.controller.metrics import ControllerMetrics
from ghostgpu.controller.observe.evidence import WorkloadState
from ghostgpu.controller.poll import PollResult, Snapshot
from ghostgpu.signals.artifacts import (
    FileArtifactProbe,
    FileTarget,
    InvalidArtifactURI,
    Measurement,
    S3ArtifactProbe,
    S3Target,
    parse_artifact_uri,
)
from ghostgpu.signals.faults import NO_FAULTS, workload_faults
from ghostgpu.signals.podexec import PodRef
from ghostgpu.signals.processes import Listing, ProcessSource, merge_listings
from ghostgpu.signals.utilization import (
    PodKey,
    PodReading,
    UtilizationSource,
    workload_memory,
    workload_sample,
)
from ghostgpu.verdict import (
    FailureReason,
    FaultObservation,
    GpuMemory,
    SignalFailure,
    XidEvent,
)

# How long a workload this process scaled to zero waits for the watch cache to show its old pods
# gone before it is judged again (a scale-down reaches the cache within seconds; pods terminate
# within their grace period, 30 s by default).
RECLAIM_SETTLE_SECONDS = 300.0

Eligible = dict[WorkloadRef, tuple[Workload, list[PodView], WorkloadState]]


@dataclass
class Observation:
    """One poll's signals for the eligible workloads (sorted by kind, namespace, name)."""

    eligible: Eligible
    # None: not listed (the window is not all zero); the listing or its failure otherwise.
    processes: dict[WorkloadRef, Listing | None]
    faults: dict[WorkloadRef, FaultObservation]
    # Read only where the processes were listed (the verdict never looks at it otherwise).
    memory: dict[WorkloadRef, GpuMemory | SignalFailure] = field(default_factory=dict)


class Observer:
    def __init__(
        self,
        cfg: ControllerConfig,
        *,
        utilization: UtilizationSource,
        processes: ProcessSource,
        files: FileArtifactProbe,
        s3: S3ArtifactProbe | None,
        metrics: ControllerMetrics,
        records: LedgerBook,
    ) -> None:
        self.cfg = cfg
        self.utilization = utilization
        self.processes = processes
        self.files = files
        self.s3 = s3
        self.metrics = metrics
        self.records = records
        self.states: dict[WorkloadRef, WorkloadState] = {}
        # Pods of workloads this process stopped: until the watch cache shows them gone, the
        # workload is not judged again (a stale poll would exec into a dying pod and write an UNKNOWN
        # verdict onto a workload at zero ready replicas, which Kueue's webhook then accepts and
        # labels with queue-name).
        # The skip is bounded (RECLAIM_SETTLE_SECONDS): old pods still running after that mean a
        # person restored the workload before the scale-down reached them; it is judged again (the
        # dry-run guard in kube.py still keeps any write from adding queue-name).
        self.reclaimed_pods: dict[WorkloadRef, tuple[frozenset[str], float]] = {}

    async def observe(self, snap: Snapshot, now: float, result: PollResult) -> Observation:
        eligible = self.eligible(snap, now, result)
        # The faults come from gather's own pass over the readings (one pass, not two).
        processes, readings, faults = await self.gather(eligible, now)
        obs = Observation(eligible, processes, faults)
        failed = self.metrics.signal_failures
        for ref, listing in processes.items():
            if listing is not None:  # memory is read only where the processes were listed
                pods = eligible[ref][1]
                memory = obs.memory[ref] = workload_memory(
                    readings[PodKey(p.namespace, p.name)] for p in pods
                )
                if isinstance(memory, SignalFailure):
                    failed.labels("memory", memory.reason.value).inc()
        return obs

    def stopped(self, ref: WorkloadRef, pods: list[PodView], at: float) -> None:
        """The act room stopped `ref`: skip it until its old pods are gone from the cache."""
        self.reclaimed_pods[ref] = (frozenset(pod.uid for pod in pods), at)

    # --- 1: what to judge -------------------------------------------------------------------------

    def eligible(self, snap: Snapshot, now: float, result: PollResult) -> Eligible:
        opted_in = snap.opted_in()
        workloads = {ref: wl for ref, wl in snap.workloads.items() if ref.namespace in opted_in}
        # New workloads' states first, before this poll's short-lived objects: made in one run
        # they share memory pages with each other, not with garbage, and a start with 50,000
        # workloads leaves ~50 MB less memory behind that Python cannot give back.
        for ref, wl in workloads.items():
            st = self.states.get(ref)
            if st is None or st.uid != wl.uid:
                self.states[ref] = WorkloadState.new(wl.uid, self.cfg)
        if len(self.states) > len(workloads):  # every workload has its state: some have left
            # Namespaces that opted out, deleted workloads: forget them entirely.
            for ref in [r for r in self.states if r not in workloads]:
                del self.states[ref]
                self.reclaimed_pods.pop(ref, None)
        pods_of = result.pods_of = pods_by_workload(workloads, snap.pods, snap.top_of)
        out: Eligible = {}
        grace = self.cfg.startup_grace.seconds
        reclaimed = self.reclaimed_pods
        # Sorted by (kind, namespace, name): WorkloadRef is a tuple, compared in C.
        for ref, wl in sorted(workloads.items(), key=itemgetter(0)):
            st = self.states[ref]
            pods = pods_of[ref]
            if st.eligible_workload is not None:
                if (
                    st.eligible_workload is wl
                    and len(pods) == 1
                    and st.eligible_pod is pods[0]
                    and not (reclaimed and ref in reclaimed)
                ):
                    # The same workload and pod objects as last poll, which found them eligible
                    # and past the grace (nearly every workload on every poll): each check below
                    # reads only these objects and answers as it did (a stop since then is in
                    # `reclaimed`); the artifact target too, read from the same annotations.
                    out[ref] = (wl, pods, st)
                    continue
                # Anything else: every check, as for a new workload.
                st.eligible_workload = st.eligible_pod = None
            # One running pod (nearly every workload at scale): its list as is, no copy.
            running = pods if len(pods) == 1 and pods[0].running else [p for p in pods if p.running]
            if wl.exempt:
                result.states["exempt"] += 1
                st.reset_window()
                continue
            if not running:
                stopped = (
                    self.records.reclaimed_from(wl) is not None or RECLAIMED_FROM_RECORD in wl.annotations
                )
                result.states["reclaimed" if stopped else "no-running-pod"] += 1
                st.reset_window()
                continue
            # One pod (nearly every workload): its flag read as is, no generator per workload.
            if running[0].gpus_unknown if len(running) == 1 else any(p.gpus_unknown for p in running):
                # A ResourceClaim of its pods is not in the cache yet (claims.py): not judged
                # this poll (no sample, no verdict), never judged on GPUs it may hold.
                result.states["gpus-unknown"] += 1
                continue
            dra = running[0].dra_gpus if len(running) == 1 else max(p.dra_gpus for p in running)
            if dra != st.dra_gpus_per_pod:
                st.dra_gpus_per_pod = dra
            # Only workloads this process stopped are settling: none on nearly every poll.
            if reclaimed and self._settling(ref, running, now):
                result.states["reclaimed"] += 1  # the cache has not seen the scale-down yet
                st.reset_window()
                continue
            # The same one pod as last poll, already past the grace (nearly every workload on
            # every poll): _in_grace would answer False without changing anything; not called.
            known = st.pod_uids
            if not (
                st.past_grace and len(running) == 1 and len(known) == 1 and known[0] == running[0].uid
            ) and self._in_grace(wl, running, st, now, grace):
                result.states["grace"] += 1
                st.reset_window()
                continue
            st.artifact_target = _artifact_target(wl)
            out[ref] = (wl, running, st)
            if running is pods and len(pods) == 1 and st.past_grace:
                st.eligible_workload, st.eligible_pod = wl, pods[0]
        return out

    def _settling(self, ref: WorkloadRef, running: list[PodView], now: float) -> bool:
        reclaimed = self.reclaimed_pods.get(ref)
        if reclaimed is None:
            return False
        gone, at = reclaimed
        if gone & {p.uid for p in running} and now - at < RECLAIM_SETTLE_SECONDS:
            return True
        del self.reclaimed_pods[ref]  # new pods (restored, or scaled up by a person) or settled
        return False

    @staticmethod
    def _in_grace(wl: Workload, running: list[PodView], st: WorkloadState, now: float, grace: float) -> bool:
        known = st.pod_uids
        if len(running) == 1 and len(known) == 1 and known[0] == running[0].uid:
            pass  # the same one pod as last poll (nearly every workload): no tuple to build
        elif (pod_uids := tuple(sorted(p.uid for p in running))) != known:
            if known:
                st.reset_window()  # pods were replaced: their history is not this window's
            st.pod_uids = pod_uids  # only on a change: no new object per workload per poll
            st.past_grace = False
        if st.past_grace:
            return False
        starts = [p.started_at.timestamp() for p in running if p.started_at]
        if wl.created_at:
            starts.append(wl.created_at.timestamp())
        if starts and now - max(starts) < grace:
            return True
        # A pod's start time never changes: once past, these pods stay past the grace.
        st.past_grace = True
        return False

    # --- 2-3: signals -----------------------------------------------------------------------------

    async def _measure(
        self, wl: Workload, pods: list[PodView], st: WorkloadState
    ) -> Measurement | SignalFailure:
        target = st.artifact_target
        if isinstance(target, S3Target):
            if self.s3 is None:
                return SignalFailure(reason=FailureReason.OTHER, detail="no S3 client configured")
            return await self.s3.measure(target)
        assert isinstance(target, FileTarget)
        pod = pods[0]
        return await self.files.measure(
            PodRef(pod.namespace, pod.name, pod.gpu_container or pod.first_container), target
        )

    async def gather(
        self, eligible: Mapping[WorkloadRef, tuple[Workload, list[PodView], WorkloadState]], now: float
    ) -> tuple[
        dict[WorkloadRef, Listing | None], dict[PodKey, PodReading], dict[WorkloadRef, FaultObservation]
    ]:
        # The pods' keys, their UIDs and DRA devices in one pass, one PodKey per pod: three passes
        # built two PodKeys per pod per poll (a namedtuple's __new__ is a Python-level call).
        keys_: list[PodKey] = []
        uids: dict[PodKey, str] = {}
        # DRA pods' GPU devices (claims.py): each must have its own series.
        devices: dict[PodKey, Any] = {}
        for _, pods, _ in eligible.values():
            for p in pods:
                key = PodKey(p.namespace, p.name)
                keys_.append(key)
                uids[key] = p.uid
                if p.dra_devices:
                    devices[key] = p.dra_devices
        readings = await self.utilization.poll(keys_, now=now, devices=devices, uids=uids)
        failed = self.metrics.signal_failures
        # Processes only once the window is all zero; artifacts from the first zero sample on, so
        # that the window's start has a measurement by the time the window is complete. One pass.
        window, thr = self.cfg.window, self.cfg.zero_threshold
        proc_refs: list[WorkloadRef] = []
        art_refs: list[WorkloadRef] = []
        with_artifacts: list[tuple[WorkloadRef, WorkloadState]] = []
        faults: dict[WorkloadRef, FaultObservation] = {}
        for r, (_wl, pods, st) in eligible.items():
            if len(pods) == 1:  # one pod: its reading is the workload's (workload_sample of one)
                p = pods[0]
                # Looked up by a plain tuple: a PodKey's hash and equality, without a namedtuple
                # per pod per poll.
                reading = readings[(p.namespace, p.name)]  # type: ignore[index]
                u = reading.utilization
                if isinstance(u, SignalFailure):
                    failed.labels("utilization", u.reason.value).inc()
                st.ring.push(u)
                xids: tuple[XidEvent, ...] | list[XidEvent] = reading.xids
                pod_faults = NO_FAULTS if not xids and p.faults == () else workload_faults([p.faults], xids)
            else:
                pod_readings = [readings[PodKey(p.namespace, p.name)] for p in pods]
                for reading in pod_readings:
                    if isinstance(reading.utilization, SignalFailure):
                        failed.labels("utilization", reading.utilization.reason.value).inc()
                st.ring.push(workload_sample(pod_readings))
                xids = [x for reading in pod_readings for x in reading.xids]
                pod_faults = workload_faults([p.faults for p in pods], xids)
            # One pod, no terminations, no XID: NO_FAULTS (nearly every workload on every poll).
            faults[r] = pod_faults
            if isinstance(pod_faults, SignalFailure):
                failed.labels("faults", pod_faults.reason.value).inc()
            target = st.artifact_target  # None for nearly every workload: no isinstance then
            measured_here = target is not None and isinstance(target, FileTarget | S3Target)
            if measured_here:
                with_artifacts.append((r, st))
            if st.ring.newest_all_zero(1, thr):
                if st.ring.newest_all_zero(window, thr):
                    proc_refs.append(r)
                if measured_here:
                    art_refs.append(r)
        proc_pods = {r: _probe_targets(eligible[r][1]) for r in proc_refs}
        flat = [p for lst in proc_pods.values() for p in lst]
        listings_task = asyncio.ensure_future(self.processes.list_many(flat))
        measurements = await asyncio.gather(*(self._measure(*eligible[r]) for r in art_refs))
        listings = await listings_task
        processes: dict[WorkloadRef, Listing | None] = {r: None for r in eligible}
        no_listing = 0
        without: dict[str, int] = {}
        for r, lst in proc_pods.items():
            # Raw listings or counts: which processes only hold a container is the verdict
            # policy's call; a workload's containers combine (rows joined, counts summed).
            merged = processes[r] = merge_listings([listings[p] for p in lst])
            if isinstance(merged, SignalFailure):
                failed.labels("processes", merged.reason.value).inc()
                no_listing += merged.reason is FailureReason.NO_LISTING
                without[merged.reason.value] = without.get(merged.reason.value, 0) + 1
        self.metrics.no_listing.set(no_listing)
        self.metrics.set_without_processes(without)
        measured = dict(zip(art_refs, measurements, strict=True))
        for r, st in with_artifacts:  # a workload with an artifact target: its measurement, or none
            m = measured.get(r)
            st.artifacts.push(m)
            if isinstance(m, SignalFailure):
                failed.labels("artifacts", m.reason.value).inc()
        return processes, readings, faults


def _probe_targets(pods: list[PodView]) -> list[PodRef]:
    return [PodRef(p.namespace, p.name, c) for p in pods for c in p.probe_containers]


def _artifact_target(wl: Workload) -> FileTarget | S3Target | SignalFailure | None:
    uri = wl.annotations.get(keys.ARTIFACTS)
    if not uri:
        return None
    try:
        return parse_artifact_uri(uri)
    except InvalidArtifactURI as exc:
        return SignalFailure(reason=FailureReason.OTHER, detail=f"invalid {keys.ARTIFACTS}: {exc}")


__all__ = ["RECLAIM_SETTLE_SECONDS", "Observation", "Observer"]
