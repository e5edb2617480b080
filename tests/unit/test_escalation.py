"""The escalation webhook against a real HTTP receiver on 127.0.0.1 (no mocks)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ghostgpu.autonomy import AutonomyConfig, EscalationSettings, WorkloadFacts, decide_action
from ghostgpu.escalation import (
    ALERT_NAME,
    alerts_url,
    annotation_value,
    send_escalation,
    send_escalation_sync,
)

NOW = datetime(2026, 11, 29, 10, 0, 0, tzinfo=UTC)


class Receiver:
    """A tiny Alertmanager stand-in: records POSTs, answers with a configurable status/delay."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.status = 200
        self.delay_s = 0.0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.requests.append((self.path, dict(self.headers), body))
                time.sleep(receiver.delay_s)
                self.send_response(receiver.status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                # The client may have given up already (timeout test).
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self.wfile.write(b"{}" if receiver.status < 400 else b'{"error":"boom"}')

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


FACTS = WorkloadFacts(
    kind="StatefulSet", name="trainer", namespace="team-a", gpus=8, replicas=2, volumes=2, manifest_lines=180
)


def _escalated_decision():
    d = decide_action("FINISHED_IDLE", "delete_pvc_pod", FACTS, AutonomyConfig())
    assert d.escalate  # the fixture itself must be an escalation for these tests to mean anything
    return d


def _assert_alertmanager_v2(payload: object) -> dict:
    # Alertmanager v2 postableAlerts: a JSON array of {labels, annotations, startsAt, ...}.
    assert isinstance(payload, list) and len(payload) == 1
    alert = payload[0]
    assert set(alert) >= {"labels", "annotations", "startsAt"}
    assert all(isinstance(v, str) and v for v in alert["labels"].values())
    assert all(isinstance(v, str) for v in alert["annotations"].values())
    datetime.strptime(alert["startsAt"], "%Y-%m-%dT%H:%M:%SZ")
    return alert


def test_sync_post_is_received_with_alertmanager_v2_shape(receiver: Receiver) -> None:
    settings = EscalationSettings(webhook_url=receiver.url, extra_labels={"cluster": "dev"})
    result = send_escalation_sync(_escalated_decision(), FACTS, settings, now=NOW)
    assert result.ok and result.status_code == 200 and not result.skipped
    assert len(receiver.requests) == 1
    path, headers, body = receiver.requests[0]
    assert path == "/api/v2/alerts"
    assert headers["Content-Type"] == "application/json"
    alert = _assert_alertmanager_v2(json.loads(body))
    assert alert["labels"]["alertname"] == ALERT_NAME
    assert alert["labels"]["namespace"] == "team-a"
    assert alert["labels"]["action"] == "delete_pvc_pod"
    assert alert["labels"]["cluster"] == "dev"
    assert alert["startsAt"] == "2026-11-29T10:00:00Z"
    assert "escalated" in alert["annotations"]["description"]


async def test_async_post_is_received(receiver: Receiver) -> None:
    settings = EscalationSettings(webhook_url=receiver.url + "/hooks/ghostgpu")
    result = await send_escalation(_escalated_decision(), FACTS, settings, now=NOW)
    assert result.ok, result.error
    assert receiver.requests[0][0] == "/hooks/ghostgpu"  # a URL with a path is used as given
    _assert_alertmanager_v2(json.loads(receiver.requests[0][2]))


async def test_http_500_is_a_failure_result_not_an_exception(receiver: Receiver) -> None:
    receiver.status = 500
    settings = EscalationSettings(webhook_url=receiver.url)
    result = await send_escalation(_escalated_decision(), FACTS, settings, now=NOW)
    assert not result.ok and result.status_code == 500 and "boom" in (result.error or "")
    sync = send_escalation_sync(_escalated_decision(), FACTS, settings, now=NOW)
    assert not sync.ok and sync.status_code == 500


@pytest.mark.timeout(20)
async def test_timeout_is_a_failure_result_not_an_exception(receiver: Receiver) -> None:
    receiver.delay_s = 2.0
    settings = EscalationSettings(webhook_url=receiver.url, timeout_seconds=0.3)
    started = time.monotonic()
    result = await send_escalation(_escalated_decision(), FACTS, settings, now=NOW)
    assert not result.ok and result.status_code is None
    assert (result.error or "").startswith("timeout")
    assert time.monotonic() - started < 1.5  # gave up at the timeout, did not wait for the answer
    sync = send_escalation_sync(_escalated_decision(), FACTS, settings, now=NOW)
    assert not sync.ok and (sync.error or "").startswith("timeout")


async def test_unreachable_receiver_and_bad_url_do_not_raise() -> None:
    # Port 9 (discard) on localhost: nothing listens, the connection is refused.
    refused = await send_escalation(
        _escalated_decision(),
        FACTS,
        EscalationSettings(webhook_url="http://127.0.0.1:9", timeout_seconds=1),
        now=NOW,
    )
    assert not refused.ok and refused.error
    bad = send_escalation_sync(
        _escalated_decision(), FACTS, EscalationSettings(webhook_url="not a url"), now=NOW
    )
    assert not bad.ok and "expected an http(s) URL" in (bad.error or "")


def test_no_webhook_configured_is_skipped() -> None:
    result = send_escalation_sync(_escalated_decision(), FACTS, EscalationSettings(), now=NOW)
    assert result.skipped and result.ok and result.url is None


def test_alerts_url_and_annotation_value() -> None:
    assert alerts_url("http://am:9093") == "http://am:9093/api/v2/alerts"
    assert alerts_url("http://am:9093/") == "http://am:9093/api/v2/alerts"
    assert alerts_url("https://hooks.example/x?y=1") == "https://hooks.example/x?y=1"
    value = json.loads(annotation_value(_escalated_decision(), now=NOW))
    assert value["action"] == "delete_pvc_pod" and value["at"] == "2026-11-29T10:00:00Z"
    assert value["score"] >= value["tau"]
