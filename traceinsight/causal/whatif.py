"""What a prediction is: :class:`WhatIf`, the un-profiled step before and after a change.

Every what-if of the product is one of these, whoever makes it (the replay of a transform, the
steps' own times, an analyzer's scaled kernels, the larger batch, all fixes together), so the
findings, the JSON and the reports read one shape.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from traceinsight.records import OMIT_NONE


@dataclass(frozen=True)
class WhatIf:
    """``step_time_ns``: the step the prediction starts from (the un-profiled model's median
    step); ``step_time_after_ns``: after the change (per the original batch's samples for a
    larger batch); ``speedup``: their ratio (None where the step would take no time).
    ``transforms``: the transforms replayed together (a combined what-if); ``multiplier`` and
    ``batch_step_time_after_ns``: the larger batch's factor and its own step."""

    step_time_ns: int
    step_time_after_ns: int
    speedup: float | None
    transforms: tuple[str, ...] | None = field(default=None, metadata=OMIT_NONE)
    multiplier: int | None = field(default=None, metadata=OMIT_NONE)
    batch_step_time_after_ns: int | None = field(default=None, metadata=OMIT_NONE)
    # the change of the model it replayed (causal/transforms.py Transform; None where it came
    # from no replay): what a combined what-if applies together with others
    transform: Any = field(default=None, compare=False, repr=False, metadata={"json": False})

    @classmethod
    def of(cls, before_ns: float, after_ns: float | None) -> WhatIf | None:
        """The change from ``before_ns`` to ``after_ns`` (None where there is no after)."""
        if after_ns is None:
            return None
        return cls(
            round(before_ns), round(after_ns), before_ns / after_ns if after_ns > 0 else None
        )

    def __getstate__(self) -> dict[str, Any]:
        # the transform is a closure over this process's model: it stays behind when an
        # analysis crosses processes (a job's ranks), as the model does
        return {**self.__dict__, "transform": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)

    def of_transform(self, transform: Any) -> WhatIf:
        """This prediction, remembering the transform it replayed."""
        return replace(self, transform=transform)

    @classmethod
    def unchanged(cls, step_ns: float) -> WhatIf:
        """A change the model says saves nothing."""
        return cls(round(step_ns), round(step_ns), 1.0)

    @property
    def saving_ratio(self) -> float:
        """The share of the step the change saves, in 0..1."""
        if self.step_time_ns <= 0:
            return 0.0
        return min(1.0, max(0.0, 1.0 - self.step_time_after_ns / self.step_time_ns))
