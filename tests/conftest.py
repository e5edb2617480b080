"""Hypothesis profiles: random exploration locally, a fixed sequence of examples under CI.

Locally every run draws new examples (that is how the fuzz suite keeps finding new bad input; a
failing example is saved in .hypothesis/ and replayed first). Under CI (`CI` set, as .ci/run's
runner does) the examples are derandomized, so a landing depends on the code, not on the draw.
`HYPOTHESIS_PROFILE=ci` or `=dev` picks one explicitly.
"""

from __future__ import annotations

import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev"))
