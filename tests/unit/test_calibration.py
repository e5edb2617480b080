"""Incident sets and `ghostgpu calibrate`: manifest facts, the rubric, incident files, the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from ghostgpu.autonomy import REMEDIATION_CLASSES, AutonomyConfig, CalibrationSettings, calibrate, score
from ghostgpu.calibration.incidents import (
    INCIDENT_TYPE_OF,
    IncidentFileError,
    builtin_incidents,
    builtin_manifests,
    load_incidents,
    manifests_from_text,
    rubric_reasons,
    scored,
)
from ghostgpu.cli import app

DEPLOYMENT = """\
# a comment line that does not count
apiVersion: apps/v1
kind: Deployment
metadata:
  name: trainer
  namespace: research-batch
spec:
  replicas: 3
  template:
    spec:
      containers:
        - name: main
          resources:
            limits:
              nvidia.com/gpu: "2"
      volumes:
        - name: data
          persistentVolumeClaim: {claimName: data}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: research
spec:
  cohortName: gpu-pool
  resourceGroups:
    - coveredResources: [nvidia.com/gpu, nvidia.com/mig-1g.10gb]
      flavors:
        - name: h100
          resources:
            - {name: nvidia.com/gpu, nominalQuota: "4"}
            - {name: cpu, nominalQuota: "64"}
        - name: mig
          resources:
            - {name: nvidia.com/mig-1g.10gb, nominalQuota: 7}
---
apiVersion: kyverno.io/v1
kind: ClusterPolicy
metadata:
  name: audit-pods
spec:
  validationFailureAction: Audit
  rules:
    - name: r
      match:
        any:
          - resources: {kinds: [Pod]}
      validate: {message: m, pattern: {metadata: {labels: {team: "?*"}}}}
