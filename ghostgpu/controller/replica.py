"""Where this controller replica is: the namespace of its Lease and the address at which the
other replicas reach its HTTP port. Both come from flags or the downward API (POD_NAMESPACE,
POD_IP); a value that cannot be one is refused before the controller connects anywhere."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from ghostgpu.boundary import input_error
from ghostgpu.config import ControllerConfig

_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def lease_namespace_of(
    flag: str | None, cfg: ControllerConfig, environ: Mapping[str, str] = os.environ
) -> str:
    """Where the Lease lives: --lease-namespace, else POD_NAMESPACE (the downward API), else
    controller.namespace; a value that is no namespace name is refused naming where it came from."""
    for source, value in (("--lease-namespace", flag), ("POD_NAMESPACE", environ.get("POD_NAMESPACE"))):
        if value:
            if not _NAMESPACE.fullmatch(value):
                raise input_error(
                    f"{source}={value!r}: not a namespace name "
                    "(lowercase letters, digits and '-', at most 63)",
                    f"set {source} to the namespace of the controller's Lease, or unset it "
                    f"(default: controller.namespace, {cfg.namespace})",
                )
            return value
    return cfg.namespace


def advertised_address(host: str, port: int, environ: Mapping[str, str] = os.environ) -> str | None:
    """HOST:PORT where the other replicas reach this one's HTTP port: the pod IP (POD_IP, from the
    downward API), else --host when it names one address; None when neither does (0.0.0.0 outside
    a pod): followers then answer /decisions with 503 instead of the leader's log."""
    ip = environ.get("POD_IP") or (host if host not in ("", "0.0.0.0", "::") else "")
    if not ip:
        return None
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
