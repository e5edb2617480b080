"""The facts the README and docs/ quote come from where they are kept: component versions from
hack/versions.env, the manager tables from the actuator rows, counts from the code, figures from
the result files (docs/*.json, benchmarks/results/) they quote. Each test fails when a page and its
source disagree."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from ghostgpu.actuators import builtin_actuators

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
V = r"v?(\d+\.\d+(?:\.\d+)?)"


def pages_text() -> dict[str, str]:
    return {p.relative_to(REPO).as_posix(): p.read_text(encoding="utf-8") for p in PAGES}


def versions_env() -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (REPO / "hack" / "versions.env").read_text().splitlines():
        m = re.match(r"^([A-Z_]+)=\"?([^\"]*)\"?$", line.strip())
        if m:
            out[m.group(1)] = m.group(2)
    return out


# Where the pages name a pinned version: (key in hack/versions.env, pattern whose group 1 is the
# version). Pages also discuss other releases (what changed in Kueue v0.18, a gate from Kubernetes
# 1.34), so only statements about what is pinned are matched.
MENTIONS: list[tuple[str, str]] = [
    ("KUBERNETES_VERSION", rf"\| Kubernetes \| {V}"),
    ("ETCD_VERSION", rf"\betcd {V}"),
    ("KWOK_VERSION", rf"\bkwok {V}"),
    ("KUEUE_VERSION", rf"Kueue \*{{0,2}}{V}\*{{0,2}} (?:\(default\)|by default)"),
    ("KUEUE_VERSION", rf"`KUEUE_VERSION` \({V}\)"),
    ("KUEUE_EXTRA_VERSIONS", rf"`KUEUE_EXTRA_VERSIONS`[^.\n]{{0,30}}?\*{{0,2}}{V}"),
    ("KUEUE_EXTRA_VERSIONS", rf"{V} \(CI runs the Kueue-facing tests"),
    ("KYVERNO_VERSION", rf"\| Kyverno \| {V}"),
    ("KYVERNO_VERSION", rf"Kyverno stays at {V}"),
    ("KYVERNO_VERSION", rf"\(tested: {V}\)"),
    ("PROMETHEUS_OPERATOR_VERSION", rf"prometheus-operator CRDs {V}"),
    ("ARGOCD_VERSION", rf"Argo CD {V}"),
    ("FLUX_KUSTOMIZE_VERSION", rf"kustomize-controller {V}"),
    ("KUBERAY_VERSION", rf"(?:ray-operator|KubeRay operator) {V}"),
    ("LWS_VERSION", rf"(?:sigs\.k8s\.io/lws`|LeaderWorkerSet) {V}"),
    ("KSERVE_VERSION", rf"(?:kserve/kserve`|KServe|LLMInferenceService \() ?{V}"),
    ("KEDA_VERSION", rf"(?:keda/v2`|KEDA) {V}"),
    ("JOBSET_VERSION", rf"(?:sigs\.k8s\.io/jobset`|JobSet) {V}"),
    ("TRAINER_VERSION", rf"(?:trainer/v2`|Kubeflow Trainer) {V}"),
    ("TRAINING_OPERATOR_VERSION", rf"(?:PyTorchJob \(|Training Operator ){V}"),
    ("VICTORIAMETRICS_VERSION", rf"VictoriaMetrics \| {V}"),
    ("VICTORIAMETRICS_VERSION", rf"VictoriaMetrics {V}"),
    ("VICTORIAMETRICS_VERSION", rf"victoriametrics-{V}/"),
]


def _same(shown: str, pinned: str) -> bool:
    """1.35 names v1.35.4; v1.9.4 names v1.9.4; v1.9.3 does not."""
    a, b = shown.lstrip("v").split("."), pinned.lstrip("v").split(".")
    return a == b[: len(a)]


def test_every_quoted_version_is_the_pinned_one() -> None:
    env, text = versions_env(), pages_text()
    wrong, found = [], Counter[str]()
    for key, pattern in MENTIONS:
        pinned = env[key].split()
        for page, body in text.items():
            for m in re.finditer(pattern, body):
                found[key] += 1
                if not any(_same(m.group(1), p) for p in pinned):
                    wrong.append(f"{page}: {m.group(0)!r} but hack/versions.env has {key}={env[key]}")
    assert wrong == []
    # Every pinned component is named somewhere (the README's table at least), so a page that stops
    # quoting one is noticed too.
    assert set(found) == {k for k, _ in MENTIONS}, set(dict(MENTIONS)) - set(found)


def test_a_stale_version_would_be_caught() -> None:
    assert not _same("1.34", "v1.35.4") and not _same("v0.19.1", "v0.19.2") and _same("v3.5", "v3.5.1")


def test_the_manager_tables_are_the_actuator_rows() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "hack" / "write-manager-table"), "--check"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- BEGIN hack/write-manager-table: readme -->")[1].split("<!-- END")[0]
    for a in builtin_actuators():
        assert f"| {a.kind} " in table or f" {a.kind} (`{a.api_version}`)" in table, a.kind


def test_autonomy_counts_the_rendered_objects() -> None:
    """docs/autonomy.md names the built-in incident set object by object: the counts are the code's."""
    from ghostgpu.calibration.incidents import KYVERNO_POLICY_KINDS, builtin_incidents, builtin_manifests

    manifests, _ = builtin_manifests()
    incidents, _ = builtin_incidents()
    kinds = Counter(m.kind for m in manifests)
    text = (REPO / "docs" / "autonomy.md").read_text(encoding="utf-8")
    m = re.search(
        r"\((\d+) objects: (\d+) ClusterQueues, (\d+) Cohort, (\d+) ResourceFlavors,\s+(\d+) LocalQueues, "
        r"(\d+) WorkloadPriorityClasses, the Kueue manager config, (\d+) Kyverno policies, (\d+) Kyverno\s+"
        r"ClusterRoles\) \N{MULTIPLICATION SIGN} the (\d+) remediation classes = (\d+) events",
        text,
    )
    assert m, "docs/autonomy.md no longer lists the built-in incident set"
    total, cq, cohort, rf, lq, wpc, policies, roles, classes, events = map(int, m.groups())
    assert total == len(manifests)
    assert (cq, cohort, rf, lq, wpc) == (
        kinds["ClusterQueue"],
        kinds["Cohort"],
        kinds["ResourceFlavor"],
        kinds["LocalQueue"],
        kinds["WorkloadPriorityClass"],
    )
    assert policies == sum(n for k, n in kinds.items() if k in KYVERNO_POLICY_KINDS)
    assert roles == kinds["ClusterRole"]
    assert events == len(incidents) == total * classes


