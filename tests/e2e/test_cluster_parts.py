"""The devcluster's pieces that need no binaries: manifests derived from upstream files, the PKI,
process supervision, process tables and the fake dcgm-exporter. These run everywhere."""

from __future__ import annotations

import base64
import ssl
import sys
import threading
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from pydantic import ValidationError

from ghostgpu.devcluster import components, procs
from ghostgpu.devcluster.certs import CertAuthority
from ghostgpu.devcluster.fake_dcgm import FakeDcgmClient, GpuSample, Store, make_server
from ghostgpu.devcluster.kwok_exec import PS_SHIM, ProcessRow, install_shims, render_table
from ghostgpu.devcluster.nodes import GpuNodeSpec, Taint, node_manifest
from ghostgpu.devcluster.paths import Toolchain, kueue_extra_versions, kueue_version, read_versions
from ghostgpu.signals.processes import parse_ps

WEBHOOKS = """
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata: {name: mutating-webhook-configuration}
webhooks:
- name: mpod.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}}
  rules: [{apiGroups: [""], apiVersions: [v1], operations: [CREATE], resources: [pods]}]
- name: mrayjob.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-ray-io-v1-rayjob}}
  rules: [{apiGroups: [ray.io], apiVersions: [v1], operations: [CREATE], resources: [rayjobs]}]
- name: mjob.kb.io
  clientConfig: {service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}}
  rules: [{apiGroups: [batch], apiVersions: [v1], operations: [CREATE], resources: [jobs]}]
"""


def test_kueue_webhooks_use_url_client_config_and_drop_absent_frameworks(tmp_path: Path) -> None:
    (tmp_path / "manifests.yaml").write_text(WEBHOOKS)
    [cfg] = components.kueue_webhook_configs(tmp_path, 9443, b"CA")
    assert cfg["metadata"]["name"] == "kueue-mutating-webhook-configuration"
    hooks = {w["name"]: w for w in cfg["webhooks"]}
    assert set(hooks) == {"mpod.kb.io", "mjob.kb.io"}  # no Ray CRDs here
    assert hooks["mpod.kb.io"]["clientConfig"] == {
        "url": "https://127.0.0.1:9443/mutate--v1-pod",
        "caBundle": base64.b64encode(b"CA").decode(),
    }
    expr = hooks["mpod.kb.io"]["namespaceSelector"]["matchExpressions"][0]
    assert expr["operator"] == "NotIn" and "kueue-system" in expr["values"]
    assert "namespaceSelector" not in hooks["mjob.kb.io"]


SYSTEM = {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                 "values": ["kube-system", "kueue-system"]}]}  # fmt: skip
# The two shapes of config/components/webhook/kustomization.yaml, cut down from v0.17.0 and v0.19.2.
KUSTOMIZATION_V017 = {
    "patches": [
        {"patch": yaml.safe_dump({"kind": "MutatingWebhookConfiguration",
                                  "webhooks": [{"name": "mpod.kb.io", "namespaceSelector": SYSTEM}]})},
        {"patch": yaml.safe_dump({"kind": "ValidatingWebhookConfiguration",
                                  "webhooks": [{"name": "vpod.kb.io", "namespaceSelector": SYSTEM}]})},
    ]
}  # fmt: skip
KUSTOMIZATION_V019 = {
    "patches": KUSTOMIZATION_V017["patches"][1:],
    "replacements": [
        {
            "source": {"kind": "ValidatingWebhookConfiguration", "name": "validating-webhook-configuration",
                       "fieldPath": "webhooks.[name=vpod.kb.io].namespaceSelector"},
            "targets": [{"select": {"kind": "MutatingWebhookConfiguration"},
                         "fieldPaths": ["webhooks.[name=mjob.kb.io].namespaceSelector",
                                        "webhooks.[name=mpod.kb.io].namespaceSelector"],
                         "options": {"create": True}}],
        }
    ],
}  # fmt: skip


