"""Hypothesis profiles: random exploration locally, a fixed sequence of examples under CI.

Locally every run draws new examples (that is how the fuzz suite keeps finding new bad input; a
failing example is saved in .hypothesis/ and replayed first). Under CI (`CI` set, as .ci/run's
runner does) the examples are derandomized, so a landing depends on the code, not on the draw.
`HYPOTHESIS_PROFILE=ci` or `=dev` picks one explicitly.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))


# --- where each xdist worker's time went ----------------------------------------------------------
# The suite's wall time is its busiest worker's: this table says which one it was and what filled
# it, so a change that lengthens CI can be pinned to a module (hack/test prints it after the run).
_busy: dict[str, dict[str, float]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)  # set by xdist on the controlling process only
    gateway = getattr(node, "gateway", None)
    if gateway is None:
        return
    module = report.nodeid.split("::", 1)[0]
    per_module = _busy.setdefault(str(gateway.id), {})
    per_module[module] = per_module.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _busy:
        return
    terminalreporter.section("busy time per xdist worker (setup + call + teardown)")
    for worker, per_module in sorted(_busy.items(), key=lambda kv: -sum(kv[1].values())):
        top = sorted(per_module.items(), key=lambda kv: -kv[1])[:4]
        modules = ", ".join(f"{m} {s:.0f}s" for m, s in top)
        terminalreporter.write_line(f"{worker}: {sum(per_module.values()):.0f}s; most: {modules}")
