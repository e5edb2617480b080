"""The stand-ins' HTTP server: a client hanging up is not printed as a traceback, a handler's own
bug still is."""

from __future__ import annotations

import contextlib
import threading
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler
from typing import Any

import pytest

from ghostgpu.quiet_http import QuietHTTPServer


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/hangup":
            raise ConnectionResetError(104, "Connection reset by peer")
        raise ValueError("a bug in the handler")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.parametrize(("path", "printed"), [("/hangup", False), ("/bug", True)])
def test_a_hung_up_client_is_quiet_and_a_handler_bug_is_not(
    capfd: pytest.CaptureFixture[str], path: str, printed: bool
) -> None:
    server = QuietHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        with contextlib.suppress(urllib.error.URLError, ConnectionError):
            urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}{path}", timeout=5)
    finally:
        server.shutdown()
        server.server_close()
    err = capfd.readouterr().err
    assert ("Traceback" in err) is printed, err
    assert ("ValueError: a bug in the handler" in err) is printed
