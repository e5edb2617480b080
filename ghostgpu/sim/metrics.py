"""Binary-classification counts for a detector. Positive = reclaimable (FINISHED_IDLE or
ZOMBIE_CRASHED ground truth); a false positive is an ACTIVE workload judged reclaimable — a false
reclaim, the safety metric."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, computed_field


def _ratio(num: int, den: int) -> float | None:
    return num / den if den else None


class Confusion(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    tp: int = Field(0, ge=0)
    fp: int = Field(0, ge=0)
    tn: int = Field(0, ge=0)
    fn: int = Field(0, ge=0)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def fpr(self) -> float | None:
        return _ratio(self.fp, self.fp + self.tn)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def recall(self) -> float | None:
        return _ratio(self.tp, self.tp + self.fn)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def precision(self) -> float | None:
        return _ratio(self.tp, self.tp + self.fp)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def accuracy(self) -> float | None:
        return _ratio(self.tp + self.tn, self.tp + self.fp + self.tn + self.fn)

    @property
    def total(self) -> int:
        return self.tp + self.fp + self.tn + self.fn


class Counter:
    """Mutable tally used while the benchmark runs; frozen into a `Confusion` at the end."""

    __slots__ = ("fn", "fp", "tn", "tp")

    def __init__(self) -> None:
        self.tp = self.fp = self.tn = self.fn = 0

    def add(self, truth_positive: bool, predicted_positive: bool) -> None:
        if truth_positive:
            if predicted_positive:
                self.tp += 1
            else:
                self.fn += 1
        elif predicted_positive:
            self.fp += 1
        else:
            self.tn += 1

    def freeze(self) -> Confusion:
        return Confusion(tp=self.tp, fp=self.fp, tn=self.tn, fn=self.fn)
