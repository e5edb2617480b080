"""The ghostgpu.yaml model: one cluster file from which every bundle and the controller are built.

Public interface:
    load_config(path) -> GhostgpuConfig            the whole file (raises ConfigError)
    load_config_text(text, source) -> GhostgpuConfig
    load_default_config() -> GhostgpuConfig         the embedded examples/ghostgpu.yaml
    load_controller_config(path) -> ControllerConfig  the controller section (of either shape)
    read_config_file(path) -> ConfigFile            either shape, by the one rule (is_whole_file)

Keys are camelCase like Kubernetes (nominalQuota, pollInterval); unknown keys are errors.
Structural checks are pydantic's; cross-references (undefined flavor, duplicate names, ...) are
checked afterwards by `semantic_issues` so that every problem is reported, not just the first.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from string import Template
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from ghostgpu.actuators import Actuator
from ghostgpu.autonomy import AutonomyConfig
from ghostgpu.config_errors import (
    ConfigError,
    ConfigIssue,
    ParsedYaml,
    format_path,
    issues_from_validation,
    parse_yaml,
)
from ghostgpu.idle_policy import IdleSessionsConfig
from ghostgpu.image_ref import validate_image_ref
from ghostgpu.promql import label_matchers
from ghostgpu.quantity import Duration, Quantity
from ghostgpu.verdict import ProcessPolicy

# --- the labelling contract (docs/design.md#labelling-contract); fixed, not configurable ---
OPT_IN_LABEL = "ghostgpu.io/reclaim"
OPT_IN_VALUE = "enabled"
TEAM_LABEL = "ghostgpu.io/team"
TRACKED_LABEL = "ghostgpu.io/tracked"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_MANAGED_LABEL = "kueue.x-k8s.io/managed"
DEFAULT_LOCAL_QUEUE = "default"
# Resource names the controller takes for device-plugin GPUs even when no flavor names them
# (controller.inventory.gpu_predicate); a DRA device class is never charged under one.
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/gpu", "gpu.intel.com/")

API_VERSION = "ghostgpu.io/v1alpha1"
KIND = "GhostgpuConfig"

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# Extended resources are always domain-prefixed (nvidia.com/gpu, nvidia.com/mig-1g.10gb).
_EXTENDED_RESOURCE = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)+/[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _dns_label(value: str) -> str:
    if len(value) > 63 or not _DNS_LABEL.match(value):
        raise ValueError(
            f"expected a DNS-1123 label (lower-case letters, digits and '-', starting and ending "
            f"with a letter or digit, at most 63 characters), got {value!r}"
        )
    return value


def _extended_resource(value: str) -> str:
    if len(value) > 253 or not _EXTENDED_RESOURCE.match(value):
        raise ValueError(
            f"expected a domain-prefixed extended resource name such as nvidia.com/gpu or "
            f"nvidia.com/mig-1g.10gb, got {value!r}"
        )
    return value


def _label_map(value: dict[str, str]) -> dict[str, str]:
    for key, val in value.items():
        if not _LABEL_KEY.match(key) or len(key.split("/")[-1]) > 63:
            raise ValueError(f"{key!r} is not a valid Kubernetes label key")
        if not isinstance(val, str) or len(val) > 63 or not _LABEL_VALUE.match(val):
            raise ValueError(f"label {key!r}: {val!r} is not a valid Kubernetes label value")
    return dict(sorted(value.items()))


def _device_class_name(value: str) -> str:
    # A DeviceClass is named by a DNS subdomain; Kueue's deviceClassNames also take it as a
    # qualified name without prefix, which caps it at 63 characters.
    if len(value) > 63 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(
            f"expected a DeviceClass name (a DNS subdomain of at most 63 characters, such as "
            f"gpu.nvidia.com), got {value!r}"
        )
    return value


def _kueue_resource_name(value: str) -> str:
    # Kueue validates a deviceClassMappings name as a label key: an optional DNS-subdomain prefix
    # and '/', then a name of at most 63 characters.
    if len(value) > 253 or not _LABEL_KEY.match(value) or len(value.split("/")[-1]) > 63:
        raise ValueError(
            f"expected a resource name Kueue accepts in deviceClassMappings (a label key such as "
            f"gpu.nvidia.com or example.com/gpus), got {value!r}"
        )
    return value


Name = Annotated[str, AfterValidator(_dns_label)]
DeviceClassName = Annotated[str, AfterValidator(_device_class_name)]
KueueResourceName = Annotated[str, AfterValidator(_kueue_resource_name)]
ResourceName = Annotated[str, AfterValidator(_extended_resource)]
LabelMap = Annotated[dict[str, str], AfterValidator(_label_map)]
# REPO:TAG, REPO@sha256:<hex> or REPO:TAG@sha256:<hex>; the Deployment uses it as given.
ImageReference = Annotated[str, AfterValidator(validate_image_ref)]


class Model(BaseModel):
    """Base for every section: camelCase keys, unknown keys rejected, immutable."""

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        frozen=True,
        str_strip_whitespace=True,
    )


# --- GPU flavors -------------------------------------------------------------------------------


class Taint(Model):
    key: str = Field(
        description="The taint's key, as on the Node.",
    )
    value: str | None = Field(
        None,
        description="The taint's value (none for a key-only taint).",
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] = Field(
        description="The taint's effect.",
    )


class Toleration(Model):
    key: str | None = Field(
        None,
        description="The taint key tolerated; none with operator Exists tolerates every taint.",
    )
    operator: Literal["Equal", "Exists"] = Field(
        "Equal",
        description="Equal matches key and value; Exists matches the key whatever its value.",
    )
    value: str | None = Field(
        None,
        description="The value tolerated with operator Equal.",
    )
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None,
        description="The effect tolerated; none tolerates every effect.",
    )


class Flavor(Model):
    """A GPU model or MIG profile: one Kueue ResourceFlavor that provides one resource, either a
    device-plugin resource (`resource`) or the Kueue resource of a DRA device class (`deviceClass`)."""

    name: Name = Field(
        description="The ResourceFlavor's name; teams[].quota and namespaceQuota refer to the flavor by it.",
    )
    resource: ResourceName | None = Field(
        default=None, description="the device-plugin resource, e.g. nvidia.com/gpu"
    )
    device_class: DeviceClassName | None = Field(
        default=None,
        description="a deviceClasses name: the flavor's GPUs come through DRA and are charged under "
        "that class's Kueue resource",
    )
    node_labels: LabelMap = Field(
        default_factory=dict,
        description="The labels of this flavor's nodes (ResourceFlavor spec.nodeLabels): Kueue adds "
        "them to an admitted workload's node selector, and the controller counts a "
        "node's GPUs under the flavor whose labels it carries.",
    )
    node_taints: list[Taint] = Field(
        default_factory=list,
        description="Taints of this flavor's nodes (ResourceFlavor spec.nodeTaints): Kueue admits "
        "onto the flavor only workloads that tolerate them.",
    )
    tolerations: list[Toleration] = Field(
        default_factory=list,
        description="Tolerations Kueue adds to workloads admitted onto this flavor (ResourceFlavor "
        "spec.tolerations).",
    )

    @model_validator(mode="after")
    def _one_source(self) -> Flavor:
        if (self.resource is None) == (self.device_class is None):
            raise ValueError(
                "a flavor takes either `resource` (a device-plugin resource such as nvidia.com/gpu) "
                "or `deviceClass` (a DRA device class of deviceClasses), exactly one of them"
            )
        return self


class DeviceClass(Model):
    """A DRA DeviceClass whose devices are GPUs, and the resource Kueue charges them under
    (Kueue's Configuration `resources.deviceClassMappings`). `resource` defaults to the class name."""

    name: DeviceClassName = Field(
        description="The DeviceClass's name, as published by the DRA driver (gpu.nvidia.com, "
        "mig.nvidia.com); a flavor names it in deviceClass.",
    )
    resource: KueueResourceName = Field(
        description="The resource Kueue charges the class's devices under (Kueue Configuration "
        "resources.deviceClassMappings); defaults to the class name. Give it a name of "
        "its own, never a device-plugin name such as nvidia.com/gpu, so nothing is "
        "counted twice.",
    )
    extended_resource_name: ResourceName | None = Field(
        default=None,
        description="the class's spec.extendedResourceName (Kubernetes DRAExtendedResource): pods "
        "that request it in their containers' resources get devices of the class",
    )

    @property
    def extended_resource_names(self) -> tuple[str, ...]:
        """The extended resources a pod gets this class's devices through: the configured one
        and the implicit `deviceclass.resource.kubernetes.io/<class>` every class has."""
        implicit = IMPLICIT_EXTENDED_RESOURCE_PREFIX + self.name
        return (self.extended_resource_name, implicit) if self.extended_resource_name else (implicit,)

    @model_validator(mode="before")
    @classmethod
    def _resource_defaults_to_name(cls, raw: Any) -> Any:
        if isinstance(raw, dict) and "resource" not in raw and isinstance(raw.get("name"), str):
            return {**raw, "resource": raw["name"]}
        return raw


# Kubernetes' implicit extended resource name of every DeviceClass (resource/v1
# ResourceDeviceClassPrefix): a pod requesting `<prefix><class>: N` gets N devices of the class.
IMPLICIT_EXTENDED_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
# NVIDIA's DRA driver (k8s-dra-driver-gpu) publishes these DeviceClasses: whole GPUs and MIG devices.
DEFAULT_DEVICE_CLASSES = ("gpu.nvidia.com", "mig.nvidia.com")
# Kueue's limits on deviceClassMappings (pkg/config/validation.go, v0.17 to v0.19).
_KUEUE_MAX_MAPPINGS = 16
_KUEUE_MAX_CLASSES_PER_MAPPING = 8


# --- teams and queues ----------------------------------------------------------------------------


class FlavorQuota(Model):
    """Quota of one flavor for one team. A bare quantity is shorthand for {nominalQuota: q}."""

    nominal_quota: Quantity = Field(
        description="GPUs of the flavor the team is guaranteed (Kueue nominalQuota); a whole number.",
    )
    borrowing_limit: Quantity | None = Field(
        None,
        description="At most this many GPUs borrowed from the cohort beyond nominalQuota (none: no "
        "limit); needs a cohort.",
    )
    lending_limit: Quantity | None = Field(
        None,
        description="At most this many of the nominal GPUs lent to the cohort (none: all of them); "
        "needs a cohort, at most nominalQuota.",
    )

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, raw: Any) -> Any:
        if isinstance(raw, (str, int, float)) and not isinstance(raw, bool):
            return {"nominalQuota": raw}
        return raw