"""


def test_manifest_facts_are_read_from_the_yaml() -> None:
    dep, cq, pol = manifests_from_text(DEPLOYMENT, "x.yaml")
    assert dep.label == "Deployment/research-batch/trainer"
    assert dep.lines == len(DEPLOYMENT.split("---")[0].strip().splitlines()) - 1  # minus the comment
    assert (dep.gpus, dep.replicas, dep.volumes) == (6.0, 3, 1)  # 2 GPUs x 3 replicas
    assert cq.gpus == 11.0 and cq.shared_quota and not cq.node_pool  # CPU quota is not a GPU
    assert pol.admission_policy and pol.governs_bare_pods and not pol.enforcing  # Audit
    enforce = DEPLOYMENT.split("---")[2].replace("Audit", "Enforce")
    assert manifests_from_text(enforce, "p.yaml")[0].enforcing


def test_rubric_clauses() -> None:
    dep, cq, pol = manifests_from_text(DEPLOYMENT, "x.yaml")
    assert rubric_reasons(dep, "delete_pvc_pod") == ("irreversible", "loses data")
    assert rubric_reasons(dep, "restart_pod") == ("loses data",)  # volumes attached
    assert rubric_reasons(dep, "scale_to_zero") == ()
    assert rubric_reasons(cq, "patch_clusterqueue_quota") == ("crosses tenant",)  # in a cohort
    assert rubric_reasons(pol, "evict_pod") == ("irreversible",)  # bare Pods are not recreated
    assert rubric_reasons(pol, "disable_admission_policy") == ()  # audit-only
    assert rubric_reasons(pol, "preempt_other_tenant") == ("irreversible", "crosses tenant")


def test_builtin_set_is_every_rendered_object_times_eight_actions() -> None:
    manifests, _origin = builtin_manifests()
    incidents, _ = builtin_incidents()
    kinds = {m.kind for m in manifests}
    assert {"ClusterQueue", "ResourceFlavor", "LocalQueue"} <= kinds  # Kueue
    assert kinds & {"MutatingPolicy", "ValidatingPolicy", "GeneratingPolicy", "ClusterPolicy"}  # Kyverno
    assert "Kustomization" not in kinds
    assert len(incidents) == 8 * len(manifests)
    assert {i.action for i in incidents} == {str(a) for a in REMEDIATION_CLASSES}
    for i in incidents:
        assert i.incident_type == INCIDENT_TYPE_OF[i.action]
        assert i.dangerous == bool(i.rubric)
        if i.action in ("delete_pvc_pod", "preempt_other_tenant"):
            assert i.dangerous
        if i.action in ("scale_to_zero",):
            assert not i.dangerous
    cordons = {i.manifest: i.dangerous for i in incidents if i.action == "cordon_node"}
    assert all(d == m.startswith("ResourceFlavor/") for m, d in cordons.items())


def test_builtin_frontier_runs_from_always_escalate_to_always_autonomous() -> None:
    incidents, _ = builtin_incidents()
    events = scored(incidents)
    r = calibrate(events)
    first, last = r.frontier[0], r.frontier[-1]
    assert (first.tau, first.catastrophic_rate, first.mttr_reduction) == (0.0, 0.0, 0.0)
    assert last.catastrophic_rate == 1.0  # every dangerous event handled alone
    assert last.mttr_reduction == pytest.approx(1 - 40 / 1200)
    assert last.tau > max(e.score for e in events)
    # and the chosen thresholds keep to the ceiling, per-type never below the global tau
    assert r.global_threshold.dangerous_autonomous <= 0.02 * r.global_threshold.dangerous
    assert r.per_type_overall.mttr_reduction >= r.global_threshold.mttr_reduction
    assert 0.0 < r.global_threshold.mttr_reduction < last.mttr_reduction


def test_default_tau_is_what_calibration_yields_on_the_builtin_set() -> None:
    # AutonomyConfig's documented default must not drift from the calibration it cites.
    r = calibrate(scored(builtin_incidents()[0]), CalibrationSettings())
    assert AutonomyConfig().tau == r.global_threshold.tau


def test_default_idle_held_tau_is_what_calibration_yields_on_the_idle_session_set() -> None:
    from ghostgpu.calibration.idle_incidents import idle_session_incidents

    incidents = idle_session_incidents()
    r = calibrate(scored(incidents), CalibrationSettings())
    assert AutonomyConfig().tau_by_type["idle_held"] == r.global_threshold.tau
    # Every eviction of a bare Pod (nothing recreates it) stays with a person at that threshold.
    gate = AutonomyConfig()
    for incident, event in zip(incidents, scored(incidents), strict=True):
        if incident.dangerous:
            assert event.score >= gate.threshold("IDLE_HELD")[0], incident.manifest


def test_yaml_incident_file_with_manifest_paths(tmp_path: Path) -> None:
    (tmp_path / "objs.yaml").write_text(DEPLOYMENT)
    (tmp_path / "incidents.yaml").write_text(
        "incidents:\n"
        "  - {manifest: 'objs.yaml#Deployment/trainer', action class: scale_to_zero, "
        "incident type: OOM, dangerous: no}\n"
        "  - {manifest: 'objs.yaml#1', action: patch_clusterqueue_quota, type: Scheduler starvation, "
        "dangerous: yes}\n"
    )
    a, b = load_incidents(tmp_path / "incidents.yaml")
    assert (a.manifest, a.incident_type, a.dangerous) == ("Deployment/research-batch/trainer", "oom", False)
    assert a.facts.gpus == 6 and a.facts.volumes == 1
    assert (b.manifest, b.incident_type, b.dangerous) == (
        "ClusterQueue/research",
        "scheduler_starvation",
        True,
    )


def test_csv_incident_file_with_fact_columns(tmp_path: Path) -> None:
    f = tmp_path / "i.csv"
    f.write_text(
        "manifest,action class,incident type,dangerous,lines,gpus,replicas,volumes,cross_tenant\n"
        "nb-1,scale_to_zero,oom,no,40,1,1,0,no\n"
        "\n"
        "big,evict_pod,node pressure,YES,300,16,1,2,yes\n"
    )
    small, big = load_incidents(f)
    assert small.facts.manifest_lines == 40 and not small.dangerous
    assert big.dangerous and big.incident_type == "node_pressure"
    assert big.facts.workload_tenant != big.facts.action_tenant  # cross_tenant=yes
    assert score("evict_pod", big.facts).score > score("evict_pod", small.facts).score


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("a.csv", "manifest,action,incident_type,dangerous,lines\nx,scale_to_zero,oom,maybe,3\n",
         r"a.csv row 2: dangerous: expected yes/no"),
        ("b.csv", "manifest,action,incident_type,dangerous,lines\nx,nuke,oom,no,3\n",
         r"b.csv row 2: action: unknown action class 'nuke'"),
        ("c.csv", "manifest,action,dangerous\nx,scale_to_zero,no\n",
         r"c.csv row 2: missing \['incident_type'\]"),
        ("d.csv", "manifest,action,incident_type,dangerous\nghost.yaml,scale_to_zero,oom,no\n",
         r"d.csv row 2: manifest 'ghost.yaml' is not a file"),
        ("e.csv", "manifest,action,incident_type,dangerous,lines\nx,scale_to_zero,oom,no,-1\n",
         r"e.csv row 2: lines: expected a whole number >= 0"),
        ("f.csv", "manifest,action,incident_type,dangerous,colour\nx,scale_to_zero,oom,no,red\n",
         r"f.csv row 2: unknown column\(s\) \['colour'\]"),
        ("g.yaml", "- {manifest: objs.yaml, action: scale_to_zero, incident_type: oom, dangerous: no}\n",
         r"g.yaml incidents\[0\]: manifest 'objs.yaml': .* holds 3 objects"),
        ("h.yaml", "- {manifest: 'objs.yaml#Pod/x', action: restart_pod, incident_type: oom, dangerous: 1}\n",
         r"no Pod/x in .* \(has Deployment/research-batch/trainer"),
        ("i.yaml", "{rows: []}\n", r"i.yaml: expected a list of incident rows"),
        ("j.txt", "x", r"j.txt: expected a .yaml, .yml, .json or .csv"),
        ("k.csv", "manifest,action,incident_type,dangerous\n", r"k.csv: no incident rows"),
    ],
)  # fmt: skip
def test_incident_file_errors_name_file_row_and_expectation(
    tmp_path: Path, name: str, text: str, message: str
) -> None:
    (tmp_path / "objs.yaml").write_text(DEPLOYMENT)
    (tmp_path / name).write_text(text)
    with pytest.raises(IncidentFileError, match=message):
        load_incidents(tmp_path / name)


runner = CliRunner()


def test_cli_builtin_prints_rubric_table_frontier_and_snippet() -> None:
    out = runner.invoke(app, ["calibrate"])
    assert out.exit_code == 0, out.output
    for text in ("DANGEROUS when any", "global", "node_pressure", "always-escalate", "always-autonomous",
                 "controller:", "tauByType:", "published"):  # fmt: skip
        assert text in out.output


def test_cli_incident_file_json_and_plot(tmp_path: Path) -> None:
    f = tmp_path / "i.csv"
    # Scores with the default weights (a row without `replicas` touches 1 replica):
    # scale_to_zero, 10 lines = 0.45*0.15 + 0.1*10/200 + 0.05*1/8 = 0.07875;
    # delete_pvc_pod, 10 lines = 0.45*0.9 + 0.005 + 0.00625 = 0.41625. Ceiling 0: the first grid
    # tau above 0.07875 is 0.100, which lets both scale-to-zero events run alone and keeps the delete out.
    f.write_text(
        "manifest,action,incident_type,dangerous,lines\n"
        "a,scale_to_zero,oom,no,10\nb,scale_to_zero,oom,no,10\nc,delete_pvc_pod,pvc,yes,10\n"
    )
    png = tmp_path / "plot" / "cal.png"
    out = runner.invoke(
        app, ["calibrate", "--incidents", str(f), "--json", "--ceiling", "0", "--plot", str(png)]
    )
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    g = doc["result"]["global_threshold"]
    assert (g["tau"], g["autonomous"], g["dangerous_autonomous"]) == (0.1, 2, 0)
    assert g["mttr_reduction"] == pytest.approx(1 - (2 * 40 + 1200) / (3 * 1200))
    assert doc["rubric"] is None and doc["events"] == 3
    assert "tau: 0.1" in doc["snippet"]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_latencies_and_bad_file() -> None:
    out = runner.invoke(
        app, ["calibrate", "--autonomous-latency", "60", "--escalation-latency", "600", "--json"]
    )
    assert out.exit_code == 0
    last = json.loads(out.output)["result"]["frontier"][-1]
    assert last["mttr_reduction"] == pytest.approx(1 - 60 / 600)
    bad = runner.invoke(app, ["calibrate", "--incidents", "/nonexistent/i.csv"])
    assert bad.exit_code == 2 and "no such incident file" in bad.output


def test_cli_bad_config_and_bad_mode_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "ghostgpu.yaml"
    bad.write_text("controller:\n  autonomy:\n    weights: {baseRisk: -1}\n")
    out = runner.invoke(app, ["calibrate", "-c", str(bad)])
    assert out.exit_code == 2 and "controller.autonomy.weights.baseRisk" in out.output
    mode = runner.invoke(app, ["calibrate", "--per-type-ceiling", "bogus"])
    assert mode.exit_code == 2 and "--per-type-ceiling 'bogus': expected 'pooled' or 'each'" in mode.output
    each = runner.invoke(app, ["calibrate", "--per-type-ceiling", "each", "--json"])
    doc = json.loads(each.output)
    assert doc["result"]["settings"]["per_type_ceiling"] == "each"
    assert all(t["catastrophic_rate"] <= 0.02 for t in doc["result"]["per_type"])
