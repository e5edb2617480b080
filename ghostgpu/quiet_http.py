"""An HTTP server for the project's stand-ins (the fake dcgm-exporter, the scale bench's exporter and
agent double) that does not print a traceback when a client hangs up mid-request: Prometheus drops
a scrape's connection when its timeout passes or a target is removed, and that is not news. Any
other error in a handler is printed as the standard library prints it."""

from __future__ import annotations

import sys
from http.server import ThreadingHTTPServer
from typing import Any


class QuietHTTPServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # reset, broken pipe, aborted
            return
        super().handle_error(request, client_address)