class BorrowWithinCohort(Model):
    policy: Literal["Never", "LowerPriority"] = Field(
        "Never",
        description="Never, or LowerPriority: preempt lower-priority workloads of other "
        "ClusterQueues to borrow; needs reclaimWithinCohort other than Never.",
    )
    max_priority_threshold: int | None = Field(
        None,
        description="Only workloads at or below this priority may be preempted while borrowing.",
    )


class Preemption(Model):
    reclaim_within_cohort: Literal["Never", "LowerPriority", "Any"] = Field(
        "Never",
        description="Whether pending work may preempt workloads of other ClusterQueues in the "
        "cohort that borrow this team's quota (Never, LowerPriority, Any).",
    )
    within_cluster_queue: Literal["Never", "LowerPriority", "LowerOrNewerEqualPriority"] = Field(
        "Never",
        description="Whether pending work may preempt the team's own admitted workloads (Never, "
        "LowerPriority, LowerOrNewerEqualPriority).",
    )
    borrow_within_cohort: BorrowWithinCohort = Field(
        default_factory=BorrowWithinCohort,
        description="Whether the team may preempt in the cohort while borrowing; Kueue allows it "
        "only with classical preemption (kueue.fairSharing disabled).",
    )


class FairSharing(Model):
    weight: Quantity = Field(
        Quantity("1"),
        description="The fair-sharing weight (Kueue spec.fairSharing.weight): a higher weight gets "
        "a larger share of what the cohort lends.",
    )


class Team(Model):
    """A team owns one ClusterQueue (named after the team)."""

    name: Name = Field(
        description="The team's name: its ClusterQueue's name, and the value opted-in namespaces "
        "carry in the ghostgpu.io/team label.",
    )
    cohort: Name | None = Field(
        None,
        description="The cohort the team's ClusterQueue joins to borrow and lend quota; none keeps it alone.",
    )
    quota: dict[str, FlavorQuota] = Field(
        min_length=1,
        description="Quota per flavor (flavor name -> quota): the team's ClusterQueue's quota of the "
        "flavor's GPU resource. A bare number is shorthand for {nominalQuota: n}.",
    )
    preemption: Preemption = Field(
        default_factory=Preemption,
        description="How the team's ClusterQueue preempts to admit its work (Kueue spec.preemption).",
    )
    fair_sharing: FairSharing | None = Field(
        None,
        description="The ClusterQueue's fair-sharing weight in its cohort (only with "
        "kueue.fairSharing.enabled).",
    )
    queueing_strategy: Literal["BestEffortFIFO", "StrictFIFO"] = Field(
        "BestEffortFIFO",
        description="BestEffortFIFO lets a smaller workload be admitted past one that does not fit; "
        "StrictFIFO keeps the order.",
    )
    namespace_quota: dict[str, Quantity] | None = Field(
        default=None,
        description="optional GPU ResourceQuota per opted-in namespace of the team: flavor -> count",
    )


class Cohort(Model):
    name: Name = Field(
        description="The Cohort's name; teams[].cohort refers to it.",
    )
    fair_sharing: FairSharing | None = Field(
        None,
        description="The Cohort's fair-sharing weight within its parent (only with "
        "kueue.fairSharing.enabled).",
    )


class PriorityClass(Model):
    """A Kueue WorkloadPriorityClass."""

    name: Name = Field(
        description="The WorkloadPriorityClass's name, which workloads name in their "
        "kueue.x-k8s.io/priority-class label.",
    )
    value: int = Field(
        ge=-2147483648,
        le=1000000000,
        description="The priority: higher is admitted first and may preempt lower.",
    )
    description: str = Field(
        "",
        description="Free text kept on the object for people.",
    )


class StaticNamespace(Model):
    """A namespace that gets its LocalQueue from the kueue/ bundle instead of from Kyverno."""

    name: Name = Field(
        description="The namespace.",
    )
    team: Name = Field(
        description="The team whose ClusterQueue the LocalQueue points at.",
    )
    queue_name: Name = Field(
        DEFAULT_LOCAL_QUEUE,
        description="The LocalQueue's name; `default` is the one Kueue puts pod-based workloads "
        "without a queue-name label into.",
    )


# --- Kueue manager configuration -----------------------------------------------------------------


class WaitForPodsReady(Model):
    """All-or-nothing admission: evict and requeue workloads whose pods are not all ready in time."""

    enabled: bool = Field(
        True,
        description="Render waitForPodsReady at all.",
    )
    timeout: Duration = Field(
        Duration("10m"),
        description="How long an admitted workload's pods may take to be ready before Kueue evicts it.",
    )
    block_admission: bool = Field(
        True,
        description="Admit nothing else while an admitted workload's pods are not ready yet (Kueue "
        "blockAdmission).",
    )
    recovery_timeout: Duration | None = Field(
        None,
        description="How long a workload whose pods were ready may go not-ready before Kueue evicts "
        "it (none: never for that reason).",
    )


class KueueFairSharing(Model):
    enabled: bool = Field(
        True,
        description="Turn fair sharing on: preemption within a cohort follows each ClusterQueue's "
        "share and weight.",
    )
    preemption_strategies: list[Literal["LessThanOrEqualToFinalShare", "LessThanInitialShare"]] = Field(
        default_factory=lambda: ["LessThanOrEqualToFinalShare", "LessThanInitialShare"],
        description="The fair-sharing preemption strategies, in order; Kueue accepts only these three lists.",
    )

    @field_validator("preemption_strategies")
    @classmethod
    def _kueue_accepts_strategies(cls, value: list[str]) -> list[str]:
        if list(value) not in _FAIR_SHARING_STRATEGY_SETS:
            allowed = " or ".join(str(s) for s in _FAIR_SHARING_STRATEGY_SETS)
            raise ValueError(f"expected one of {allowed} (Kueue accepts only these)")
        return value


# The only preemption-strategy lists Kueue's configuration validation accepts (v0.17 to v0.19).
_FAIR_SHARING_STRATEGY_SETS = (
    ["LessThanOrEqualToFinalShare"],
    ["LessThanInitialShare"],
    ["LessThanOrEqualToFinalShare", "LessThanInitialShare"],
)
# Kueue's built-in integrations (jobframework registry, the same in v0.17 to v0.19); Kueue refuses
# to start on others.
KUEUE_FRAMEWORKS = (
    "batch/job",
    "kubeflow.org/mpijob",
    "ray.io/rayjob",
    "ray.io/raycluster",
    "ray.io/rayservice",
    "jobset.x-k8s.io/jobset",
    "kubeflow.org/paddlejob",
    "kubeflow.org/pytorchjob",
    "kubeflow.org/tfjob",
    "kubeflow.org/xgboostjob",
    "kubeflow.org/jaxjob",
    "workload.codeflare.dev/appwrapper",
    "trainer.kubeflow.org/trainjob",
    "sparkoperator.k8s.io/sparkapplication",
    "pod",
    "deployment",
    "statefulset",
    "leaderworkerset.x-k8s.io/leaderworkerset",
)
# Kueue's shipped default list: frameworks whose CRDs are absent are skipped at start, so keeping
# them costs nothing and replacing Kueue's ConfigMap does not silently drop an integration.
_DEFAULT_FRAMEWORKS = [f for f in KUEUE_FRAMEWORKS if f != "sparkoperator.k8s.io/sparkapplication"]


