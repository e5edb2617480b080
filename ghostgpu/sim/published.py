"""The published figures of the reference benchmark (docs/design.md#benchmark), to print beside ours."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

PUBLISHED_WINDOW = 5  # the window the publication used for its windowed detectors


class Published(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    fpr: float | None = None
    recall: float | None = None
    accuracy: float | None = None  # the publication gives no accuracy for the single sample


PUBLISHED: dict[str, Published] = {
    "single-util": Published(fpr=0.1093, recall=1.0),
    "window-util": Published(fpr=0.0350, recall=1.0, accuracy=0.9790),
    "paper-multi-signal": Published(fpr=0.0, recall=0.9390, accuracy=0.9756),
}


def published_for(key: str, window: int) -> Published | None:
    """Published figures apply only to the configuration they were measured at."""
    if key == "single-util":
        return PUBLISHED[key]
    if window == PUBLISHED_WINDOW:
        return PUBLISHED.get(key)
    return None
