"""Where the pinned test-cluster binaries live: hack/versions.env names the versions, hack/testbin
builds them into ~/.cache/ghostgpu/<component>-<version>/ (override with GHOSTGPU_CACHE).

The devcluster runs Kueue `KUEUE_VERSION` unless `GHOSTGPU_KUEUE_VERSION` names another release
that hack/testbin built (hack/test uses it to run the Kueue-facing tests on KUEUE_EXTRA_VERSIONS)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_ENV = REPO_ROOT / "hack" / "versions.env"
KUEUE_VERSION_ENV = "GHOSTGPU_KUEUE_VERSION"
_RELEASE = re.compile(r"v\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?")


# What to do when the binaries are not where cache_root() says (the fix line of every such error).
TESTBIN_FIX = (
    "run hack/testbin (as root; builds into $GHOSTGPU_CACHE, default ~/.cache/ghostgpu; about 20 "
    "minutes cold), or point GHOSTGPU_CACHE at the directory it built into"
)


def cache_root() -> Path:
    return Path(os.environ.get("GHOSTGPU_CACHE", Path.home() / ".cache" / "ghostgpu"))


def read_versions(path: Path = VERSIONS_ENV) -> dict[str, str]:
    """Parse the KEY=value lines of hack/versions.env (comments and blanks ignored)."""
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: missing; the devcluster needs hack/versions.env from the repository"
        )
    out: dict[str, str] = {}
    for n, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}:{n}: expected KEY=value, got {raw!r}")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]  # bash sources this file: a list of versions needs quotes
        out[key.strip()] = value
    return out


def kueue_version(versions: dict[str, str], env: dict[str, str] | None = None) -> str:
    """The Kueue release the devcluster runs: $GHOSTGPU_KUEUE_VERSION, else KUEUE_VERSION."""
    env = os.environ if env is None else env
    chosen = env.get(KUEUE_VERSION_ENV) or versions["KUEUE_VERSION"]
    if not _RELEASE.fullmatch(chosen):
        raise ValueError(
            f"{KUEUE_VERSION_ENV}={chosen!r}: expected a Kueue release tag like v0.19.2 "
            f"(hack/versions.env: KUEUE_VERSION={versions['KUEUE_VERSION']}, "
            f"KUEUE_EXTRA_VERSIONS={versions.get('KUEUE_EXTRA_VERSIONS', '')!r})"
        )
    return chosen


def kueue_extra_versions(versions: dict[str, str]) -> list[str]:
    """KUEUE_EXTRA_VERSIONS: the older releases the Kueue-facing tests also run against."""
    return [v for v in versions.get("KUEUE_EXTRA_VERSIONS", "").split() if v != versions["KUEUE_VERSION"]]


@dataclass(frozen=True)
class Toolchain:
    """Absolute paths of every binary and data directory the devcluster runs."""

    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path
    kwok: Path
    kwok_stage_dir: Path
    kwok_crd_dir: Path
    kueue: Path
    kueue_crd_dir: Path
    kueue_webhook_dir: Path
    kyverno_cli: Path
    kyverno_admission: Path
    kyverno_background: Path
    kyverno_crd_dir: Path
    prometheus: Path
    victoriametrics: Path
    monitoring_crd_dir: Path
    argocd_crd_dir: Path
    flux_crd_dir: Path
    owner_crd_dir: Path
    kubelet: Path
    containerd: Path
    ctr: Path
    runc: Path
    containerd_shim: Path
    cni_bin_dir: Path
    versions: dict[str, str]
    kueue_version: str

    @classmethod
    def locate(cls, root: Path | None = None) -> Toolchain:
        v = read_versions()
        r = root or cache_root()
        k8s = r / f"kubernetes-{v['KUBERNETES_VERSION']}"
        kwok = r / f"kwok-{v['KWOK_VERSION']}"
        kv = kueue_version(v)
        kueue = r / f"kueue-{kv}"
        kyv = r / f"kyverno-{v['KYVERNO_VERSION']}"
        vm = r / f"victoriametrics-{v['VICTORIAMETRICS_VERSION']}"
        runtime = r / "node-runtime-apt" / "bin"  # the real node's containerd, runc, CNI loopback
        return cls(
            etcd=r / f"etcd-{v['ETCD_VERSION']}" / "bin" / "etcd",
            kube_apiserver=k8s / "bin" / "kube-apiserver",
            kube_controller_manager=k8s / "bin" / "kube-controller-manager",
            kube_scheduler=k8s / "bin" / "kube-scheduler",
            kwok=kwok / "bin" / "kwok",
            kwok_stage_dir=kwok / "stage",
            kwok_crd_dir=kwok / "crds",
            kueue=kueue / "bin" / "kueue",
            kueue_crd_dir=kueue / "crds",
            kueue_webhook_dir=kueue / "webhook",
            kyverno_cli=kyv / "bin" / "kyverno",
            kyverno_admission=kyv / "bin" / "kyverno-admission",
            kyverno_background=kyv / "bin" / "kyverno-background",
            kyverno_crd_dir=kyv / "crds",
            prometheus=r / "prometheus-apt" / "bin" / "prometheus",
            victoriametrics=vm / "bin" / "victoria-metrics",
            monitoring_crd_dir=r / f"monitoring-crds-{v['PROMETHEUS_OPERATOR_VERSION']}" / "crds",
            argocd_crd_dir=r / f"argocd-{v['ARGOCD_VERSION']}" / "crds",
            flux_crd_dir=r / f"flux-kustomize-{v['FLUX_KUSTOMIZE_VERSION']}" / "crds",
            owner_crd_dir=r
            / (
                f"owner-crds-lws-{v['LWS_VERSION']}-kserve-{v['KSERVE_VERSION']}-keda-{v['KEDA_VERSION']}"
                f"-jobset-{v['JOBSET_VERSION']}-trainer-{v['TRAINER_VERSION']}"
                f"-training-operator-{v['TRAINING_OPERATOR_VERSION']}-set-{v['OWNER_CRDS_SET']}"
            )
            / "crds",
            kubelet=r / f"kubelet-{v['KUBERNETES_VERSION']}" / "bin" / "kubelet",
            containerd=runtime / "containerd",
            ctr=runtime / "ctr",
            runc=runtime / "runc",
            containerd_shim=runtime / "containerd-shim-runc-v2",
            cni_bin_dir=runtime,
            versions=v,
            kueue_version=kv,
        )

    def missing(self, *names: str) -> list[str]:
        """Paths (of the named fields, or all) that hack/testbin has not built yet."""
        fields = names or tuple(
            f for f in self.__dataclass_fields__ if f not in ("versions", "kueue_version")
        )
        return [str(getattr(self, f)) for f in fields if not Path(getattr(self, f)).exists()]