class KueueConfig(Model):
    namespace: Name = Field(
        "kueue-system",
        description="The namespace Kueue runs in: its manager ConfigMap is written there, and it is "
        "left out of managedJobsNamespaceSelector.",
    )
    config_map_name: Name = Field(
        "kueue-manager-config",
        description="The name of Kueue's manager ConfigMap, which the rendered one replaces.",
    )
    # Pod-based integrations (pod, deployment, statefulset) are what ghostgpu is about.
    frameworks: list[str] = Field(
        default_factory=lambda: list(_DEFAULT_FRAMEWORKS),
        min_length=1,
        description="Kueue's integrations (Configuration integrations.frameworks): the job kinds "
        "Kueue manages. pod, deployment and statefulset are required, since routing new "
        "GPU workloads into the `default` LocalQueue works through them; frameworks "
        "whose CRDs are absent are skipped by Kueue at start.",
    )
    wait_for_pods_ready: WaitForPodsReady = Field(
        default_factory=WaitForPodsReady,
        description="All-or-nothing admission (Kueue waitForPodsReady): a workload whose pods are "
        "not all ready in time is evicted and requeued.",
    )
    fair_sharing: KueueFairSharing = Field(
        default_factory=KueueFairSharing,
        description="Kueue's fair sharing among the ClusterQueues of a cohort (Configuration fairSharing).",
    )
    # ClusterQueues here cover GPU resources only; Kueue refuses workloads that request a
    # resource no ClusterQueue covers, so CPU and memory are left to the scheduler.
    exclude_resource_prefixes: list[str] = Field(
        default_factory=lambda: ["cpu", "memory", "ephemeral-storage", "hugepages-"],
        description="Resources Kueue does not account (Configuration "
        "resources.excludeResourcePrefixes). The ClusterQueues cover GPUs only, and "
        "Kueue refuses a workload that requests a resource no ClusterQueue covers, so "
        "CPU and memory are left to the scheduler.",
    )

    @field_validator("frameworks")
    @classmethod
    def _known_frameworks(cls, frameworks: list[str]) -> list[str]:
        unknown = [f for f in frameworks if f not in KUEUE_FRAMEWORKS]
        if unknown:
            raise ValueError(
                f"unknown Kueue framework(s) {', '.join(map(repr, unknown))}; "
                f"Kueue knows: {', '.join(KUEUE_FRAMEWORKS)}"
            )
        if len(set(frameworks)) != len(frameworks):
            raise ValueError("an integration is listed twice (Kueue rejects duplicates)")
        if not {"pod", "deployment", "statefulset"} <= set(frameworks):
            # ghostgpu's routing of new workloads (LocalQueue `default`) needs them
            # (docs/design.md#labelling-contract).
            raise ValueError("expected pod, deployment and statefulset among the frameworks")
        return frameworks


class PoliciesConfig(Model):
    # Tracking must never block a workload: a policy error skips the label instead.
    failure_policy: Literal["Ignore", "Fail"] = Field(
        "Ignore",
        description="The Kyverno policies' failurePolicy. Ignore: a policy error skips the "
        "ghostgpu.io/tracked label and never blocks a workload; Fail: the request is "
        "refused.",
    )
    validate_job_queue_name: bool = Field(
        True,
        description="Render validate-job-queue-name.yaml, an Audit-mode policy that reports GPU "
        "Jobs without a kueue.x-k8s.io/queue-name label.",
    )


# --- controller section (the controller reads this from its ConfigMap) ---------------------------

SignalName = Literal["utilization", "processes", "artifacts", "faults", "memory"]
_QUERY_PLACEHOLDERS = frozenset(
    {
        "namespace_label",
        "pod_label",
        "namespaces",
        "pods",
        "utilization_metric",
        "framebuffer_metric",
        "xid_metric",
        "source",
        "window",
    }
)


def _query_template(value: str) -> str:
    template = Template(value)
    if not template.is_valid():
        raise ValueError("invalid $-placeholder in PromQL template (write $$ for a literal $)")
    unknown = sorted(set(template.get_identifiers()) - _QUERY_PLACEHOLDERS)
    if unknown:
        raise ValueError(
            f"unknown placeholder(s) {', '.join('${' + u + '}' for u in unknown)}; "
            f"known: {', '.join('${' + p + '}' for p in sorted(_QUERY_PLACEHOLDERS))}"
        )
    return value


QueryTemplate = Annotated[str, AfterValidator(_query_template)]


_PROM_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


def _source_selector(value: dict[str, str]) -> dict[str, str]:
    """Label name -> regex a series' label must fully match (PromQL `=~`): the scrape job (and
    namespace) that produce a signal. A regex that matches the empty string would also accept a
    series without the label, so it pins nothing."""
    if not value:
        raise ValueError(
            "name at least one label of the scrape that produces the series, e.g. {job: dcgm-exporter}"
        )
    for name, regex in value.items():
        if not _PROM_LABEL_NAME.match(name) or name.startswith("__"):
            raise ValueError(f"{name!r} is not a Prometheus label name (or is a reserved __ label)")
        if not isinstance(regex, str) or "\n" in regex:
            raise ValueError(f"{name}: expected a one-line regular expression, got {regex!r}")
        try:
            compiled = re.compile(regex)
        except re.error as exc:
            raise ValueError(f"{name}: {regex!r} is not a regular expression ({exc})") from None
        if compiled.fullmatch(""):
            raise ValueError(
                f"{name}: {regex!r} matches the empty string, so it also selects series without a "
                f"{name} label: name the source's value(s), e.g. dcgm-exporter|nvidia-dcgm-exporter"
            )
    return dict(sorted(value.items()))


SourceSelector = Annotated[dict[str, str], AfterValidator(_source_selector)]


# The scrape job of the GPU Operator's dcgm-exporter (its Service, nvidia-dcgm-exporter) and of the
# dcgm-exporter Helm chart's (dcgm-exporter).
DCGM_JOBS = "nvidia-dcgm-exporter|dcgm-exporter"
# The rendered node agent's scrape: its ServiceMonitor's job (the Service's app.kubernetes.io/name)
# and the namespace Prometheus sets from the target (the agent's own; render.AGENT_NAMESPACE).
AGENT_SOURCE = {"job": "ghostgpu-agent", "namespace": "ghostgpu-agent"}


class MetricsPreset(Model):
    """Where GPU signals live in Prometheus for one exporter family.

    Query templates are `string.Template` PromQL; the controller fills `${namespaces}` with the
    regex alternation of the tracked pods' namespaces and `${pods}` with `.+`, and keeps the tracked
    pods' series itself: one query per poll covers the whole fleet, and its size does not grow
    with it (`render_query` still names pods, for a person reading one workload's series).
    `${source}` is the preset's `source` selector (`xidSource` in xidQuery): every series is read
    from the scrape that produces it, never by metric name and pod labels alone (docs/threat-model.md).
    `${window}` is two scrape intervals: the utilization reading is the busiest sample in it."""

    utilization_metric: str = Field(
        description="The GPU utilization series.",
    )
    utilization_scale: float = Field(1.0, gt=0, description="multiply by this to get percent (0-100)")
    framebuffer_metric: str = Field(
        description="The GPU memory (framebuffer) used series.",
    )
    framebuffer_unit_bytes: int = Field(gt=0, description="bytes per unit of framebuffer_metric")
    xid_metric: str = Field(
        description="The XID error series: fault evidence for ZOMBIE_CRASHED.",
    )
    namespace_label: str = Field(
        description="The label that carries the pod's namespace on these series (exported_namespace "
        "when Prometheus renames it on scrape).",
    )
    pod_label: str = Field(
        description="The label that carries the pod's name on these series.",
    )
    source: SourceSelector = Field(
        description="Labels of the scrape that produces the utilization and framebuffer series "
        "(job, and namespace where it helps); series of any other scrape are not read."
    )
    xid_source: SourceSelector = Field(description="The same, for the XID series.")
    pod_uid_label: str = Field(
        "",
        description="The exporter's label with the pod's UID (dcgm-exporter: pod_uid, with "
        "--kubernetes-enable-pod-uid); a series whose UID is not the live pod's fails the pod.",
    )
    utilization_query: QueryTemplate = Field(
        description="The utilization query ($-placeholders filled per poll); one query covers every "
        "tracked pod.",
    )
    framebuffer_query: QueryTemplate = Field(
        description="The GPU memory (framebuffer) query, per pod, in units of framebufferUnitBytes.",
    )
    xid_query: QueryTemplate = Field(
        description="The XID query, per pod.",
    )

    @field_validator("pod_uid_label")
    @classmethod
    def _uid_label(cls, value: str) -> str:
        if value and not _PROM_LABEL_NAME.match(value):
            raise ValueError(f"{value!r} is not a Prometheus label name")
        return value

    @model_validator(mode="after")
    def _pinned(self) -> MetricsPreset:
        for key, template in (
            ("utilizationQuery", self.utilization_query),
            ("framebufferQuery", self.framebuffer_query),
            ("xidQuery", self.xid_query),
        ):
            if template and "${source}" not in template:
                raise ValueError(
                    f"{key} must select its series with ${{source}} (the scrape that produces them, "
                    f"e.g. {{${{source}}, ...}}): a series matched by name and pod labels alone can "
                    f"come from any target"
                )
        if "${window}" not in self.utilization_query:
            raise ValueError(
                "utilizationQuery must read the busiest sample of the window, e.g. "
                "max_over_time(...[${window}]): an instant read sees only the newest sample, which "
                "a second producer can interleave"
            )
        return self

    def render_query(
        self,
        kind: Literal["utilization", "framebuffer", "xid"],
        pods: Sequence[tuple[str, str]],
        window: str = "1m",
    ) -> str:
        """PromQL for `kind` over the given (namespace, pod) pairs, batched into one query."""
        template = {
            "utilization": self.utilization_query,
            "framebuffer": self.framebuffer_query,
            "xid": self.xid_query,
        }[kind]
        namespaces = sorted({ns for ns, _ in pods})
        names = sorted({pod for _, pod in pods})
        return Template(template).substitute(
            namespace_label=self.namespace_label,
            pod_label=self.pod_label,
            namespaces=_promql_alternation(namespaces),
            pods=_promql_alternation(names),
            utilization_metric=self.utilization_metric,
            framebuffer_metric=self.framebuffer_metric,
            xid_metric=self.xid_metric,
            source=label_matchers(self.xid_source if kind == "xid" else self.source),
            window=window,
        )


def _promql_alternation(values: Sequence[str]) -> str:
    # Names are DNS labels; only '.' needs escaping, doubled because PromQL strings unescape once.
    return "|".join(v.replace(".", "\\\\.") for v in values) if values else "^$"