def test_readme_figures_are_the_result_files() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    shapes = yaml.safe_load((REPO / "tests" / "shapes" / "shapes.yaml").read_text())
    faults = json.loads((REPO / "docs" / "faults.json").read_text())
    m = re.search(r"(\d+) real pod shapes and more\s+than ([\d,]+) injected faults", readme)
    assert m, "README no longer quotes the shapes and the fault suite"
    assert int(m.group(1)) == len(shapes)
    assert int(m.group(2).replace(",", "")) <= min(r["total_faults"] for r in faults["modes"].values())
    assert faults["false_reclaims"] == 0


def test_docs_faults_tables_are_docs_faults_json() -> None:
    """docs/faults.md's result tables are `python -m ghostgpu.scale.fault_table`'s rendering of
    docs/faults.json: both process sources, each run on a commit (not on uncommitted code), each
    over 1,000 faults, no false reclaim."""
    from ghostgpu.scale import fault_table

    doc = json.loads((REPO / "docs" / "faults.json").read_text())
    assert set(doc["modes"]) == {"exec", "agent"}
    for report in doc["modes"].values():
        assert report["total_faults"] >= 1000 and report["false_reclaims"] == 0
        assert report["commit"] and not report["commit"].endswith("+changes"), report["commit"]
    md = (REPO / "docs" / "faults.md").read_text()
    assert fault_table.splice(md, fault_table.render(doc)) == md


