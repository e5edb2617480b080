"""The Kueue metrics cert sits at a path every devcluster on the host shares (one per test worker):
a valid pair there is kept, a broken one replaced, and clusters starting at once never leave one
cluster's cert beside another's key (the CI failure `tls: private key does not match public key`)."""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ghostgpu.devcluster.certs import CertAuthority, KeyPair, install_shared_pair, is_matching_pair


def _issuer(tmp: Path, name: str, calls: list[str]):
    ca = CertAuthority(tmp / name)

    def issue() -> KeyPair:
        calls.append(name)
        return ca.issue("kueue-metrics", "kueue-metrics", server=True, ips=("127.0.0.1",))

    return issue


def test_an_empty_directory_gets_a_matching_pair(tmp_path: Path) -> None:
    calls: list[str] = []
    shared = tmp_path / "etc" / "certs"
    install_shared_pair(shared, _issuer(tmp_path, "a", calls))
    assert calls == ["a"]
    assert is_matching_pair(shared / "tls.crt", shared / "tls.key")
    assert not list(shared.glob("*.tmp"))


def test_a_valid_pair_already_there_is_kept(tmp_path: Path) -> None:
    calls: list[str] = []
    shared = tmp_path / "certs"
    install_shared_pair(shared, _issuer(tmp_path, "a", calls))
    before = (shared / "tls.crt").read_bytes(), (shared / "tls.key").read_bytes()
    install_shared_pair(shared, _issuer(tmp_path, "b", calls))
    assert calls == ["a"]
    assert ((shared / "tls.crt").read_bytes(), (shared / "tls.key").read_bytes()) == before


def test_one_clusters_cert_beside_anothers_key_is_replaced(tmp_path: Path) -> None:
    calls: list[str] = []
    a = _issuer(tmp_path, "a", calls)()
    b = _issuer(tmp_path, "b", calls)()
    shared = tmp_path / "certs"
    shared.mkdir()
    shutil.copy(a.cert, shared / "tls.crt")
    shutil.copy(b.key, shared / "tls.key")
    assert not is_matching_pair(shared / "tls.crt", shared / "tls.key")
    install_shared_pair(shared, _issuer(tmp_path, "c", calls))
    assert calls[-1] == "c"
    assert is_matching_pair(shared / "tls.crt", shared / "tls.key")


def test_a_truncated_key_is_not_a_pair(tmp_path: Path) -> None:
    pair = _issuer(tmp_path, "a", [])()
    (tmp_path / "half.key").write_bytes(pair.key.read_bytes()[:40])
    assert not is_matching_pair(pair.cert, tmp_path / "half.key")
    assert not is_matching_pair(pair.cert, tmp_path / "missing.key")


def test_clusters_starting_at_once_leave_one_matching_pair(tmp_path: Path) -> None:
    calls: list[str] = []
    shared = tmp_path / "certs"
    issuers = [_issuer(tmp_path, f"w{i}", calls) for i in range(6)]
    with ThreadPoolExecutor(len(issuers)) as pool:
        list(pool.map(lambda issue: install_shared_pair(shared, issue), issuers))
    assert len(calls) == 1  # the first writer's pair is kept by every later one
    assert is_matching_pair(shared / "tls.crt", shared / "tls.key")