@pytest.mark.parametrize(
    ("kustomization", "selected"),
    [(KUSTOMIZATION_V017, {"mpod.kb.io"}), (KUSTOMIZATION_V019, {"mpod.kb.io", "mjob.kb.io"})],
    ids=["patches-v0.17", "replacements-v0.19"],
)
def test_kueue_webhooks_get_the_namespace_selectors_of_the_release_kustomization(
    tmp_path: Path, kustomization: dict[str, object], selected: set[str]
) -> None:
    (tmp_path / "manifests.yaml").write_text(WEBHOOKS)
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    [cfg] = components.kueue_webhook_configs(tmp_path, 9443, b"CA")
    got = {w["name"] for w in cfg["webhooks"] if w.get("namespaceSelector") == SYSTEM}
    assert got == selected
    selectors = components.kueue_webhook_namespace_selectors(tmp_path / "kustomization.yaml")
    assert selectors["vpod.kb.io"] == SYSTEM


def test_a_replacement_from_a_webhook_without_a_selector_is_an_error(tmp_path: Path) -> None:
    bad = {"replacements": KUSTOMIZATION_V019["replacements"]}
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(bad))
    with pytest.raises(ValueError, match=r"vpod.kb.io has no namespaceSelector"):
        components.kueue_webhook_namespace_selectors(tmp_path / "kustomization.yaml")


def test_kueue_crds_get_a_conversion_webhook_only_where_kueue_patches_one(tmp_path: Path) -> None:
    crds, hooks = tmp_path / "crds", tmp_path / "webhook"
    crds.mkdir()
    hooks.mkdir()
    for name in ("workloads", "resourceflavors"):
        (crds / f"{name}.yaml").write_text(
            yaml.safe_dump(
                {
                    "kind": "CustomResourceDefinition",
                    "metadata": {"name": f"{name}.kueue.x-k8s.io"},
                    "spec": {},
                }
            )
        )
    (hooks / "webhook_in_workloads.yaml").write_text(
        yaml.safe_dump({"metadata": {"name": "workloads.kueue.x-k8s.io"}})
    )
    (hooks / "webhook_in_resourceflavors.yaml").write_text(
        yaml.safe_dump({"metadata": {"name": "resourceflavors.kueue.x-k8s.io"}})
    )
    # Kueue's kustomization lists only some of the patches it ships: only those apply.
    (hooks / "crd-kustomization.yaml").write_text(
        yaml.safe_dump({"patches": [{"path": "patches/webhook_in_workloads.yaml"}]})
    )
    by_name = {c["metadata"]["name"]: c for c in components.kueue_crds(crds, hooks, 8443, b"CA")}
    conv = by_name["workloads.kueue.x-k8s.io"]["spec"]["conversion"]
    assert conv["strategy"] == "Webhook"
    assert conv["webhook"]["clientConfig"]["url"] == "https://127.0.0.1:8443/convert"
    assert "conversion" not in by_name["resourceflavors.kueue.x-k8s.io"]["spec"]


# kwok v0.8.0's node-initialize addresses block, abridged: only the entry types found missing.
KWOK_INIT_TEMPLATE = """conditions: []
{{ $hasInternalIP := false }}
{{ range .status.addresses }}{{ if eq .type "InternalIP" }}{{ $hasInternalIP = true }}{{ end }}{{ end }}
{{ if not $hasInternalIP }}
addresses:
{{ with NodeIP }}
- address: {{ . | Quote }}
  type: InternalIP
{{ end }}
{{ end }}
{{ with NodePort }}
daemonEndpoints:
  kubeletEndpoint:
    Port: {{ . }}
{{ end }}
phase: Running
"""