def test_readme_bench_claim_is_docs_bench_table() -> None:
    """README's '0 false reclaims, 100% recall on 10,000' is the ghostgpu row of docs/bench.md's table
    (which tests/unit/test_bench.py holds equal to `ghostgpu bench --fault-rate 0.05 --markdown`)."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    bench = (REPO / "docs" / "bench.md").read_text(encoding="utf-8")
    m = re.search(r"(\d+) false reclaims, ([\d.]+)% recall on ([\d,]+) synthetic workloads", readme)
    assert m, "README no longer quotes the benchmark"
    assert f"{int(m.group(3).replace(',', '')):,} instances" in bench
    table = bench.split("<!-- bench:begin -->")[1].split("<!-- bench:end -->")[0]
    row = next(line for line in table.splitlines() if line.startswith("| ghostgpu ("))  # the detector table
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert int(cells[2].replace(",", "")) == int(m.group(1))  # FP: false reclaims
    assert float(cells[8].rstrip("%")) == float(m.group(2))  # recall


def test_readme_quotes_the_measured_image_and_cold_build() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    image = (REPO / "docs" / "image.md").read_text(encoding="utf-8")
    devcluster = (REPO / "docs" / "devcluster.md").read_text(encoding="utf-8")
    size = re.search(r"mmdebstrap, (\d+) MB uncompressed", readme)
    assert size and f"| **{size.group(1)} MB**:" in image
    cold = re.search(r"\(([\d,]+) s in\s+the cold run of", readme)
    assert cold and f"| `hack/testbin` in all | {cold.group(1)} |" in devcluster


def test_dashboard_caption_is_docs_dashboard_json() -> None:
    """docs/dashboard.md's caption tells the h100 gap of the run the picture is drawn from."""
    from ghostgpu.dashboard.preview import Preview

    preview = Preview.model_validate_json((REPO / "docs" / "dashboard.json").read_text())
    [panel] = [p for p in preview.panels if p.title.startswith("Accounting gap")]
    series = {s.name: [v for _, v in s.points] for q in panel.queries for s in q.series}
    text = " ".join((REPO / "docs" / "dashboard.md").read_text(encoding="utf-8").split())
    m = re.search(
        r"Kueue believes all (\d+) free, (\d+) truly are, and the \*\*h100 gap\*\* is the (\d+) GPUs "
        r".*? It closes by (\d+), to (\d+),",
        text,
    )
    assert m, "docs/dashboard.md no longer tells the h100 gap"
    believed, free, gap, closed, left = map(int, m.groups())
    assert series["h100 Kueue believes free"][0] == believed
    assert series["h100 truly free"][0] == free
    assert series["h100 gap"][0] == gap == believed - free
    assert series["h100 gap"][-1] == left == gap - closed


def _agent_scan_means(code: str) -> dict[int, tuple[float, float]]:
    """Per extra process count: the mean CPU per scan and the peak RSS of the `code` runs."""
    data = json.loads((REPO / "benchmarks" / "results" / "agent-scan-hardening.json").read_text())
    rows = [r for run in data["runs"] if run["code"] == code for r in run["results"]]
    out: dict[int, tuple[float, float]] = {}
    for extra in sorted({r["extra_processes"] for r in rows}):
        mine = [r for r in rows if r["extra_processes"] == extra]
        cpu = sum(r["cpu_per_scan_ms"] for r in mine) / len(mine)
        out[extra] = (cpu, max(r["peak_rss_mib"] for r in mine))
    return out


def test_agent_scan_costs_are_the_result_files() -> None:
    """docs/agent.md's two scan tables quote the two result files: the hardened agent's mean per row,
    and the agent before it beside them."""
    text = (REPO / "docs" / "agent.md").read_text(encoding="utf-8")
    for extra, (cpu, rss) in _agent_scan_means("after").items():
        row = f"| {extra:,} | "
        line = next((ln for ln in text.splitlines() if ln.startswith(row) and " ms | " in ln), "")
        assert f"| {cpu:.0f} ms |" in line and line.endswith(f"| {rss:.1f} MiB |"), (extra, line)
    before = " / ".join(f"{cpu:.0f}" for cpu, _ in _agent_scan_means("before").values())
    assert f"gave {before} ms" in text, before
    runtime = json.loads((REPO / "benchmarks" / "results" / "agent-scan-runtime.json").read_text())
    for key in ("development_env", "runtime_venv"):
        cpu = " / ".join(f"{r['cpu_per_scan_ms']:.0f}" for r in runtime[key])
        assert f"| {cpu} ms | {max(r['peak_rss_mib'] for r in runtime[key]):.1f} MiB |" in text, key


def _scale_results(path: str = "docs/scale.json") -> list:
    from ghostgpu.scale.bench import from_json  # what `ghostgpu bench scale --from-json` reads

    return from_json(json.loads((REPO / path).read_text()))


# The saved 50,000-pod run the pages quote by its file name, beside the drawn run.
SAVED_50K = "benchmarks/results/scale-50k.json"


