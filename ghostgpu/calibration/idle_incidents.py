"""The idle-session incident set for `ghostgpu calibrate` (docs/idle-sessions.md, docs/autonomy.md).

An idle session's stop is its own incident type, `idle_held`, with its own threshold
(`controller.autonomy.tauByType.idle_held`). Its events are the workloads idle sessions live in
(a Kubeflow Notebook, a Notebooks 2.0 Workspace, a StatefulSet or Deployment, a RayCluster, a bare
Pod) at 1 to 8 GPUs and one or more replicas, with no volume, a PersistentVolumeClaim or a
disk-backed emptyDir, each crossed with the stop it gets (a bare Pod is evicted, everything else
is stopped through its manager), labelled by IDLE_RUBRIC, which looks at the object and the
action, never at the score. They are calibrated apart from the published set, so that set's
thresholds stay what the publication's method gives.
"""

from __future__ import annotations

from itertools import product

from ghostgpu.autonomy import ActionClass
from ghostgpu.calibration.incidents import Incident, Manifest, facts_of

IDLE_RUBRIC = """\
An idle-session stop (incident type idle_held) is DANGEROUS when:
  irreversible  - it evicts a bare Pod: nothing recreates it, and `ghostgpu restore` cannot.
Everything else is safe: the manager's own stop (scale to 0, suspend, pause) is recorded and undone
by `ghostgpu restore`, and a PersistentVolumeClaim survives it. What a stop does lose (the kernel's
memory, files in an emptyDir) is what every culler loses, and what the warning announced with its
deadline; the score cannot tell an emptyDir from a claim, so no clause pretends it can."""

# (kind, is it a bare Pod) of the objects idle sessions live in.
KINDS = ("Notebook", "Workspace", "StatefulSet", "Deployment", "RayCluster", "Pod")
VOLUMES = ("none", "pvc", "emptydir")


def idle_manifests() -> list[Manifest]:
    """A manifest for every cell of the grid."""
    out: list[Manifest] = []
    for kind, gpus, replicas, volume in product(KINDS, (1, 2, 4, 8), (1, 2), VOLUMES):
        if kind == "Pod" and replicas > 1:
            continue
        lines = 40 + 6 * (volume != "none") + (25 if kind == "RayCluster" else 0)
        out.append(
            Manifest(
                source="idle-session grid",
                kind=kind,
                name=f"{kind.lower()}-{gpus}-{replicas}-{volume}",
                namespace="team-a",
                lines=lines,
                gpus=gpus * replicas,
                replicas=replicas,
                volumes=int(volume != "none"),
                admission_policy=False,
                enforcing=False,
                governs_bare_pods=kind == "Pod",
                shared_quota=False,
                node_pool=False,
            )
        )
    return out


def idle_rubric_reasons(manifest: Manifest, action: str) -> tuple[str, ...]:
    if action == ActionClass.EVICT_POD and manifest.governs_bare_pods:
        return ("irreversible",)
    return ()


def idle_session_incidents() -> list[Incident]:
    out: list[Incident] = []
    for manifest in idle_manifests():
        action = ActionClass.EVICT_POD if manifest.kind == "Pod" else ActionClass.SCALE_TO_ZERO
        reasons = idle_rubric_reasons(manifest, action)
        out.append(
            Incident(
                manifest=manifest.label,
                action=str(action),
                incident_type="idle_held",
                dangerous=bool(reasons),
                facts=facts_of(manifest, action),
                rubric=reasons,
            )
        )
    return out