_SELECTOR = '{${source}, ${namespace_label}=~"${namespaces}", ${pod_label}=~"${pods}"}'


def _dcgm_preset() -> MetricsPreset:
    # dcgm-exporter with Kubernetes pod mapping; GPU Operator scrapes it with honorLabels so the
    # pod labels stay `namespace`/`pod` (set exported_namespace/exported_pod otherwise).
    return MetricsPreset(
        utilization_metric="DCGM_FI_DEV_GPU_UTIL",
        utilization_scale=1.0,
        framebuffer_metric="DCGM_FI_DEV_FB_USED",
        framebuffer_unit_bytes=1024 * 1024,
        xid_metric="DCGM_FI_DEV_XID_ERRORS",
        namespace_label="namespace",
        pod_label="pod",
        source={"job": DCGM_JOBS},
        xid_source={"job": DCGM_JOBS},
        pod_uid_label="pod_uid",
        utilization_query="max by (${namespace_label}, ${pod_label}) (max_over_time(${utilization_metric}"
        + _SELECTOR
        + "[${window}]))",
        # One GPU's series per container that uses it: a DRA device two containers name is two
        # series (dcgm-exporter's toDeviceToPodsDRA), counted once. The fullest sample of the window.
        framebuffer_query="sum by (${namespace_label}, ${pod_label}) "
        + "(max without (container) (max_over_time(${framebuffer_metric}"
        + _SELECTOR
        + "[${window}])))",
        xid_query="max by (${namespace_label}, ${pod_label}) (${xid_metric}" + _SELECTOR + ")",
    )


def _hami_preset() -> MetricsPreset:
    # HAMi's per-container vGPU monitor (device plugin, port 31992). HAMi exports no XID
    # counter; the XID query reads dcgm-exporter, which HAMi deployments usually run alongside.
    return MetricsPreset(
        utilization_metric="Device_utilization_desc_of_container",
        utilization_scale=1.0,
        framebuffer_metric="vGPU_device_memory_usage_in_bytes",
        framebuffer_unit_bytes=1,
        xid_metric="DCGM_FI_DEV_XID_ERRORS",
        namespace_label="podnamespace",
        pod_label="podname",
        # HAMi's device plugin monitor Service (hami-device-plugin-monitor); XIDs from dcgm-exporter.
        source={"job": "hami-device-plugin-monitor"},
        xid_source={"job": DCGM_JOBS},
        utilization_query="max by (${namespace_label}, ${pod_label}) (max_over_time(${utilization_metric}"
        + _SELECTOR
        + "[${window}]))",
        framebuffer_query="sum by (${namespace_label}, ${pod_label}) (max without (container) "
        + "(max_over_time(${framebuffer_metric}"
        + _SELECTOR
        + "[${window}])))",
        xid_query="max by (namespace, pod) "
        + '(${xid_metric}{${source}, namespace=~"${namespaces}", pod=~"${pods}"})',
    )


class MetricsConfig(Model):
    """Both presets are always present; a key given under `dcgm:` or `hami:` overrides just that
    field of the built-in preset (e.g. only namespaceLabel/podLabel)."""

    preset: Literal["dcgm", "hami"] = Field(
        "dcgm",
        description="The exporter family whose series the controller and the idle alert read: dcgm "
        "(dcgm-exporter) or hami (HAMi's vGPU monitor).",
    )
    dcgm: MetricsPreset = Field(
        default_factory=_dcgm_preset,
        description="The dcgm-exporter preset; a key given here overrides just that field of the "
        "built-in one.",
    )
    hami: MetricsPreset = Field(
        default_factory=_hami_preset,
        description="The HAMi preset; a key given here overrides just that field of the built-in one.",
    )
    agent_source: SourceSelector = Field(
        default_factory=lambda: dict(AGENT_SOURCE),
        description="Labels of the scrape of the node agent (processSource: agent): the rendered "
        "ServiceMonitor's job and the agent's namespace, which Prometheus sets from the target.",
    )
    scrape_interval: Duration = Field(
        Duration("30s"),
        description="How often Prometheus scrapes the GPU exporter and the agent (the longer of the "
        "two): a busy sample anywhere in the last two intervals keeps a workload.",
    )
    max_clock_skew: Duration = Field(
        Duration("5s"),
        description="How far a sample's time or the agent's scan time may lead the controller's "
        "clock, on top of prometheus.timeout (a sample scraped while the query runs); further "
        "ahead, the signal fails (a producer writing ahead drops the real samples).",
    )

    @model_validator(mode="before")
    @classmethod
    def _merge_over_builtin(cls, raw: Any) -> Any:
        if not isinstance(raw, dict):
            return raw
        merged = dict(raw)
        for key, builtin in (("dcgm", _dcgm_preset), ("hami", _hami_preset)):
            if isinstance(raw.get(key), dict):
                merged[key] = {**builtin().model_dump(by_alias=True), **raw[key]}
        return merged

    @property
    def active(self) -> MetricsPreset:
        return self.dcgm if self.preset == "dcgm" else self.hami


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"expected an http:// or https:// URL such as http://prometheus:9090, got {value!r}")
    return value


class PrometheusConfig(Model):
    url: Annotated[str, AfterValidator(_http_url)] = Field(
        "http://prometheus-operated.monitoring.svc:9090",
        description="The Prometheus the controller queries for utilization, memory, XID errors and "
        "(in agent mode) processes.",
    )
    timeout: Duration = Field(
        Duration("10s"),
        description="Timeout of one query; a query that times out is a failed signal (UNKNOWN), "
        "never a zero.",
    )
    ingest_delay: Duration | None = Field(
        None,
        description="How long after a scrape the store may take before a query sees the sample: "
        "the query's windows (two scrape intervals) grow by it. Unset for Prometheus, which "
        "answers with a sample once scraped; VictoriaMetrics holds new samples in memory for up "
        "to about 4 s first, so 5s there (docs/victoriametrics.md). Too short, the newest samples "
        "are not in the window: with a short scrape interval a pod reads as missing (UNKNOWN).",
    )

    max_query_bytes: int = Field(
        16384,
        ge=4096,
        le=16 << 20,
        description="The longest query the controller sends. After the first poll, the node "
        "agent's series are asked for the pods read idle the poll before, by name, while the "
        "query stays this short; past it, for every pod at zero (a slower query for the store). "
        "The default is VictoriaMetrics' own limit (-search.maxQueryLen); Prometheus has none, "
        "so raise it there when more pods sit idle than fit (docs/scale.md).",
    )

    @property
    def ingest_delay_seconds(self) -> float:
        return self.ingest_delay.seconds if self.ingest_delay is not None else 0.0


class ApiserverConfig(Model):
    """The client-side budget every apiserver write and exec waits on (ghostgpu.controller.budget):
    a token bucket of `burst` requests refilled at `qps` per second, like client-go's rate limiter
    (controller-runtime's defaults)."""

    qps: float = Field(20.0, gt=0, le=10000, description="writes and execs per second, sustained")
    burst: int = Field(
        30, ge=1, le=100000, description="writes and execs allowed at once after a quiet spell"
    )


class S3Config(Model):
    endpoint: str | None = Field(
        None, description="S3-compatible endpoint for s3:// artifact URIs; None = AWS"
    )
    region: str | None = Field(
        None,
        description="The region of the S3 client; none takes the environment's.",
    )


class ReclaimSwitches(Model):
    """Which reclaimable verdicts may act at all (the risk gate still applies)."""

    model_config = ConfigDict(alias_generator=None)
    FINISHED_IDLE: bool = Field(
        True,
        description="Reclaim workloads judged FINISHED_IDLE (utilization zero, no live process, no "
        "output growth).",
    )
    ZOMBIE_CRASHED: bool = Field(
        True,
        description="Reclaim workloads judged ZOMBIE_CRASHED (idle with fault evidence or only "
        "defunct processes).",
    )

    def allows(self, verdict: str) -> bool:
        return bool(getattr(self, verdict, False))


class ActionsConfig(Model):
    reclaim: ReclaimSwitches = Field(
        default_factory=ReclaimSwitches,
        description="Which reclaimable verdicts may act at all (the risk gate still applies).",
    )


class AlertsConfig(Model):
    """Idle-GPU alert: average utilization below X% and framebuffer below Y, for a while."""

    utilization_below_percent: float = Field(
        10.0,
        gt=0,
        le=100,
        description="The idle alert fires for a pod whose average GPU utilization stays below this "
        "percent (and whose GPU memory stays below framebufferBelow) for `for`.",
    )
    framebuffer_below: Quantity = Field(
        Quantity("500Mi"),
        description="The idle alert's GPU memory line: a pod must also stay below this much "
        "framebuffer used.",
    )
    for_: Duration = Field(
        Duration("1h"),
        alias="for",
        description="How long both must hold before the alert fires.",
    )
    smoothing: Duration = Field(Duration("10m"), description="averaging window inside the expression")
    severity: str = Field(
        "warning",
        description="The alert's severity label, for your Alertmanager routes.",
    )
    rule_labels: LabelMap = Field(
        default_factory=dict, description="labels your Prometheus ruleSelector needs"
    )


class ServiceMonitorConfig(Model):
    enabled: bool = Field(
        True,
        description="Render the ServiceMonitor (needs the prometheus-operator CRDs).",
    )
    interval: Duration = Field(
        Duration("30s"),
        description="How often Prometheus scrapes the controller.",
    )
    labels: LabelMap = Field(
        default_factory=dict, description="labels your Prometheus serviceMonitorSelector needs"
    )