def test_scale_tables_are_docs_scale_json() -> None:
    """docs/scale.md's tables are `ghostgpu bench scale --from-json docs/scale.json`'s, verbatim."""
    from ghostgpu.scale import report

    results, text = _scale_results(), (REPO / "docs" / "scale.md").read_text(encoding="utf-8")
    for table in (
        report.markdown,
        report.floor_markdown,
        report.prometheus_markdown,
        report.sizing_markdown,
        report.exec_markdown,
        report.budget_markdown,
    ):
        assert table(results) in text, table.__name__
    assert report.warmup_markdown(results) in text


@pytest.mark.parametrize("page", ["docs/scale.md", "docs/agent.md"])
def test_scale_prose_quotes_docs_scale_json(page: str) -> None:
    """The largest fleet's figures quoted in prose are those of docs/scale.json (the run drawn),
    and no other floor is quoted beside them."""
    big = _scale_results()[-1]
    assert big.exec_mode is not None and big.floor_s is not None and big.ghostgpu.cycle_cpu_s is not None
    text = (REPO / page).read_text(encoding="utf-8")
    figures = [
        f"{big.ghostgpu.cycle_cpu_s:.3f} s",  # agent mode, CPU per cycle
        f"{big.floor_ratio:.1f}\N{MULTIPLICATION SIGN}",
        f"{big.ghostgpu.peak_rss_mib:.0f} MiB",
        f"{big.exec_mode.cycle_cpu_s:.3f} s",
        f"{(big.exec_cpu_per_candidate_s or 0) * 1e3:.2f} ms",
    ]
    for figure in figures:
        assert figure in text, f"{page} does not quote {figure} from docs/scale.json"
    # Every floor in seconds that the page quotes is one of this run's, or of the saved 50,000-pod
    # run where the page names its file (no older run's beside them).
    saved = _scale_results(SAVED_50K) if SAVED_50K in text else []
    runs = {
        f"{r.floor_s:.{d}f}" for r in [*_scale_results(), *saved] if r.floor_s is not None for d in (2, 3, 4)
    }
    quoted = re.findall(r"floor\)?[^.|\n]{0,12}?(\d+\.\d+) s\b|(\d+\.\d+) s floor", text)
    stale = [a or b for a, b in quoted if (a or b) not in runs]
    assert stale == [], f"{page} quotes floors of no run in docs/scale.json: {stale}"


# Phrases of a lab notebook: a page says what the code does now; history lives in
# benchmarks/results/ and the commit log.
NOTEBOOK = re.compile(
    r"the run before|this round|last run|the run above|earlier version|not yet understood|"
    r"before this (?:was|setting)|\bround \(|\(this round\)",
    re.I,
)


def test_no_page_reads_like_a_lab_notebook() -> None:
    pages = pages_text().items()
    found = [f"{page}: {m.group(0)!r}" for page, body in pages for m in NOTEBOOK.finditer(body)]
    assert found == []


def test_the_architecture_drawing_has_every_running_part() -> None:
    """What runs in a cluster: the controller and, with processSource agent, the node agent."""
    svg = (REPO / "docs" / "architecture.svg").read_text(encoding="utf-8")
    for part in (
        "ghostgpu controller",
        "ghostgpu agent (DaemonSet)",
        "Agent.scan_once()",
        "Kyverno",
        "Kueue",
    ):
        assert part in svg, part


def test_the_saved_50k_run_is_quoted_as_it_is() -> None:
    """The history's table of the saved 50,000-pod run quotes that file's own figures, and
    docs/scale.md its floor."""
    (r,) = _scale_results(SAVED_50K)
    assert r.exec_mode is not None and r.floor_s is not None and r.ghostgpu.cycle_cpu_s is not None
    history = (REPO / "benchmarks" / "results" / "scale-history.md").read_text(encoding="utf-8")
    table = history[history.index("## 50,000 pods after the offline round") :]
    for figure in (
        f"{r.ghostgpu.cycle_cpu_s:.3f} s |",
        f"| {r.floor_ratio:.1f}\N{MULTIPLICATION SIGN} ",
        f"{r.floor_s:.4f} s |",
        f"{r.ghostgpu.peak_rss_mib:.0f} MiB",
        f"| {r.exec_mode.cycle_cpu_s:.3f} s |",
    ):
        assert figure in table, figure
    assert f"{r.floor_s:.4f} s" in (REPO / "docs" / "scale.md").read_text(encoding="utf-8")