def test_kwok_stage_config_collects_node_and_pod_stages(tmp_path: Path) -> None:
    for sub, stage in (
        ("node/fast", "node-initialize"),
        ("node/heartbeat-with-lease", "hb"),
        ("pod/fast", "pod-ready"),
    ):
        d = tmp_path / sub
        d.mkdir(parents=True)
        doc = {"kind": "Stage", "metadata": {"name": stage}, "spec": {"next": {"statusTemplate": "{}"}}}
        if stage == "node-initialize":
            doc["spec"]["next"]["statusTemplate"] = KWOK_INIT_TEMPLATE
        (d / f"{stage}.yaml").write_text(yaml.safe_dump(doc))
        (d / "kustomization.yaml").write_text("resources: []\n")
    out = components.kwok_stage_config(tmp_path, tmp_path / "kwok.yaml")
    docs = list(yaml.safe_load_all(out.read_text()))
    assert [d["metadata"]["name"] for d in docs] == ["node-initialize", "hb", "pod-ready"]
    # node-initialize now writes the node's addresses as they are (a second initialisation keeps
    # them; the live check is test_cluster.py), else kwok's IP; the rest of the template stays.
    init = docs[0]["spec"]["next"]["statusTemplate"]
    assert "$hasInternalIP" not in init
    assert "addresses:\n{{ with .status.addresses }}\n{{ YAML . 1 }}\n{{ else }}" in init
    assert init.startswith("conditions: []\n") and init.endswith("phase: Running\n")
    assert "daemonEndpoints:" in init
    assert docs[1]["spec"]["next"]["statusTemplate"] == "{}"
    with pytest.raises(ValueError, match="no kwok Stage"):
        components.kwok_stage_config(tmp_path / "nothing", tmp_path / "x.yaml")
    # a kwok whose template changed is told, not silently left dropping addresses
    init_file = tmp_path / "node/fast/node-initialize.yaml"
    init_file.write_text(yaml.safe_dump({"kind": "Stage", "metadata": {"name": "node-initialize"},
                                         "spec": {"next": {"statusTemplate": "addresses: []"}}}))  # fmt: skip
    with pytest.raises(ValueError, match="node-initialize stage changed"):
        components.kwok_stage_config(tmp_path, tmp_path / "y.yaml")


def test_node_manifest_carries_gpu_mig_labels_taints_and_kwok_annotation() -> None:
    spec = GpuNodeSpec(
        name="n1",
        gpus=0,
        extended={"nvidia.com/mig-1g.10gb": 7},
        labels={"pool": "mig"},
        taints=[Taint(key="gpu")],
    )
    m = node_manifest(spec)
    assert m["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert m["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] == "7"
    assert "nvidia.com/gpu" not in m["status"]["capacity"]  # zero whole GPUs: no resource at all
    assert m["metadata"]["labels"]["pool"] == "mig"
    assert m["spec"]["taints"] == [{"key": "gpu", "value": "", "effect": "NoSchedule"}]


def test_ca_signs_a_serving_cert_that_verifies_for_127_0_0_1(tmp_path: Path) -> None:
    ca = CertAuthority(tmp_path)
    pair = ca.issue("srv", "srv", server=True, ips=("127.0.0.1",))
    cert = x509.load_pem_x509_certificate(pair.cert.read_bytes())
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca.pem))
    ctx = ssl.create_default_context(cafile=str(ca.cert_path))
    ctx.load_cert_chain(str(pair.cert), str(pair.key))  # key matches cert
    assert ca.issue("srv", "other").cert == pair.cert  # reused, not re-issued
    assert CertAuthority(tmp_path).pem == ca.pem  # the CA persists


def test_stop_ends_the_process_group_and_alive_guards_against_pid_reuse(tmp_path: Path) -> None:
    rec = procs.start("sleeper", ["/bin/sleep", "60"], tmp_path)
    assert procs.alive(rec)
    assert not procs.alive(rec.model_copy(update={"argv0": "/usr/bin/something-else"}))
    procs.stop(rec, timeout=5)
    assert not procs.alive(rec)


def test_wait_for_reports_the_log_tail_when_the_process_dies(tmp_path: Path) -> None:
    rec = procs.start("dies", ["/bin/sh", "-c", "echo broken-flag >&2; exit 3"], tmp_path)
    with pytest.raises(RuntimeError, match="broken-flag"):
        procs.wait_for("never", lambda: False, timeout=10, rec=rec)


def test_process_table_renders_like_ps_and_rejects_bad_rows() -> None:
    text = render_table(
        [ProcessRow(pid=7, stat="R+", args="python train.py", ppid=0), ProcessRow(pid=8, stat="Z", args="x")]
    )
    assert text == (
        "    PID    PPID STAT ELAPSED COMMAND\n"
        "      7       0 R+       600 python train.py\n"
        "      8       1 Z        600 x\n"
    )
    assert [p.command for p in parse_ps(text)] == ["python train.py", "x"]
    with pytest.raises(ValidationError):
        ProcessRow(pid=0, stat="S", args="x")
    with pytest.raises(ValidationError):
        ProcessRow(pid=1, stat="S S", args="x")


