"""The rows about what runs in the cluster: the apiserver, Kueue, Kyverno, the opted-in
namespaces, the controller and its node agent. Each reads; none writes. What to expect comes
from the bundles rendered from the same ghostgpu.yaml (never a second list kept by hand)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import yaml

from ghostgpu.config import GhostgpuConfig
from ghostgpu.controller.books.multikueue import (
    ORIGIN_LABEL,
    needs_admission_checks,
    skipped_queues,
    worker_workloads,
)
from ghostgpu.doctor.reads import Reads, lease_age, lease_is_live
from ghostgpu.doctor.report import Row, fail, ok, skip, warn
from ghostgpu.render import AGENT_NAME, AGENT_NAMESPACE

# Kueue minor releases ghostgpu is tested against (hack/versions.env KUEUE_VERSION and
# KUEUE_EXTRA_VERSIONS, and the releases between them: docs/kueue-versions.md).
SUPPORTED_KUEUE_MINORS = ((0, 17), (0, 18), (0, 19))
KUEUE_API = "kueue.x-k8s.io/v1beta2"
KYVERNO_POLICY_API = "policies.kyverno.io/v1"
KYVERNO_MIN = (1, 17)  # the first release that serves policies.kyverno.io/v1
KYVERNO_NAMESPACE = "kyverno"
# Both Kyverno controllers ghostgpu needs (admission: the mutations; background: mutate-existing
# and generate) run their loops only while they hold these leases.
KYVERNO_LEASES = ("kyverno", "kyverno-background-controller")
KYVERNO_CRD_WATCHER = "--crdWatcher=true"
KYVERNO_WATCHING = ("admission-controller", "background-controller")
KUEUE_CONFIG_KEY = "controller_manager_config.yaml"
RECLAIM_LABEL, TEAM_LABEL = "ghostgpu.io/reclaim", "ghostgpu.io/team"
_TAG = re.compile(r":v?(\d+)\.(\d+)\.(\d+)")


def _version(text: str) -> tuple[int, int, int] | None:
    m = _TAG.search(text)
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def _named(objects: Iterable[dict[str, Any]], api: str, kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("apiVersion") == api and o.get("kind") == kind]


def _name(o: dict[str, Any]) -> str:
    return str(o["metadata"]["name"])


def _short(names: Iterable[str], limit: int = 6) -> str:
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


async def deployment_images(reads: Reads, word: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(namespace/name, image, deployment) of every Deployment container whose image names `word`."""
    found = []
    for d in await reads.items("apps/v1", "deployments"):
        for c in ((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers") or []:
            image = str(c.get("image") or "")
            if word in image.split("@")[0].rsplit(":", 1)[0]:  # the repository, not the tag
                meta = d["metadata"]
                found.append((f"{meta['namespace']}/{meta['name']}", image, d))
    return found


async def check_apiserver(reads: Reads, server: str) -> Row:
    v = await reads.version()
    return ok("apiserver", f"Kubernetes {v.get('gitVersion', '?')} at {server}")


# ----- Kueue -----


async def check_kueue_installed(reads: Reads) -> Row:
    crd = await reads.get("apiextensions.k8s.io/v1", "customresourcedefinitions/clusterqueues.kueue.x-k8s.io")
    served = [v["name"] for v in ((crd or {}).get("spec") or {}).get("versions") or [] if v.get("served")]
    fix = "install Kueue (a release between v0.17 and v0.19, docs/kueue-versions.md), then sync kueue/"
    if crd is None:
        return fail("kueue: installed", "no ClusterQueue CRD (clusterqueues.kueue.x-k8s.io)", fix)
    if "v1beta2" not in served:
        return fail("kueue: installed", f"ClusterQueue CRD serves {', '.join(served)}, not v1beta2", fix)
    return ok("kueue: installed", f"ClusterQueue CRD serves {', '.join(served)}")


async def check_kueue_version(reads: Reads, prometheus_version: str | None) -> Row:
    """From the manager's image tag, else Kueue's own kueue_build_info series in Prometheus."""
    seen = [(where, image) for where, image, _ in await deployment_images(reads, "kueue")]
    candidates = [(f"image {image} ({where})", _version(image)) for where, image in seen]
    if prometheus_version:
        candidates.append(
            (f"kueue_build_info git_version {prometheus_version}", _version(":" + prometheus_version))
        )
    supported = ", ".join(f"v{a}.{b}" for a, b in SUPPORTED_KUEUE_MINORS)
    for found, version in candidates:
        if version is None:
            continue
        if version[:2] in SUPPORTED_KUEUE_MINORS:
            return ok("kueue: version", f"v{'.'.join(map(str, version))} from {found}")
        return fail(
            "kueue: version",
            f"v{'.'.join(map(str, version))} from {found}; supported: {supported}",
            f"upgrade or downgrade Kueue to one of {supported} (docs/kueue-versions.md)",
        )
    return warn(
        "kueue: version",
        "not visible: no Deployment runs a kueue image and Prometheus has no kueue_build_info series",
        f"make sure Kueue is one of {supported} (docs/kueue-versions.md); scrape Kueue's metrics "
        "to let doctor see it",
    )


def kueue_configuration(objects: Iterable[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the rendered ConfigMap, the Kueue Configuration inside it)."""
    [cm] = [o for o in _named(objects, "v1", "ConfigMap") if _name(o) == "kueue-manager-config"]
    return cm, yaml.safe_load(cm["data"][KUEUE_CONFIG_KEY]) or {}


KUEUE_WEBHOOKS = "kueue-mutating-webhook-configuration"


async def webhook_answers(reads: Reads, hook: dict[str, Any]) -> tuple[bool, str]:
    """Does the server behind one admission webhook answer? A URL is asked directly; a Service
    through the apiserver's service proxy (a GET), where 503 means no ready endpoint behind it."""
    import httpx

    cfg = hook.get("clientConfig") or {}
    if cfg.get("url"):
        url = cfg["url"]
        try:
            async with httpx.AsyncClient(verify=False, timeout=5) as client:  # reachability, not trust
                await client.get(url)
        except httpx.HTTPError as exc:
            return False, f"{url}: {exc or type(exc).__name__}"
        return True, url
    svc = cfg.get("service") or {}
    where = f"Service {svc.get('namespace')}/{svc.get('name')}:{svc.get('port', 443)}"
    try:
        await reads.get(
            "v1", f"services/https:{svc.get('name')}:{svc.get('port', 443)}/proxy/", svc.get("namespace")
        )
    except Exception as exc:  # the proxy's 502/503: nothing answers behind the Service
        status = getattr(getattr(exc, "response", None), "status_code", 0)
        if status in (502, 503):
            return False, f"{where}: no ready endpoint ({status})"
    return True, where


async def check_kueue_running(reads: Reads) -> Row:
    """Kueue's mutating webhook answers (failurePolicy Fail: while it does not, every Pod, Job or
    Deployment create in Kueue-managed namespaces is refused)."""
    cfg = await reads.get(
        "admissionregistration.k8s.io/v1", f"mutatingwebhookconfigurations/{KUEUE_WEBHOOKS}"
    )
    fix = "start Kueue's manager (kueue-controller-manager) and read its log: without it nothing is admitted"
    hooks = (cfg or {}).get("webhooks") or []
    if not hooks:
        return fail("kueue: manager running", f"no MutatingWebhookConfiguration {KUEUE_WEBHOOKS}", fix)
    answers, where = await webhook_answers(reads, hooks[0])
    if not answers:
        return fail("kueue: manager running", f"its webhook does not answer: {where}", fix)
    return ok("kueue: manager running", f"its webhook answers at {where}")


async def check_kueue_queues(reads: Reads, objects: list[dict[str, Any]]) -> Row:
    flavors = [_name(o) for o in _named(objects, KUEUE_API, "ResourceFlavor")]
    queues = [_name(o) for o in _named(objects, KUEUE_API, "ClusterQueue")]
    missing = [
        f"ResourceFlavor {n}" for n in flavors if await reads.get(KUEUE_API, f"resourceflavors/{n}") is None
    ]
    inactive = []
    for n in queues:
        cq = await reads.get(KUEUE_API, f"clusterqueues/{n}")
        if cq is None:
            missing.append(f"ClusterQueue {n}")
            continue
        conds = {c.get("type"): c for c in (cq.get("status") or {}).get("conditions") or []}
        active = conds.get("Active") or {}
        if active.get("status") != "True":
            inactive.append(
                f"{n} ({active.get('reason') or 'no Active condition'}: {active.get('message', '')})"
            )
    if missing:
        return fail(
            "kueue: flavors and queues", f"missing: {_short(missing)}", "sync the rendered kueue/ bundle"
        )
    if inactive:
        return fail(
            "kueue: flavors and queues",
            f"not Active: {_short(inactive)}",
            "read each ClusterQueue's Active condition; its flavors and cohort must exist",
        )
    return ok(
        "kueue: flavors and queues", f"{len(flavors)} ResourceFlavors, {len(queues)} ClusterQueues Active"
    )


async def check_kueue_configuration(reads: Reads, objects: list[dict[str, Any]]) -> Row:
    cm, rendered = kueue_configuration(objects)
    ns, name = cm["metadata"]["namespace"], _name(cm)
    live_cm = await reads.get("v1", f"configmaps/{name}", ns)
    fix = f"sync the rendered kueue/ bundle (ConfigMap {ns}/{name}), then restart Kueue's manager"
    if live_cm is None:
        return fail("kueue: configuration", f"ConfigMap {ns}/{name} does not exist", fix)
    live = yaml.safe_load(((live_cm.get("data") or {}).get(KUEUE_CONFIG_KEY)) or "") or {}
    found, wrong = [], []
    want = rendered.get("waitForPodsReady")
    if live.get("waitForPodsReady") != want:
        wrong.append(f"waitForPodsReady is {live.get('waitForPodsReady')!r}, rendered {want!r}")
    else:
        found.append(f"waitForPodsReady {want}")
    mappings = (rendered.get("resources") or {}).get("deviceClassMappings")
    if mappings is None:
        found.append("DRA not configured: deviceClassMappings not checked")
    elif (live.get("resources") or {}).get("deviceClassMappings") != mappings:
        wrong.append("resources.deviceClassMappings differs from the rendered one")
    else:
        found.append(f"deviceClassMappings: {len(mappings)}")
    if wrong:
        return fail("kueue: configuration", "; ".join(wrong), fix)
    return ok("kueue: configuration", f"ConfigMap {ns}/{name}: " + "; ".join(found))


def multikueue_row(
    cluster_queues: list[dict[str, Any]],
    admission_checks: list[dict[str, Any]],
    sent: dict[str, int],
    local_queues: list[dict[str, Any]],
    opted_in: list[str],
    cfg: GhostgpuConfig,
) -> Row:
    """What this cluster is to MultiKueue (docs/reservation.md, "MultiKueue"). A manager: the
    ClusterQueues with a MultiKueue admission check, where the reservation writes no placeholder;
    warn when the reservation is on and an opted-in namespace's reservation queue leads to one
    (what is held there is reserved nowhere). A worker: the Workloads a manager sent here."""
    check = "kueue: MultiKueue"
    skipped = skipped_queues(cluster_queues, admission_checks)
    if not skipped and not sent:
        return skip(check, "no MultiKueue AdmissionCheck on a ClusterQueue and no Workload sent by a manager")
    found = []
    if skipped:
        found.append(
            f"manager: ClusterQueues {_short(skipped)} send their Workloads to worker clusters; the "
            "reservation writes no placeholder there (Kueue would reject it)"
        )
    if sent:
        origins = ", ".join(f"{o} ({n})" for o, n in sent.items())
        found.append(
            f"worker: {sum(sent.values())} Workloads sent by a manager of origin {origins}; the "
            "reservation counts in this cluster's ClusterQueues as usual"
        )
    queue = cfg.controller.reservation_queue
    stranded = sorted(
        f"{lq['metadata'].get('namespace')} ({lq['spec'].get('clusterQueue')})"
        for lq in local_queues
        if lq["metadata"].get("name") == queue
        and lq["metadata"].get("namespace") in opted_in
        and (lq.get("spec") or {}).get("clusterQueue") in skipped
    )
    if cfg.controller.reservation != "off" and stranded:
        return warn(
            check,
            "; ".join(found) + f"; GPUs held outside Kueue in {_short(stranded)} are reserved nowhere",
            "run the controller with controller.reservation in each worker cluster, where the GPUs "
            "are; on the manager, keep GPU work outside Kueue out of namespaces whose queue is MultiKueue's",
        )
    return ok(check, "; ".join(found))


async def check_multikueue(reads: Reads, cfg: GhostgpuConfig, opted_in: list[str]) -> Row:
    cqs = await reads.items(KUEUE_API, "clusterqueues")
    acs = await reads.items(KUEUE_API, "admissionchecks") if needs_admission_checks(cqs) else []
    sent = worker_workloads(await reads.items(KUEUE_API, "workloads", params={"labelSelector": ORIGIN_LABEL}))
    lqs = await reads.items(KUEUE_API, "localqueues") if cfg.controller.reservation != "off" else []
    return multikueue_row(cqs, acs, sent, lqs, opted_in, cfg)


# ----- Kyverno -----


def rendered_policies(objects: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o.get("apiVersion") == KYVERNO_POLICY_API]


async def check_kyverno_kinds(reads: Reads, objects: list[dict[str, Any]]) -> Row:
    kinds = sorted({o["kind"] for o in rendered_policies(objects)})
    fix = "install Kyverno ≥ 1.17 (ghostgpu is tested on v1.19.1): the policies are its CEL kinds"
    group = await reads.get(KYVERNO_POLICY_API, "")
    served = {r.get("kind") for r in (group or {}).get("resources") or [] if "/" not in r.get("name", "")}
    images = [(w, i) for w, i, _ in await deployment_images(reads, "kyverno") if _version(i)]
    old = [f"{i} ({w})" for w, i in images if (_version(i) or (0, 0, 0))[:2] < KYVERNO_MIN]
    if group is None:
        return fail("kyverno: CEL policy kinds", f"the apiserver serves no {KYVERNO_POLICY_API}", fix)
    if missing := [k for k in kinds if k not in served]:
        return fail("kyverno: CEL policy kinds", f"{KYVERNO_POLICY_API} lacks {', '.join(missing)}", fix)
    if old:
        return fail("kyverno: CEL policy kinds", f"Kyverno older than 1.17: {_short(old)}", fix)
    where = f"; image {images[0][1]}" if images else ""
    return ok("kyverno: CEL policy kinds", f"{KYVERNO_POLICY_API} serves {', '.join(kinds)}{where}")


async def check_kyverno_running(reads: Reads) -> Row:
    dead = []
    for name in KYVERNO_LEASES:
        lease = await reads.get("coordination.k8s.io/v1", f"leases/{name}", KYVERNO_NAMESPACE)
        if not lease_is_live(lease):
            dead.append(f"Lease {KYVERNO_NAMESPACE}/{name}")
    if dead:
        return fail(
            "kyverno: controllers running",
            f"not held: {', '.join(dead)}",
            "start Kyverno's admission and background controllers (the policies need both)",
        )
    return ok(
        "kyverno: controllers running",
        f"admission and background controllers hold {', '.join(KYVERNO_LEASES)}",
    )


async def check_kyverno_policies(reads: Reads, objects: list[dict[str, Any]]) -> Row:
    missing, not_ready, ready = [], [], []
    for p in rendered_policies(objects):
        plural = p["kind"].lower() + "s" if not p["kind"].endswith("y") else p["kind"][:-1].lower() + "ies"
        live = await reads.get(KYVERNO_POLICY_API, f"{plural}/{_name(p)}")
        if live is None:
            missing.append(f"{p['kind']} {_name(p)}")
            continue
        status = (live.get("status") or {}).get("conditionStatus") or {}
        if status.get("ready") is True:
            ready.append(_name(p))
        else:
            failing = [
                c.get("message") or c.get("type")
                for c in status.get("conditions") or []
                if c.get("status") != "True"
            ]
            not_ready.append(f"{_name(p)} ({'; '.join(failing) or 'no status yet'})")
    if missing:
        return fail("kyverno: policies", f"missing: {_short(missing)}", "sync the rendered policies/ bundle")
    if not_ready:
        return fail(
            "kyverno: policies",
            f"not ready: {_short(not_ready)}",
            "read the policy's status conditions; RBACPermissionsGranted needs policies/kyverno-rbac.yaml",
        )
    return ok("kyverno: policies", f"{len(ready)} ready: {_short(ready)}")


async def check_kyverno_crd_watcher(reads: Reads) -> Row:
    # The Helm chart's kyverno-admission-controller and kyverno-background-controller (the
    # cleanup and reports controllers match no policy kinds).
    deployments = [
        (w, d) for w, _, d in await deployment_images(reads, "kyverno") if w.endswith(KYVERNO_WATCHING)
    ]
    fix = (
        "run Kyverno's admission and background controllers with --crdWatcher=true, so manager kinds "
        "installed after Kyverno (RayCluster, Notebook, ...) are matched without a restart (docs/managers.md)"
    )
    if not deployments:
        return warn(
            "kyverno: CRD watcher", "Kyverno's Deployments are not visible: cannot read their flags", fix
        )
    without = []
    for where, d in deployments:
        args = [a for c in d["spec"]["template"]["spec"].get("containers") or [] for a in c.get("args") or []]
        if KYVERNO_CRD_WATCHER not in args:
            without.append(where)
    if without:
        return fail("kyverno: CRD watcher", f"without {KYVERNO_CRD_WATCHER}: {_short(without)}", fix)
    return ok("kyverno: CRD watcher", f"{KYVERNO_CRD_WATCHER} on {_short(w for w, _ in deployments)}")


# ----- namespaces, controller, agent -----


async def opted_in_namespaces(reads: Reads) -> list[dict[str, Any]]:
    """Namespaces labelled for ghostgpu, but not those being deleted (nothing runs there anymore)."""
    return [
        n
        for n in await reads.items("v1", "namespaces")
        if ((n["metadata"].get("labels") or {}).get(RECLAIM_LABEL)) == "enabled"
        and (n.get("status") or {}).get("phase") != "Terminating"
    ]


def namespaces_with_known_team(namespaces: Iterable[dict[str, Any]], cfg: GhostgpuConfig) -> list[str]:
    teams = {t.name for t in cfg.teams}
    return [_name(n) for n in namespaces if (n["metadata"].get("labels") or {}).get(TEAM_LABEL) in teams]


def check_namespaces(namespaces: list[dict[str, Any]], cfg: GhostgpuConfig) -> Row:
    teams = sorted(t.name for t in cfg.teams)
    if not namespaces:
        return warn(
            "namespaces: opted in",
            f"no namespace carries {RECLAIM_LABEL}=enabled: ghostgpu acts nowhere",
            f"label the namespaces to watch {RECLAIM_LABEL}=enabled and "
            f"{TEAM_LABEL}=<one of {', '.join(teams)}>",
        )
    good = namespaces_with_known_team(namespaces, cfg)
    bad = [
        f"{_name(n)} ({TEAM_LABEL}={(n['metadata'].get('labels') or {}).get(TEAM_LABEL) or '(none)'})"
        for n in namespaces
        if _name(n) not in good
    ]
    if bad:
        return fail(
            "namespaces: opted in",
            f"no team of the config: {_short(bad)}",
            f"set {TEAM_LABEL} to one of {', '.join(teams)} (or add the team to ghostgpu.yaml and render)",
        )
    return ok("namespaces: opted in", f"{len(good)} with a known team: {_short(good)}")


async def check_controller(reads: Reads, cfg: GhostgpuConfig, objects: list[dict[str, Any]]) -> Row:
    ctrl = cfg.controller
    [dep] = [o for o in _named(objects, "apps/v1", "Deployment")]
    ns, name = dep["metadata"]["namespace"], _name(dep)
    live = await reads.get("apps/v1", f"deployments/{name}", ns)
    fix = "sync the rendered controller/ bundle; read the pods' events and logs (kubectl -n NS describe pods)"
    if live is None:
        return fail("controller: running, leader", f"Deployment {ns}/{name} does not exist", fix)
    want = int((live.get("spec") or {}).get("replicas") or 0)
    ready = int((live.get("status") or {}).get("readyReplicas") or 0)
    if want == 0 or ready < want:
        return fail("controller: running, leader", f"Deployment {ns}/{name}: {ready}/{want} ready", fix)
    lease = await reads.get("coordination.k8s.io/v1", f"leases/{ctrl.lease_name}", ctrl.namespace)
    holder, age = lease_age(lease)
    if not lease_is_live(lease):
        return fail(
            "controller: running, leader",
            f"{ready}/{want} ready, but no replica holds Lease {ctrl.namespace}/{ctrl.lease_name}",
            "read the controller's log for leader election errors (it needs get/update on its Lease)",
        )
    return ok(
        "controller: running, leader", f"{ready}/{want} ready; leader {holder} (renewed {age:.0f} s ago)"
    )


async def check_agent(reads: Reads, cfg: GhostgpuConfig) -> Row:
    """The node agent (controller.processSource: agent): its DaemonSet is scheduled on some node and
    every pod it wants is ready. A node without a ready agent has idle workloads stay UNKNOWN."""
    name = "agent: on every GPU node"
    if cfg.controller.process_source != "agent":
        return skip(name, "controller.processSource is exec: processes come from exec, no agent runs")
    fix = (
        f"sync the rendered controller/ bundle (agent.yaml); read the agent pods' events "
        f"(kubectl -n {AGENT_NAMESPACE} describe pods)"
    )
    live = await reads.get("apps/v1", f"daemonsets/{AGENT_NAME}", AGENT_NAMESPACE)
    if live is None:
        return fail(name, f"DaemonSet {AGENT_NAMESPACE}/{AGENT_NAME} does not exist", fix)
    status = live.get("status") or {}
    want = int(status.get("desiredNumberScheduled") or 0)
    ready = int(status.get("numberReady") or 0)
    if want == 0:
        return fail(
            name,
            f"DaemonSet {AGENT_NAMESPACE}/{AGENT_NAME} is scheduled on no node",
            "label the GPU nodes with a flavor's nodeLabels, or give the flavors the tolerations of "
            "the GPU nodes' taints, and render again",
        )
    if ready < want:
        return fail(name, f"{ready}/{want} agent pods ready: idle workloads on the others stay UNKNOWN", fix)
    return ok(name, f"{ready}/{want} agent pods ready")
