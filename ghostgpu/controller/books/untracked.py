"""GPUs held outside Kueue by pods no tracked workload accounts for (pure).

A GPU pod whose owner chain ends in a kind with no actuator row (a batch Job nobody queued, an
operator nobody configured), or any GPU pod the tracking policy did not label, is not judged and
never written to: acting needs a row. Its GPUs are held all the same, so Kueue's books must count
them: they are the `UNTRACKED_OWNER` bucket of `ghostgpu status`'s outside-Kueue columns, of the
ghost gauge, and a holder in the reservation, named by the top of its controller chain as far as
the caches see it (managers.Resolution.holder_of).

Counted like a tracked workload's pods: scheduled and not finished (`PodView.holds_gpus`), in an
opted-in namespace, and not Kueue's own (Kueue labels the pods of what it admitted with
`kueue.x-k8s.io/podset`; its plain-pod integration with `kueue.x-k8s.io/managed`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

from ghostgpu.controller.inventory import PodView, WorkloadRef, namespace_opted_in

UNTRACKED_OWNER = "UNTRACKED_OWNER"  # the verdict bucket of these GPUs (status, ghost gauge)

# Labels that make a pod Kueue's own: counted in Kueue's books already.
KUEUE_MANAGED = "kueue.x-k8s.io/managed"  # "true": Kueue's pod integration
KUEUE_QUEUE_NAME = "kueue.x-k8s.io/queue-name"
KUEUE_PODSET = "kueue.x-k8s.io/podset"  # set on the pod template of every job Kueue starts


def kueue_pod(pod: PodView) -> bool:
    labels = pod.labels
    return labels.get(KUEUE_MANAGED) == "true" or KUEUE_QUEUE_NAME in labels or KUEUE_PODSET in labels


def immediate_holder(pod: PodView) -> WorkloadRef:
    """The pod's own controller owner (or the pod when bare): the holder without owner caches."""
    if pod.owner_kind is None:
        return WorkloadRef("Pod", pod.namespace, pod.name)
    group, kind = pod.owner_group_kind or ("", pod.owner_kind)
    return WorkloadRef(kind, pod.namespace, pod.owner_name or "", group)


def untracked_holders(
    pods: Iterable[PodView],
    namespaces: Mapping[str, Mapping[str, str]],
    accounted: Mapping[WorkloadRef, Sequence[PodView]],
    holder_of: Callable[[PodView], WorkloadRef] | None = None,
) -> dict[WorkloadRef, list[PodView]]:
    """holder -> its GPU pods that no workload in `accounted` (a poll's pods_of) holds, sorted."""
    seen = {(p.namespace, p.name) for lst in accounted.values() for p in lst}
    opted = {ns for ns, labels in namespaces.items() if namespace_opted_in(labels)}
    name = holder_of or immediate_holder
    out: dict[WorkloadRef, list[PodView]] = {}
    for pod in pods:
        if not pod.holds_gpus or pod.namespace not in opted or (pod.namespace, pod.name) in seen:
            continue
        if kueue_pod(pod):
            continue
        out.setdefault(name(pod), []).append(pod)
    for lst in out.values():
        lst.sort(key=lambda p: p.name)
    return dict(sorted(out.items()))


__all__ = ["UNTRACKED_OWNER", "immediate_holder", "kueue_pod", "untracked_holders"]