def test_ps_shim_prints_the_table_fails_without_one_and_honours_exit_code(tmp_path: Path) -> None:
    import subprocess

    ps = install_shims(tmp_path / "bin") / "ps"
    assert ps.read_text() == PS_SHIM
    table = tmp_path / "t.txt"
    table.write_text("PID\n1\n")
    ok = subprocess.run(
        [ps, "-eo", "pid"], env={"GHOSTGPU_PROC_TABLE": str(table)}, capture_output=True, text=True
    )
    assert (ok.returncode, ok.stdout) == (0, "PID\n1\n")
    none = subprocess.run([ps], env={}, capture_output=True, text=True)
    assert none.returncode == 1 and "no process table" in none.stderr
    bad = subprocess.run(
        [ps],
        env={"GHOSTGPU_PROC_TABLE": str(table), "GHOSTGPU_PROC_EXIT": "4"},
        capture_output=True,
        text=True,
    )
    assert (bad.returncode, bad.stdout) == (4, "")


def test_fake_dcgm_store_merges_values_and_uses_dcgm_exporter_labels() -> None:
    store = Store()
    store.set(GpuSample(namespace="a", pod='p"q', node="n", gpu=1, values={"DCGM_FI_DEV_GPU_UTIL": 5}))
    store.set(GpuSample(namespace="a", pod='p"q', node="n", gpu=1, values={"DCGM_FI_DEV_FB_USED": 10.5}))
    text = store.exposition()
    util = next(ln for ln in text.splitlines() if ln.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    assert util.endswith("} 5")
    for label in (
        'gpu="1"',
        'Hostname="n"',
        'namespace="a"',
        'pod="p\\"q"',
        'container="main"',
        "UUID=",
        "modelName=",
    ):
        assert label in util
    assert any(ln.startswith("DCGM_FI_DEV_FB_USED{") and ln.endswith(" 10.5") for ln in text.splitlines())
    assert "# TYPE DCGM_FI_DEV_XID_ERRORS gauge" in text
    with pytest.raises(ValueError, match="unknown metric"):
        store.set(GpuSample(namespace="a", pod="p", values={"DCGM_FI_DEV_NOPE": 1}))
    assert store.remove("a", 'p"q') == 1 and "DCGM_FI_DEV_GPU_UTIL{" not in store.exposition()


def test_fake_dcgm_http_api_round_trip() -> None:
    server = make_server(procs.free_port())
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        c = FakeDcgmClient(f"http://127.0.0.1:{server.server_address[1]}")
        c.set("ns", "pod-1", util=80, xid=43)
        m = c.metrics()
        assert 'DCGM_FI_DEV_GPU_UTIL{gpu="0"' in m and 'pod="pod-1"} 80' in m
        assert 'pod="pod-1"} 43' in m
        c.remove("ns", "pod-1")
        assert 'pod="pod-1"' not in c.metrics()
    finally:
        server.shutdown()


def test_read_versions_parses_and_rejects_malformed_lines(tmp_path: Path) -> None:
    f = tmp_path / "v.env"
    f.write_text("# c\nA=1\n\nB = two\n")
    assert read_versions(f) == {"A": "1", "B": "two"}
    f.write_text("A=1\nnot a pair\n")
    with pytest.raises(ValueError, match=r"v.env:2"):
        read_versions(f)


def test_read_versions_unquotes_a_quoted_list(tmp_path: Path) -> None:
    f = tmp_path / "v.env"
    f.write_text('KUEUE_VERSION=v0.19.2\nKUEUE_EXTRA_VERSIONS="v0.17.0 v0.18.3 v0.19.2"\n')
    v = read_versions(f)
    assert kueue_extra_versions(v) == ["v0.17.0", "v0.18.3"]  # the default is not "extra"


def test_kueue_version_comes_from_the_environment_else_versions_env() -> None:
    v = {"KUEUE_VERSION": "v0.19.2", "KUEUE_EXTRA_VERSIONS": "v0.17.0"}
    assert kueue_version(v, {}) == "v0.19.2"
    assert kueue_version(v, {"GHOSTGPU_KUEUE_VERSION": "v0.17.0"}) == "v0.17.0"
    with pytest.raises(ValueError, match=r"GHOSTGPU_KUEUE_VERSION='0.17': expected a Kueue release tag"):
        kueue_version(v, {"GHOSTGPU_KUEUE_VERSION": "0.17"})


def test_toolchain_runs_the_kueue_that_the_environment_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GHOSTGPU_KUEUE_VERSION", "v0.17.0")
    tools = Toolchain.locate(tmp_path)
    assert tools.kueue_version == "v0.17.0"
    assert tools.kueue == tmp_path / "kueue-v0.17.0" / "bin" / "kueue"
    assert tools.kueue_webhook_dir == tmp_path / "kueue-v0.17.0" / "webhook"
    monkeypatch.delenv("GHOSTGPU_KUEUE_VERSION")
    assert Toolchain.locate(tmp_path).kueue_version == read_versions()["KUEUE_VERSION"]


def test_repository_versions_file_pins_every_component() -> None:
    v = read_versions()
    for key in ("ETCD_VERSION", "KUBERNETES_VERSION", "KWOK_VERSION", "KUEUE_VERSION", "KYVERNO_VERSION"):
        assert v[key].startswith("v"), key
    # The Kueue-facing tests also run on at least one older Kueue than the default.
    extra = kueue_extra_versions(v)
    assert extra and all(kueue_version(v, {"GHOSTGPU_KUEUE_VERSION": e}) == e for e in extra)
    assert sys.version_info >= (3, 11)


def test_default_nodes_follow_the_example_config_flavors() -> None:
    from ghostgpu.devcluster.nodes import EXAMPLE_CONFIG, default_nodes, nodes_for_flavors

    flavors = yaml.safe_load(EXAMPLE_CONFIG.read_text())["flavors"]
    nodes = [n for n in default_nodes() if n.name.startswith("gpu-")]
    assert len(nodes) == 2 * len(flavors)
    [cpu] = [n for n in default_nodes() if not n.name.startswith("gpu-")]
    assert cpu.taints == [] and cpu.gpus == 0 and not cpu.extended
    for f in flavors:
        mine = [n for n in nodes if n.name.startswith(f"gpu-{f['name']}-")]
        assert len(mine) == 2
        for n in mine:
            assert n.labels == f["nodeLabels"]
            assert [t.key for t in n.taints] == [t["key"] for t in f["nodeTaints"]]
            resources = node_manifest(n)["status"]["allocatable"]
            assert int(resources[f["resource"]]) > 0
    with pytest.raises(ValueError, match="missing key 'resource'"):
        nodes_for_flavors([{"name": "x"}])


def test_kueue_runs_the_rendered_configuration_with_only_local_overrides(tmp_path: Path) -> None:
    base = {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "managedJobsNamespaceSelector": {"matchLabels": {"ghostgpu.io/reclaim": "enabled"}},
        "waitForPodsReady": {"timeout": "10m", "blockAdmission": True},
        "webhook": {"port": 9443},
        "leaderElection": {"leaderElect": True},
        "metrics": {"bindAddress": ":8443", "enableClusterQueueResources": True},
    }
    cm = {"kind": "ConfigMap", "data": {"controller_manager_config.yaml": yaml.safe_dump(base)}}
    (tmp_path / "cm.yaml").write_text(yaml.safe_dump(cm))
    cfg = components.kueue_config(
        1001, 1002, 1003, tmp_path, base=components.rendered_kueue_config(tmp_path / "cm.yaml")
    )
    assert cfg["managedJobsNamespaceSelector"] == base["managedJobsNamespaceSelector"]
    assert cfg["waitForPodsReady"] == base["waitForPodsReady"]
    assert cfg["webhook"] == {"port": 1001, "host": "127.0.0.1", "certDir": str(tmp_path)}
    assert cfg["metrics"] == {"bindAddress": "127.0.0.1:1003", "enableClusterQueueResources": True}
    assert cfg["leaderElection"] == {"leaderElect": False}
    assert cfg["internalCertManagement"] == {"enable": False}
    assert components.rendered_kueue_config(tmp_path / "absent.yaml") is None
    (tmp_path / "bad.yaml").write_text("kind: ConfigMap\ndata: {}\n")
    with pytest.raises(ValueError, match=r"controller_manager_config\.yaml"):
        components.rendered_kueue_config(tmp_path / "bad.yaml")
