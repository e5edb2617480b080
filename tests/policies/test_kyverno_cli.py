"""Runs the `kyverno test` suites of this directory with the pinned Kyverno CLI (hack/testbin)
against the rendered policies in policies/, and checks every rendered policy has a suite."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from ghostgpu.devcluster.paths import REPO_ROOT, Toolchain

pytestmark = pytest.mark.e2e

SUITES = Path(__file__).parent
# Policies the CLI cannot exercise, with the e2e test that covers them against the live cluster.
# Kyverno v1.19's CLI matches mutate-existing targets without their Namespace object
# (processor.targetMatchPredicate passes nil), so a targetMatchConstraints.namespaceSelector never
# matches there.
COVERED_BY_E2E = {
    "ghostgpu-track-on-namespace-opt-in": "tests/e2e/test_cluster_admission.py::"
    "test_existing_gpu_deployment_is_tracked_when_its_namespace_opts_in",
}
KYVERNO_KINDS = {
    "MutatingPolicy",
    "GeneratingPolicy",
    "ValidatingPolicy",
    "DeletingPolicy",
    "ImageValidatingPolicy",
}


def kyverno_cli() -> Path:
    cli = Toolchain.locate().kyverno_cli
    if not cli.exists():
        pytest.skip(f"Kyverno CLI not built (run hack/testbin kyverno): {cli}")
    return cli


def suite_files() -> list[Path]:
    return sorted(SUITES.glob("*/kyverno-test.yaml"))


def expected_results(test_file: Path) -> int:
    """One CLI result per listed resource (a generating policy: per generated object)."""
    doc = yaml.safe_load(test_file.read_text())
    n = 0
    for r in doc["results"]:
        if r.get("isGeneratingPolicy"):
            gen = test_file.parent / r["generatedResource"]
            n += len(r["resources"]) * len([d for d in yaml.safe_load_all(gen.read_text()) if d])
        else:
            n += len(r["resources"])
    return n


@pytest.mark.parametrize("suite", suite_files(), ids=lambda p: p.parent.name)
def test_kyverno_cli_suite_passes(suite: Path) -> None:
    proc = subprocess.run(
        [str(kyverno_cli()), "test", str(suite.parent), "--remove-color"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    out = proc.stdout + proc.stderr
    m = re.search(r"Test Summary: (\d+) tests passed and (\d+) tests failed", out)
    assert m, out
    passed, failed = int(m[1]), int(m[2])
    assert (failed, proc.returncode) == (0, 0), out
    assert passed == expected_results(suite), out  # every listed expectation was evaluated


def test_every_rendered_policy_has_a_suite() -> None:
    policies = {}
    for f in sorted((REPO_ROOT / "policies").glob("*.yaml")):
        for d in yaml.safe_load_all(f.read_text()):
            if d and d.get("kind") in KYVERNO_KINDS:
                policies[d["metadata"]["name"]] = f.name
    assert policies, "no Kyverno policies rendered in policies/"
    tested = set()
    for s in suite_files():
        for r in yaml.safe_load(s.read_text())["results"]:
            tested.add(r["policy"])
    assert sorted(set(policies) - tested - set(COVERED_BY_E2E)) == []
    for name, test_id in COVERED_BY_E2E.items():
        assert name in policies, f"{name} is no longer rendered: drop it from COVERED_BY_E2E"
        path, func = test_id.split("::")
        assert f"def {func}(" in (REPO_ROOT / path).read_text(), test_id
