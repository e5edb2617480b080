"""Properties of `render_bundles` over generated configs: well-formed, deterministic, and the Kueue
and policy invariants hold whatever the teams, flavors and namespaces are."""

from __future__ import annotations

import re
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ghostgpu.config import GhostgpuConfig
from ghostgpu.render import render_bundles

RESOURCES = ["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb", "amd.com/gpu"]
names = st.from_regex(r"[a-z][a-z0-9]{0,6}", fullmatch=True)


@st.composite
def configs(draw: st.DrawFn) -> GhostgpuConfig:
    flavor_names = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    flavors = [{"name": f"f-{n}", "resource": draw(st.sampled_from(RESOURCES))} for n in flavor_names]
    cohort = draw(st.booleans())
    team_names = draw(st.lists(names, min_size=1, max_size=5, unique=True))
    teams = []
    for name in team_names:
        quota_flavors = draw(st.lists(st.sampled_from(flavors), min_size=1, unique_by=lambda f: f["name"]))
        quota: dict[str, Any] = {}
        for f in quota_flavors:
            nominal = draw(st.integers(0, 64))
            entry: dict[str, Any] = {"nominalQuota": nominal}
            if cohort and draw(st.booleans()):
                entry["borrowingLimit"] = draw(st.integers(0, 64))
            if cohort and draw(st.booleans()):
                entry["lendingLimit"] = draw(st.integers(0, nominal))
            quota[f["name"]] = entry
        team: dict[str, Any] = {"name": f"t-{name}", "quota": quota}
        if cohort:
            team["cohort"] = "pool"
        if draw(st.booleans()):
            team["namespaceQuota"] = {f["name"]: draw(st.integers(0, 8)) for f in quota_flavors}
        teams.append(team)
    ns_names = draw(st.lists(names, max_size=6, unique=True))
    namespaces = [{"name": f"ns-{n}", "team": draw(st.sampled_from(teams))["name"]} for n in ns_names]
    return GhostgpuConfig.model_validate(
        {
            "flavors": flavors,
            "cohorts": [{"name": "pool"}] if cohort else [],
            "teams": teams,
            "namespaces": namespaces,
        }
    )


def objects(files: dict[str, str], path: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(files.get(path, "")) if d]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs())
def test_render_invariants(cfg: GhostgpuConfig) -> None:
    files = render_bundles(cfg)
    assert render_bundles(cfg) == files

    for bundle in ("policies", "kueue", "controller"):
        [kustomization] = objects(files, f"{bundle}/kustomization.yaml")
        listed = {f"{bundle}/{r}" for r in kustomization["resources"]}
        assert listed == {p for p in files if p.startswith(f"{bundle}/")} - {f"{bundle}/kustomization.yaml"}

    queues = {q["metadata"]["name"]: q["spec"] for q in objects(files, "kueue/cluster-queues.yaml")}
    assert set(queues) == {t.name for t in cfg.teams}
    for team in cfg.teams:
        spec = queues[team.name]
        assert ("cohortName" in spec) == (team.cohort is not None)
        covered = [r for g in spec["resourceGroups"] for r in g["coveredResources"]]
        assert len(covered) == len(set(covered))
        quotas = {}
        for group in spec["resourceGroups"]:
            for flavor in group["flavors"]:
                assert [r["name"] for r in flavor["resources"]] == group["coveredResources"]
                quotas[flavor["name"]] = flavor["resources"][0]
        assert set(quotas) == set(team.quota)
        for flavor_name, q in team.quota.items():
            rendered = quotas[flavor_name]
            assert rendered["name"] == cfg.flavor(flavor_name).resource
            assert rendered["nominalQuota"] == str(q.nominal_quota)
            assert rendered.get("borrowingLimit") == (str(q.borrowing_limit) if q.borrowing_limit else None)

    local = objects(files, "kueue/local-queues.yaml")
    assert {(q["metadata"]["namespace"], q["spec"]["clusterQueue"]) for q in local} == {
        (ns.name, ns.team) for ns in cfg.namespaces
    }

    [mpol, _] = objects(files, "policies/track-gpu-workloads.yaml")
    gpu = next(v for v in mpol["spec"]["variables"] if v["name"] == "gpuResources")["expression"]
    assert sorted(re.findall(r"'([^']+)'", gpu)) == cfg.gpu_resources

    [gpol] = objects(files, "policies/generate-namespace-objects.yaml")
    variables = {v["name"]: v["expression"] for v in gpol["spec"]["variables"]}
    for team in cfg.teams:
        assert f"'{team.name}': '{team.name}'" in variables["clusterQueues"]
    assert sorted(re.findall(r"'([^']+)'", variables["staticNamespaces"])) == sorted(
        n.name for n in cfg.namespaces
    )