# `http://<service>.<namespace>.svc[.cluster.local][:port]`: a Prometheus inside the cluster.
_IN_CLUSTER_URL = re.compile(r"^https?://[a-z0-9-]+\.([a-z0-9-]+)\.svc(?:\.[a-z0-9.-]+)?(?::\d+)?(?:/.*)?$")
DEFAULT_PROMETHEUS_NAMESPACE = "monitoring"


class NetworkPolicyConfig(Model):
    """NetworkPolicies on the controller's port and the node agent's: connections only from the
    namespace Prometheus runs in (the kubelet's probes come from the node, which a NetworkPolicy
    never blocks)."""

    enabled: bool = Field(
        True,
        description="Render controller/networkpolicy.yaml (needs a network plugin that enforces "
        "NetworkPolicy to take effect).",
    )
    prometheus_namespace: Name | None = Field(
        None,
        description="The namespace whose pods scrape the controller and the agent; unset: the "
        "namespace of controller.prometheus.url when it is a Service in the cluster "
        "(http://<service>.<namespace>.svc...), else monitoring.",
    )


_PROGRAM = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")


def _program_names(names: list[str]) -> list[str]:
    for name in names:
        if not _PROGRAM.match(name):
            raise ValueError(
                f"{name!r} is not a program name (the command's base name, e.g. sleep or supervisord: "
                "letters, digits, . _ + -, no path)"
            )
    if len(set(names)) != len(names):
        raise ValueError("a program is listed twice")
    return names


ProgramNames = Annotated[list[str], AfterValidator(_program_names)]
_DEFAULT_PROCESSES = ProcessPolicy()


class ProcessesConfig(Model):
    """How the verdict reads a process tree that only waits (ghostgpu.verdict.ProcessPolicy).

    Wrappers and holders are discounted only when nothing else lives beside them; timers (a
    finite wait between periodic runs) and attached sessions are always live work. A list given
    here replaces the built-in one."""

    wrappers: ProgramNames = Field(
        default_factory=lambda: sorted(_DEFAULT_PROCESSES.wrappers),
        description="Programs that wait on their children (init, shell, supervisor): not work by "
        "themselves, and discounted only when nothing else lives beside them.",
    )
    holders: ProgramNames = Field(
        default_factory=lambda: sorted(_DEFAULT_PROCESSES.holders),
        description="Programs that only keep a container alive (pause; `sleep` of at least "
        "foreverSleep counts too): discounted like wrappers.",
    )
    timers: ProgramNames = Field(
        default_factory=lambda: sorted(_DEFAULT_PROCESSES.timers),
        description="Programs that wait a finite time between periodic runs (cron, timeout): always "
        "live work, so a periodic job is never reclaimed between runs.",
    )
    interpreters: ProgramNames = Field(
        default_factory=lambda: sorted(_DEFAULT_PROCESSES.interpreters),
        description="Interpreters seen through: `python3 /usr/bin/supervisord` is the program "
        "supervisord, so the lists above apply to scripts too.",
    )
    forever_sleep: Duration = Field(
        Duration("8760h"), description="`sleep N` at least this long is a holder, shorter is a timer"
    )

    def policy(self) -> ProcessPolicy:
        return ProcessPolicy(
            wrappers=frozenset(self.wrappers),
            holders=frozenset(self.holders),
            timers=frozenset(self.timers),
            interpreters=frozenset(self.interpreters),
            forever_sleep_s=self.forever_sleep.seconds,
        )


class GpuMemoryConfig(Model):
    """Lines for the framebuffer evidence (the `fb` series of the batched query)."""

    free_at_most: Quantity = Field(
        Quantity("64Mi"), description="at or below: no CUDA context (corroborates finished/crashed)"
    )
    held_from: Quantity = Field(Quantity("500Mi"), description="from here IDLE_HELD reports memory held")

    @model_validator(mode="after")
    def _order(self) -> GpuMemoryConfig:
        if self.held_from.value < self.free_at_most.value:
            raise ValueError(f"heldFrom ({self.held_from}) must be at least freeAtMost ({self.free_at_most})")
        return self


class GrafanaDashboardConfig(Model):
    """The Grafana dashboard ConfigMap in controller/ (ghostgpu/dashboard/panels.py lists its panels)."""

    enabled: bool = Field(
        True,
        description="Render the dashboard ConfigMap.",
    )
    labels: LabelMap = Field(
        default_factory=lambda: {"grafana_dashboard": "1"},
        min_length=1,
        description="the label your Grafana sidecar selects dashboards by (kube-prometheus-stack: "
        "grafana_dashboard: '1')",
    )


class DraFlavor(Model):
    """A DRA flavor as the controller sees it (rendered from `flavors[].deviceClass`)."""

    name: Name = Field(
        description="The flavor's name.",
    )
    device_class: DeviceClassName = Field(
        description="The DeviceClass the flavor's devices belong to.",
    )
    resource: KueueResourceName = Field(
        description="The Kueue resource the class's devices are charged under.",
    )  # what Kueue charges its devices under
    node_labels: LabelMap = Field(
        default_factory=dict,
        description="The flavor's node labels: the controller counts a node's devices of the class "
        "under this flavor.",
    )
    # The class's spec.extendedResourceName; left out of the ConfigMap when unset.
    extended_resource_name: ResourceName | None = Field(
        None,
        description="The class's spec.extendedResourceName, when it has one.",
    )

    @property
    def extended_resource_names(self) -> tuple[str, ...]:
        """The extended resources a pod gets devices of the class through (DeviceClass's)."""
        return DeviceClass(
            name=self.device_class, resource=self.resource, extended_resource_name=self.extended_resource_name
        ).extended_resource_names


class GitOpsConfig(Model):
    """The GitOps pre-flight before a stop (ghostgpu/controller/act/gitops.py, docs/gitops.md)."""

    orphan_markers: Literal["escalate", "stale"] = Field(
        "escalate",
        description="what an Argo CD tracking id or Flux label means when this cluster has no such "
        "Application, Kustomization or HelmRelease. escalate: a manager in another cluster (a hub Argo "
        "CD, a Flux with spec.kubeConfig) may sync the workload back, so the reclaim is escalated "
        "once with the fix and nothing is written; stale: nothing outside this cluster manages its "
        "workloads (or the remote managers ignore what the stop writes), so the marker is stale and "
        "the workload is reclaimed",
    )


def _claim_name(value: str) -> str:
    if len(value) > 253 or not _DNS_SUBDOMAIN.match(value):
        raise ValueError(
            f"expected a PersistentVolumeClaim name (a DNS subdomain: lower-case letters, digits, "
            f"'-' and '.', at most 253 characters), got {value!r}"
        )
    return value


class DecisionLogConfig(Model):
    """Where the leader's decision log (`ghostgpu report`'s history) lives in the pod."""

    claim_name: Annotated[str, AfterValidator(_claim_name)] | None = Field(
        None,
        description="a PersistentVolumeClaim in controller.namespace that keeps the decision log "
        "across pod restarts and leader changes (ReadWriteMany when replicas > 1: every replica "
        "mounts it and only the leader writes); unset: an emptyDir, lost with the pod",
    )


class ResourceAmounts(Model):
    """CPU and memory of one container; an amount left unset is not written."""

    cpu: Quantity | None = Field(None, description="CPU in cores (100m, 1); unset: none written")
    memory: Quantity | None = Field(None, description="memory in bytes (320Mi, 1Gi); unset: none written")


class ContainerResources(Model):
    """A container's requests and limits, written into its pod template as they are given."""

    requests: ResourceAmounts = Field(
        default_factory=ResourceAmounts, description="what the scheduler reserves on the node"
    )
    limits: ResourceAmounts = Field(
        default_factory=ResourceAmounts,
        description="the most the container may use (over the memory limit it is OOM-killed)",
    )

    @model_validator(mode="after")
    def _limits_cover_requests(self) -> ContainerResources:
        for name in ("cpu", "memory"):
            want, most = getattr(self.requests, name), getattr(self.limits, name)
            if want is not None and most is not None and most.value < want.value:
                raise ValueError(f"limits.{name} ({most}) is less than requests.{name} ({want})")
        return self

    def manifest(self) -> dict[str, dict[str, str]]:
        """The pod template's `resources`: the amounts that are set."""
        out = {}
        for part in ("requests", "limits"):
            amounts = {k: str(v) for k, v in getattr(self, part).model_dump().items() if v is not None}
            if amounts:
                out[part] = amounts
        return out


# Measured by `ghostgpu bench scale` (docs/scale.md#sizing): the controller's peak RSS at 50,000
# tracked pods is under 300 MB; the limit leaves it ~1.9x, so a fleet of that size is not
# OOM-killed. No CPU limit: a throttled controller only polls slower (its first-verdict poll at
# 50,000 pods takes seconds of CPU), and the request covers the steady polls.
CONTROLLER_RESOURCES = ContainerResources(
    requests=ResourceAmounts(cpu=Quantity("100m"), memory=Quantity("320Mi")),
    limits=ResourceAmounts(memory=Quantity("512Mi")),
)
# The node agent on a node of 110 pods (docs/agent.md, "The agent's own cost"): 35-300 ms of CPU
# per 15 s scan, 61-70 MiB peak RSS.
AGENT_RESOURCES = ContainerResources(
    requests=ResourceAmounts(cpu=Quantity("10m"), memory=Quantity("64Mi")),
    limits=ResourceAmounts(cpu=Quantity("200m"), memory=Quantity("128Mi")),
)


