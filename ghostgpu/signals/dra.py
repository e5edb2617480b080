"""DRA GPUs in the utilization signal: every GPU device of a pod's ResourceClaims must have its own
series, matched by the labels dcgm-exporter gives a DRA device's series.

dcgm-exporter with `--kubernetes-enable-dra` (internal/pkg/transformation/kubernetes.go,
toDeviceToPodsDRA) labels a device of driver `gpu.nvidia.com` with the consumer's `pod`,
`namespace` and `container`, as for a device-plugin GPU, plus `dra_claim_name`,
`dra_claim_namespace`, `dra_driver_name`, `dra_pool_name`, `dra_device_name` (and, for a MIG
device, `dra_mig_profile` and `dra_mig_device_uuid`). One series per device and container: a
device two containers name is two series with the same device labels, a pod with two devices two
series. The query's `max`/`min` by pod take them as they are; the `dev` part groups them by device,
so a device counts once however many containers name it.

Matching is by (driver, pool, device), the identity of the claim's allocation result
(claims.ClaimDevice), not by count: a series of another device never stands in for a missing one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ghostgpu.verdict import FailureReason, SignalFailure

# dcgm-exporter's label names (internal/pkg/transformation/const.go), in (driver, pool, device) order.
DCGM_DRA_LABELS: tuple[str, str, str] = ("dra_driver_name", "dra_pool_name", "dra_device_name")
DEVICE_FIELD = "dev"  # the `ghostgpu_field` value of the device series

DeviceId = tuple[str, str, str]  # (driver, pool, device)


class DraDevice(NamedTuple):
    """A GPU device of one of a pod's claims, and the claim that holds it."""

    driver: str
    pool: str
    device: str
    claim: str  # the ResourceClaim's name (in the pod's namespace)

    def __str__(self) -> str:
        return f"{self.driver}/{self.pool}/{self.device}"


def device_part(metric: str, selector: str, by: str, labels: tuple[str, str, str], field_label: str) -> str:
    """The query's part with one series per DRA device of each pod, for the caller to keep only
    the pods at or under the zero threshold (`and on(by)`): `selector` is the pods' `{...}`
    selector, narrowed to series that carry a device label (device-plugin series never do)."""
    driver, pool, device = labels
    narrowed = selector[:-1] + f', {device}!=""}}'
    return (
        f"label_replace(group by ({by}, {driver}, {pool}, {device}) ({metric}{narrowed}), "
        f'"{field_label}", "{DEVICE_FIELD}", "", "")'
    )


def without_series(expected: Sequence[DraDevice], seen: set[DeviceId] | None) -> list[DraDevice]:
    """The expected devices that have no series in the answer."""
    return [d for d in expected if seen is None or (d.driver, d.pool, d.device) not in seen]


def no_series(metric: str, namespace: str, gap: Sequence[DraDevice]) -> SignalFailure:
    """MISSING, naming the first device without a series (a GPU without a series is never idle)."""
    first = gap[0]
    more = f" and {len(gap) - 1} more DRA device(s)" if len(gap) > 1 else ""
    detail = f"no {metric} series of DRA device {first} (claim {namespace}/{first.claim}){more}"
    return SignalFailure(reason=FailureReason.MISSING, detail=detail[:200])