class ControllerConfig(Model):
    """Everything `ghostgpu controller` needs; rendered into controller/configmap.yaml."""

    namespace: Name = Field(
        "ghostgpu-system",
        description="The controller's namespace: its Deployment, ConfigMap, Lease, replica ledger "
        "and alerts live there.",
    )
    service_account: Name = Field(
        "ghostgpu-controller",
        description="The controller's ServiceAccount, which every rendered Role and ClusterRole binds.",
    )
    image: ImageReference = Field(
        "ghcr.io/ghostgpu/ghostgpu:0.1.0",
        description="The controller's (and node agent's) image, REPO:TAG or pinned REPO@sha256:<digest>.",
    )
    replicas: int = Field(
        2,
        ge=1,
        le=10,
        description="Controller replicas; one leader acts and writes, the others keep their caches "
        "warm to take over.",
    )
    resources: ContainerResources = Field(
        default_factory=lambda: CONTROLLER_RESOURCES,
        description="The controller container's requests and limits. The default holds a fleet of "
        "50,000 tracked GPU pods with margin; docs/scale.md#sizing gives CPU and memory by fleet size.",
    )
    agent_resources: ContainerResources = Field(
        default_factory=lambda: AGENT_RESOURCES,
        description="The node agent container's requests and limits (processSource: agent); its "
        "cost grows with the node's process count (docs/agent.md).",
    )
    port: int = Field(8080, ge=1024, le=65535, description="serves /metrics, /healthz, /readyz")
    lease_name: Name = Field(
        "ghostgpu-controller",
        description="The coordination.k8s.io Lease the replicas elect their leader with.",
    )
    mode: Literal["shadow", "enforce"] = Field(
        "shadow",
        description="shadow: judge, record and report what would be reclaimed, never touch a "
        "workload; enforce: reclaim FINISHED_IDLE and ZOMBIE_CRASHED workloads under "
        "the risk gate.",
    )
    poll_interval: Duration = Field(
        Duration("60s"),
        description="Time between polls: each poll takes one utilization sample per workload, "
        "judges and acts.",
    )
    window: int = Field(5, ge=1, le=1000, description="utilization samples K kept per workload")
    long_window: int = Field(30, ge=1, le=10000, description="all-zero samples before IDLE_HELD")
    zero_threshold: float = Field(0.0, ge=0, le=100, description="utilization percent counted as zero")
    startup_grace: Duration = Field(
        Duration("10m"),
        description="A workload whose pods started less than this ago is not judged yet: a job "
        "loading its data or model is idle for a while.",
    )
    stale_after: Duration = Field(
        Duration("3m"),
        description="A signal reading older than this (a Prometheus sample, an agent scan) is "
        "stale, and a stale required signal makes the verdict UNKNOWN.",
    )
    required_signals: list[SignalName] = Field(
        default_factory=lambda: ["utilization", "processes", "artifacts", "faults", "memory"],
        min_length=1,
        description="The signals a reclaimable verdict needs: if one of them failed or is stale, "
        "the verdict is UNKNOWN and nothing is reclaimed.",
    )
    processes: ProcessesConfig = Field(
        default_factory=ProcessesConfig,
        description="How the verdict reads a process tree that only waits.",
    )
    gpu_memory: GpuMemoryConfig = Field(
        default_factory=GpuMemoryConfig,
        description="Lines for the framebuffer evidence.",
    )
    prometheus: PrometheusConfig = Field(
        default_factory=PrometheusConfig,
        description="Where the controller reads the GPU series.",
    )
    s3: S3Config = Field(
        default_factory=S3Config,
        description="The S3 client for s3:// artifact locations (ghostgpu.io/artifacts).",
    )
    apiserver: ApiserverConfig = Field(
        default_factory=ApiserverConfig,
        description="The client-side budget every apiserver write and exec waits on.",
    )
    metrics: MetricsConfig = Field(
        default_factory=MetricsConfig,
        description="Where the GPU series live in Prometheus: the exporter preset and its query templates.",
    )
    actions: ActionsConfig = Field(
        default_factory=ActionsConfig,
        description="Which actions the controller may take at all.",
    )
    alerts: AlertsConfig = Field(
        default_factory=AlertsConfig,
        description="The idle-GPU alert of the rendered PrometheusRule (docs/reference/metrics.md).",
    )
    service_monitor: ServiceMonitorConfig = Field(
        default_factory=ServiceMonitorConfig,
        description="The ServiceMonitor that has Prometheus scrape the controller's /metrics.",
    )
    network_policy: NetworkPolicyConfig = Field(
        default_factory=NetworkPolicyConfig,
        description="The NetworkPolicies that admit connections to the controller's port and the node "
        "agent's only from the Prometheus namespace.",
    )
    grafana_dashboard: GrafanaDashboardConfig = Field(
        default_factory=GrafanaDashboardConfig,
        description="The Grafana dashboard ConfigMap in controller/.",
    )
    # The risk gate (ghostgpu.autonomy): thresholds from `ghostgpu calibrate`, weights, action table.
    autonomy: AutonomyConfig = Field(
        default_factory=AutonomyConfig,
        description="The risk gate (docs/autonomy.md): thresholds from `ghostgpu calibrate`, "
        "weights, the action table.",
    )
    gitops: GitOpsConfig = Field(
        default_factory=GitOpsConfig,
        description="The GitOps pre-flight before a stop (docs/gitops.md).",
    )
    actuators: list[Actuator] = Field(
        default_factory=list,
        description="how to stop and restore more manager kinds (an in-house operator), added to the "
        "built-in table or replacing a built-in of the same group and kind; a row without `group` is "
        "read as the one known group of its kind (docs/managers.md)",
    )
    dra_flavors: list[DraFlavor] = Field(
        default_factory=list,
        description="written by render from the flavors that name a deviceClass (not by hand in "
        "ghostgpu.yaml): the controller counts their GPUs from ResourceClaims (docs/dra.md)",
    )
    kueue_nudge: bool = Field(
        False,
        description="after a reclaim, annotate the freed Nodes (ghostgpu.io/capacity-freed-at) so that "
        "Kueue's topology-aware scheduling retries pending workloads (Kueue before v0.19.1 retries "
        "them on node changes, not on pod deletions; v0.19.1+ also on pod deletions, within 10 s); "
        "only useful with TAS flavors; renders `patch` on nodes into the controller's ClusterRole",
    )
    # Kueue's books (controller/books/reservation.py, docs/reservation.md): GPUs that live non-Kueue work
    # holds are reserved in the team's ClusterQueue by owner-less placeholder Workloads.
    reservation: Literal["off", "shadow", "enforce"] = Field(
        "off",
        description="off: nothing; shadow: compute and report what would be reserved, write nothing "
        "to Kueue; enforce: keep one placeholder Workload per holder and flavor in the team's "
        "ClusterQueue (renders create/delete on workloads into the namespaced ClusterRole)",
    )
    # Where the processes signal comes from (docs/agent.md). The model's default stays `exec`, so an
    # existing ghostgpu.yaml renders the same bundle it always did: switching to agent adds a
    # hostPID DaemonSet, which a cluster's Pod Security admission may refuse, and that change should
    # be one a person reads in the diff, not one an upgrade makes. A new render (the embedded
    # examples/ghostgpu.yaml, what users copy) says `agent`.
    process_source: Literal["agent", "exec"] = Field(
        "exec",
        description="agent: the node agent DaemonSet reports each GPU container's processes through "
        "the poll's one PromQL query, and the bundle grants no pods/exec; exec: `ps` exec'd into each "
        "idle GPU container (for clusters that cannot run the agent's DaemonSet)",
    )
    decision_log: DecisionLogConfig = Field(
        default_factory=DecisionLogConfig,
        description="the volume of the leader's decision log, `ghostgpu report`'s history "
        "(docs/controller.md)",
    )
    idle_sessions: IdleSessionsConfig = Field(
        default_factory=IdleSessionsConfig,
        description="Idle sessions: reclaim IDLE_HELD workloads (an idle kernel, a forgotten tmux) on "
        "a policy, warned first and only when every signal agrees (docs/idle-sessions.md); off by "
        "default",
    )
    reservation_queue: Name = Field(
        "default",
        description="the LocalQueue, in each opted-in namespace, whose ClusterQueue is the team's: "
        "placeholders are queued there",
    )

    @property
    def prometheus_namespace(self) -> str:
        """The namespace the NetworkPolicies admit (docs/agent.md, "Who can connect")."""
        if self.network_policy.prometheus_namespace:
            return self.network_policy.prometheus_namespace
        found = _IN_CLUSTER_URL.match(self.prometheus.url)
        return found.group(1) if found else DEFAULT_PROMETHEUS_NAMESPACE

    @field_validator("reservation", mode="before")
    @classmethod
    def _reservation_off(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `off` as false: take it for the mode it was meant to be.
        if value is False:
            return "off"
        if value is True:
            raise ValueError("reservation takes off, shadow or enforce (a bare `on`/`true` names no mode)")
        return value

    @model_validator(mode="after")
    def _windows(self) -> ControllerConfig:
        if self.long_window < self.window:
            raise ValueError(f"longWindow ({self.long_window}) must be at least window ({self.window})")
        if len(set(self.required_signals)) != len(self.required_signals):
            raise ValueError("requiredSignals lists a signal twice")
        kinds = [a.group_kind for a in self.actuators]
        if len(set(kinds)) != len(kinds):
            twice = sorted({f"{k}.{g}" if g else k for g, k in kinds if kinds.count((g, k)) > 1})
            raise ValueError(f"actuators lists a group and kind twice: {', '.join(twice)}")
        return self


# --- the whole file --------------------------------------------------------------------------------


class GhostgpuConfig(Model):
    api_version: Literal["ghostgpu.io/v1alpha1"] = Field(
        API_VERSION,
        description="The file's schema version; the only one is ghostgpu.io/v1alpha1.",
    )
    kind: Literal["GhostgpuConfig"] = Field(
        KIND,
        description="Marks the file as a whole ghostgpu.yaml (GhostgpuConfig), as opposed to the "
        "controller section alone that the controller's ConfigMap carries.",
    )
    flavors: list[Flavor] = Field(
        min_length=1,
        description="The GPU models or MIG profiles of the cluster: each becomes one Kueue "
        "ResourceFlavor, and teams give quota per flavor.",
    )
    # GPUs through DRA (docs/dra.md): the DeviceClasses a flavor may name in `deviceClass`. Nothing
    # of them is rendered until a flavor names one.
    device_classes: list[DeviceClass] = Field(
        default_factory=lambda: [DeviceClass(name=n, resource=n) for n in DEFAULT_DEVICE_CLASSES],
        description="The DRA DeviceClasses whose devices are GPUs, and the Kueue resource each is "
        "charged under (docs/dra.md); nothing of them is rendered until a flavor names "
        "one in deviceClass.",
    )
    cohorts: list[Cohort] = Field(
        default_factory=list,
        description="Kueue Cohorts: groups of team ClusterQueues that lend each other unused quota.",
    )
    priority_classes: list[PriorityClass] = Field(
        default_factory=list,
        description="Kueue WorkloadPriorityClasses to render "
        "(kueue/workload-priority-classes.yaml): the priorities preemption compares, "
        "independent of pod priority.",
    )
    teams: list[Team] = Field(
        min_length=1,
        description="The teams sharing the GPUs: each gets one ClusterQueue named after it, with "
        "its quota per flavor.",
    )
    namespaces: list[StaticNamespace] = Field(
        default_factory=list,
        description="Namespaces that get their LocalQueue from the kueue/ bundle (written in Git) "
        "instead of from the Kyverno policy that generates one when a namespace opts "
        "in.",
    )
    kueue: KueueConfig = Field(
        default_factory=KueueConfig,
        description="Kueue's manager Configuration, rendered as the ConfigMap that replaces the one "
        "Kueue ships (kueue/kueue-manager-config.yaml).",
    )
    policies: PoliciesConfig = Field(
        default_factory=PoliciesConfig,
        description="The Kyverno policies of the policies/ bundle.",
    )
    controller: ControllerConfig = Field(
        default_factory=ControllerConfig,
        description="Everything `ghostgpu controller` needs; rendered into "
        "controller/configmap.yaml, which the controller reads.",
    )

    # Convenience lookups used by render and the controller.
    def flavor(self, name: str) -> Flavor:
        return next(f for f in self.flavors if f.name == name)

    @property
    def gpu_resources(self) -> list[str]:
        """Every configured device-plugin GPU resource name, sorted and unique (DRA flavors have none)."""
        return sorted({f.resource for f in self.flavors if f.resource is not None})

    @property
    def dra_classes(self) -> list[DeviceClass]:
        """The device classes some flavor names (in deviceClasses order): the ones rendered."""
        named = {f.device_class for f in self.flavors}
        return [d for d in self.device_classes if d.name in named]

    def device_class_of(self, flavor: Flavor) -> DeviceClass:
        """The deviceClasses entry a DRA flavor names."""
        return next(d for d in self.device_classes if d.name == flavor.device_class)

    @property
    def dra_extended_resources(self) -> list[str]:
        """The extended resources pods get the named classes' devices through, sorted."""
        return sorted({n for d in self.dra_classes for n in d.extended_resource_names})

    def charged_resource(self, flavor: Flavor) -> str:
        """The resource a flavor's quota is given in: its device-plugin resource, or the Kueue
        resource its device class is charged under."""
        if flavor.resource is not None:
            return flavor.resource
        return next(d.resource for d in self.device_classes if d.name == flavor.device_class)

    def dra_flavors(self) -> list[DraFlavor]:
        """The DRA flavors as the controller's config carries them (controller.draFlavors)."""
        return [
            DraFlavor(
                name=f.name,
                device_class=f.device_class,
                resource=self.charged_resource(f),
                node_labels=dict(f.node_labels),
                extended_resource_name=self.device_class_of(f).extended_resource_name,
            )
            for f in self.flavors
            if f.device_class is not None
        ]

    def namespaces_of(self, team: str) -> list[StaticNamespace]:
        return [ns for ns in self.namespaces if ns.team == team]


# --- cross-reference checks ------------------------------------------------------------------------


def semantic_issues(cfg: GhostgpuConfig) -> list[ConfigIssue]:
    """Problems pydantic cannot see: references, duplicates and Kueue's own cross-field rules."""
    return list(_semantic_issues(cfg))


def _duplicates(path: str, names: Sequence[str]) -> Iterator[ConfigIssue]:
    counts = Counter(names)
    for index, name in enumerate(names):
        if counts[name] > 1 and names.index(name) != index:
            yield ConfigIssue(
                f"{path}[{index}].name",
                f"duplicate name {name!r} (first used at {path}[{names.index(name)}])",
            )


def _semantic_issues(cfg: GhostgpuConfig) -> Iterator[ConfigIssue]:
    flavors = [f.name for f in cfg.flavors]
    cohorts = [c.name for c in cfg.cohorts]
    teams = [t.name for t in cfg.teams]
    yield from _duplicates("flavors", flavors)
    yield from _duplicates("cohorts", cohorts)
    yield from _duplicates("teams", teams)
    yield from _duplicates("priorityClasses", [p.name for p in cfg.priority_classes])
    yield from _duplicates("namespaces", [n.name for n in cfg.namespaces])
    if teams and set(teams) & set(cohorts):
        # Kueue keeps ClusterQueues and Cohorts in one tree; a shared name is ambiguous.
        for i, team in enumerate(cfg.teams):
            if team.name in cohorts:
                yield ConfigIssue(
                    f"teams[{i}].name",
                    f"{team.name!r} is also a cohort name; ClusterQueue and Cohort names must differ",
                )

    yield from _device_class_issues(cfg)
    dra_flavors = {f.name for f in cfg.flavors if f.device_class is not None}

    fair_sharing = cfg.kueue.fair_sharing.enabled
    for i, team in enumerate(cfg.teams):
        base = f"teams[{i}]"
        if team.cohort is not None and team.cohort not in cohorts:
            yield ConfigIssue(
                f"{base}.cohort", f"undefined cohort {team.cohort!r}; defined cohorts: {_list(cohorts)}"
            )
        for flavor_name, quota in team.quota.items():
            path = format_path(["teams", i, "quota", flavor_name])
            if flavor_name not in flavors:
                yield ConfigIssue(
                    path, f"undefined flavor {flavor_name!r}; defined flavors: {_list(flavors)}"
                )
                continue
            if not quota.nominal_quota.is_whole:
                yield ConfigIssue(
                    f"{path}.nominalQuota", f"expected a whole number of devices, got {quota.nominal_quota!r}"
                )
            for key, limit in (
                ("borrowingLimit", quota.borrowing_limit),
                ("lendingLimit", quota.lending_limit),
            ):
                if limit is None:
                    continue
                if team.cohort is None:
                    yield ConfigIssue(
                        f"{path}.{key}", f"{key} needs the team to be in a cohort (set {base}.cohort)"
                    )
                elif not limit.is_whole:
                    yield ConfigIssue(f"{path}.{key}", f"expected a whole number of devices, got {limit!r}")
            if quota.lending_limit is not None and quota.lending_limit.value > quota.nominal_quota.value:
                yield ConfigIssue(
                    f"{path}.lendingLimit",
                    f"lendingLimit ({quota.lending_limit}) cannot exceed nominalQuota "
                    f"({quota.nominal_quota})",
                )
        for flavor_name, count in (team.namespace_quota or {}).items():
            path = format_path(["teams", i, "namespaceQuota", flavor_name])
            if flavor_name not in flavors:
                yield ConfigIssue(
                    path, f"undefined flavor {flavor_name!r}; defined flavors: {_list(flavors)}"
                )
            elif flavor_name in dra_flavors:
                yield ConfigIssue(
                    path,
                    f"flavor {flavor_name!r} takes its GPUs through DRA; namespaceQuota renders "
                    "ResourceQuotas of device-plugin resources only",
                )
            elif not count.is_whole:
                yield ConfigIssue(path, f"expected a whole number of devices, got {count!r}")
        preemption = team.preemption
        borrow = preemption.borrow_within_cohort.policy
        if borrow != "Never":
            if preemption.reclaim_within_cohort == "Never":
                yield ConfigIssue(
                    f"{base}.preemption.borrowWithinCohort.policy",
                    "borrowWithinCohort needs reclaimWithinCohort other than Never "
                    "(Kueue rejects this combination)",
                )
            if fair_sharing:
                yield ConfigIssue(
                    f"{base}.preemption.borrowWithinCohort.policy",
                    "borrowWithinCohort works only with classical preemption; set it to Never or "
                    "disable kueue.fairSharing",
                )
            if team.cohort is None:
                yield ConfigIssue(
                    f"{base}.preemption.borrowWithinCohort.policy", "borrowWithinCohort needs a cohort"
                )
    for i, ns in enumerate(cfg.namespaces):
        if ns.team not in teams:
            yield ConfigIssue(
                f"namespaces[{i}].team", f"undefined team {ns.team!r}; defined teams: {_list(teams)}"
            )
    for where, message in cfg.controller.idle_sessions.bound_issues():
        yield ConfigIssue(f"controller.idleSessions.{where}", message)
    for team_name in cfg.controller.idle_sessions.teams:
        if team_name not in teams:
            yield ConfigIssue(
                f"controller.idleSessions.teams.{team_name}",
                f"undefined team {team_name!r}; defined teams: {_list(teams)}",
            )


def _device_class_issues(cfg: GhostgpuConfig) -> Iterator[ConfigIssue]:
    classes = [d.name for d in cfg.device_classes]
    yield from _duplicates("deviceClasses", classes)
    plugin = {f.resource for f in cfg.flavors if f.resource is not None}
    for i, d in enumerate(cfg.device_classes):
        if d.resource in plugin or d.resource.startswith(GPU_RESOURCE_PREFIXES):
            # Kueue would add the DRA devices to the device plugin's count, and the controller
            # takes every name of these domains for a device-plugin GPU.
            yield ConfigIssue(
                f"deviceClasses[{i}].resource",
                f"{d.resource!r} is a device-plugin resource name; give the devices of "
                f"{d.name!r} a resource of their own (such as {d.name!r}), not one of "
                f"{_list(sorted(plugin))} or a name under {', '.join(GPU_RESOURCE_PREFIXES)}",
            )
    seen: dict[str, str] = {}
    for i, d in enumerate(cfg.device_classes):
        ext = d.extended_resource_name
        if ext is None:
            continue
        key = f"deviceClasses[{i}].extendedResourceName"
        if ext in plugin or ext.startswith(GPU_RESOURCE_PREFIXES):
            # The controller would count the pod's request as device-plugin GPUs too.
            yield ConfigIssue(
                key,
                f"{ext!r} is a device-plugin resource name; a device class's extendedResourceName "
                f"must not be one of {_list(sorted(plugin))} or a name under "
                f"{', '.join(GPU_RESOURCE_PREFIXES)}",
            )
        elif ext in seen:
            # Kubernetes then picks one class for it (the newest): the other never serves it.
            yield ConfigIssue(
                key, f"{ext!r} is already the extendedResourceName of device class {seen[ext]!r}"
            )
        else:
            seen[ext] = d.name
    for i, f in enumerate(cfg.flavors):
        if f.device_class is not None and f.device_class not in classes:
            yield ConfigIssue(
                f"flavors[{i}].deviceClass",
                f"undefined device class {f.device_class!r}; defined deviceClasses: {_list(classes)}",
            )
    mappings: dict[str, list[str]] = {}
    for d in cfg.dra_classes:
        mappings.setdefault(d.resource, []).append(d.name)
    if len(mappings) > _KUEUE_MAX_MAPPINGS:
        yield ConfigIssue(
            "deviceClasses",
            f"{len(mappings)} Kueue resources for the device classes flavors name; Kueue takes at "
            f"most {_KUEUE_MAX_MAPPINGS} deviceClassMappings",
        )
    for resource, names in mappings.items():
        if len(names) > _KUEUE_MAX_CLASSES_PER_MAPPING:
            yield ConfigIssue(
                f"deviceClasses[{classes.index(names[-1])}].resource",
                f"{len(names)} device classes charged under {resource!r}; Kueue maps at most "
                f"{_KUEUE_MAX_CLASSES_PER_MAPPING} device classes to one resource",
            )


def _list(names: Sequence[str]) -> str:
    return ", ".join(dict.fromkeys(names)) if names else "(none)"


# --- loading -------------------------------------------------------------------------------------


# One rule reads a ghostgpu.yaml everywhere (render, doctor, calibrate, controller, status, restore,
# agent): a file with any top-level key of the whole file (apiVersion, kind, flavors, teams,
# controller, ...) is the whole file, `kind` or not; a file whose top-level keys are all controller
# keys, or an empty one, is the controller section alone, as the rendered ConfigMap carries it.
# docs/render.md states the rule.
WHOLE_FILE_KEYS = frozenset(f.alias or n for n, f in GhostgpuConfig.model_fields.items())
CONTROLLER_KEYS = frozenset(f.alias or n for n, f in ControllerConfig.model_fields.items())


def is_whole_file(data: dict[Any, Any]) -> bool:
    """Whether a parsed top-level mapping is the whole ghostgpu.yaml (else a controller section).
    A file of neither kind's keys (typos only) is read as the whole file unless its keys are close
    misspellings of controller keys, so the "did you mean" points at the file meant."""
    keys = {k for k in data if isinstance(k, str)}
    if not data:
        return False
    if keys & WHOLE_FILE_KEYS:
        return True
    if keys & CONTROLLER_KEYS:
        return False
    near = [k for k in keys if difflib.get_close_matches(k, CONTROLLER_KEYS, n=1)]
    return not near or any(difflib.get_close_matches(k, WHOLE_FILE_KEYS, n=1) for k in keys)


@dataclass(frozen=True)
class ConfigFile:
    """A ghostgpu.yaml as read by the one rule: `whole` is None for a controller section.
    `controller` is the section as render writes it into the ConfigMap (DRA flavors included)."""

    source: str
    whole: GhostgpuConfig | None
    controller: ControllerConfig


def _parsed_mapping(text: str, source: str) -> ParsedYaml:
    parsed = parse_yaml(text, source)
    if parsed.data is None:
        parsed.data = {}
    if not isinstance(parsed.data, dict):
        raise ConfigError(
            source,
            [
                ConfigIssue(
                    "",
                    "expected a mapping at the top level (the whole file: apiVersion, flavors, teams, "
                    "...; or its controller section: mode, pollInterval, ...)",
                    1,
                )
            ],
        )
    return parsed


def _whole(parsed: ParsedYaml, source: str) -> GhostgpuConfig:
    try:
        cfg = GhostgpuConfig.model_validate(parsed.data)
    except ValidationError as exc:
        issues = issues_from_validation(exc, GhostgpuConfig, parsed)
        raise ConfigError(source, [_misplaced_controller_key(i) for i in issues]) from None
    issues = semantic_issues(cfg)
    if issues:
        located = [ConfigIssue(i.path, i.message, parsed.line_of(_split_path(i.path))) for i in issues]
        raise ConfigError(source, located)
    return cfg


def _misplaced_controller_key(issue: ConfigIssue) -> ConfigIssue:
    """A controller key at the top of a whole file: say where it belongs."""
    if issue.path in CONTROLLER_KEYS and issue.message.startswith("unknown key"):
        message = "unknown key at the top level of the whole file: a controller key goes under `controller:`"
        return ConfigIssue(issue.path, message, issue.line)
    return issue


def _controller(parsed: ParsedYaml, source: str) -> ControllerConfig:
    try:
        return ControllerConfig.model_validate(parsed.data)
    except ValidationError as exc:
        raise ConfigError(source, issues_from_validation(exc, ControllerConfig, parsed)) from None


def config_file_text(text: str, source: str = "ghostgpu.yaml") -> ConfigFile:
    """Read config text by the one rule; raise ConfigError listing every problem."""
    parsed = _parsed_mapping(text, source)
    if not is_whole_file(parsed.data):
        return ConfigFile(source, None, _controller(parsed, source))
    whole = _whole(parsed, source)
    # As render writes it into the ConfigMap: the DRA flavors ride in the controller section.
    controller = whole.controller.model_copy(update={"dra_flavors": whole.dra_flavors()})
    return ConfigFile(source, whole, controller)


def _read(path: str | Path) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(str(path), [ConfigIssue("", f"cannot read file: {why}")]) from None


def read_config_file(path: str | Path) -> ConfigFile:
    """A ghostgpu.yaml or its controller section, read by the one rule (raises ConfigError)."""
    return config_file_text(_read(path), str(path))


def load_config_text(text: str, source: str = "ghostgpu.yaml") -> GhostgpuConfig:
    """The whole file; a controller section is an error that says what was given."""
    read = config_file_text(text, source)
    if read.whole is None:
        keys = sorted(k for k in _parsed_mapping(text, source).data if isinstance(k, str))
        shown = ", ".join(keys[:4]) + (", ..." if len(keys) > 4 else "")
        raise ConfigError(
            source,
            [
                ConfigIssue(
                    "",
                    f"this is a controller section (top-level keys {shown or 'none'}), not the whole "
                    "ghostgpu.yaml: flavors and teams are missing",
                    1,
                )
            ],
            fix="give the whole ghostgpu.yaml (apiVersion, kind, flavors, teams, controller), with "
            "these keys under `controller:`",
        )
    return read.whole


def load_config(path: str | Path) -> GhostgpuConfig:
    """The whole file at `path` (raises ConfigError)."""
    return load_config_text(_read(path), str(path))


def load_default_config() -> GhostgpuConfig:
    """The embedded examples/ghostgpu.yaml."""
    from ghostgpu.resources import example_config_path

    return load_config(example_config_path())


def load_controller_config(path: str | Path) -> ControllerConfig:
    """The controller section at `path`: the ConfigMap's ghostgpu-controller.yaml, or the
    `controller:` of a whole file (read by the one rule)."""
    return read_config_file(path).controller


def _split_path(path: str) -> list[str | int]:
    """Inverse of format_path, enough to look up line numbers."""
    parts: list[str | int] = []
    for token in re.findall(r'\["([^"]+)"\]|\[(\d+)\]|([^.\[\]]+)', path):
        quoted, index, plain = token
        parts.append(int(index) if index else (quoted or plain))
    return parts
