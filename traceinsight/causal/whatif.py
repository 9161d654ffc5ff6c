"""What a prediction is: :class:`WhatIf`, the un-profiled step before and after a change.

Every what-if of the product is one of these, whoever makes it (the replay of a transform, the
steps' own times, an analyzer's scaled kernels, the larger batch, all fixes together), so the
findings, the JSON and the reports read one shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from traceinsight.records import OMIT_NONE


@dataclass(frozen=True)
class WhatIf:
    """``step_time_ns``: the step the prediction starts from (the un-profiled model's median
    step); ``step_time_after_ns``: after the change (per the original batch's samples for a
    larger batch); ``speedup``: their ratio (None where the step would take no time);
    ``speedup_low``: the same change from the un-profiled step's low end.
    ``transforms``: the transforms replayed together (a combined what-if); ``multiplier`` and
    ``batch_step_time_after_ns``: the larger batch's factor and its own step."""

    step_time_ns: int
    step_time_after_ns: int
    speedup: float | None
    transforms: tuple[str, ...] | None = field(default=None, metadata=OMIT_NONE)
    multiplier: int | None = field(default=None, metadata=OMIT_NONE)
    batch_step_time_after_ns: int | None = field(default=None, metadata=OMIT_NONE)
    # the speedup with the profiler's cost per event 2.5 times what the trace shows (the low end
    # of the un-profiled step, analyzers/replay.py): the other end of the range the trace
    # leaves; set for the findings' replayed fixes
    speedup_low: float | None = field(default=None, compare=False, metadata=OMIT_NONE)
    # all fixes together (the loader's loading hidden) where the loader's fix at its stated
    # assumption, twice its rate, would bound them: the speedup at that rate
    speedup_loader_assumed: float | None = field(default=None, compare=False, metadata=OMIT_NONE)
    # all fixes together: the transforms left out because with the others they replay slower
    left_out: tuple[str, ...] | None = field(default=None, compare=False, metadata=OMIT_NONE)
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
    def larger_batch(
        cls, step_ns: float, batch_step_ns: float, multiplier: int, transform: Any = None
    ) -> WhatIf:
        """A batch ``multiplier`` times larger whose step takes ``batch_step_ns``: the time per
        the original batch's samples is that over ``multiplier``, so ``speedup`` is the
        throughput gain."""
        per_batch = batch_step_ns / multiplier
        return cls(
            round(step_ns),
            round(per_batch),
            step_ns / per_batch if per_batch > 0 else None,
            multiplier=multiplier,
            batch_step_time_after_ns=round(batch_step_ns),
            transform=transform,
        )

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


def power_of_two_at_most(x: float) -> int:
    """The largest power of 2 not above ``x`` (1 where ``x`` < 2): a batch multiplier."""
    return 2 ** int(math.log2(max(1.0, x)))


# What the step thread pays to take one batch from DataLoader workers, by the tensors it carries:
# the queue's get, unpickling, each tensor rebuilt on its shared-memory storage. Measured on the
# H200 recording host (benchmarks/loader_receive_cost.py, 4 workers, the batch already waiting):
# 0.75 / 1.54 / 4.08 / 17.74 ms for 1 / 4 / 16 / 64 tensors, PyG's batch of 11 4.46 ms; in
# workers' traces 3.6-4.6 ms for 11 tensors (PyG), 1.8-2.5 ms for 4 (wav2vec2). A slower host
# pays more: it is the host's Python and syscalls, not the GPU's.
RECEIVE_BATCH_NS = 500_000
RECEIVE_TENSOR_NS = 270_000
# where the trace shows no tensor received (a pin-memory thread receives them): taking a ready
# batch from the queue
DATALOADER_FLOOR_NS = 50_000


def receive_ns(tensors: float | None) -> int:
    """The step thread's cost of one batch from workers carrying ``tensors`` tensors."""
    if not tensors or tensors <= 0:
        return DATALOADER_FLOOR_NS
    return round(RECEIVE_BATCH_NS + RECEIVE_TENSOR_NS * tensors)


# The stated assumption of the loader's what-if: the loader delivers batches twice as fast
# (twice the workers, or two workers where the step thread loaded alone), on free host cores.
LOADER_ASSUMED_THROUGHPUT = 2.0
# Workers bound the step where hiding their waits (beyond receiving each batch) would speed it
# up by this much: below it the waits are the workers' jitter, which the prefetched batches
# absorb once the step is faster
LOADER_BOUND_MIN_SPEEDUP = 1.10


@dataclass(frozen=True)
class LoaderPlan:
    """What a faster input pipeline would do, from the step with and without the loader's
    waits (the replay's ``dataloader_floor``) and the loader's kind. ``batch_interval_ns``: the
    step as run, the interval at which the loader delivers while it is the bound;
    ``compute_step_ns``: the step with the waits hidden (the advised loader: workers and
    pinned memory, whose pin-memory thread receives the batches), no shorter than that thread
    takes to receive a step's batches (``receive_ns`` each). Where the step thread
    loads (num_workers=0) the wait is the loading: ``loading_per_batch_ns`` (the step's over
    its ``batches_per_step``) and ``workers_needed`` follow. Without pin_memory the step thread receives each batch itself:
    ``receive_ns`` for ``batch_tensors`` tensors (:func:`receive_ns`, the replay's
    ``dataloader_unpinned``). Where workers load, each takes (its count x the interval) per
    batch, and ``workers_factor`` times the workers hide it (the count is not in the trace).
    The speedups: at :data:`LOADER_ASSUMED_THROUGHPUT` (``assumed_speedup``) and with loading
    hidden (``upper_bound_speedup``); both assume free host cores: workers share them."""

    iterator: str | None
    batch_interval_ns: int
    compute_step_ns: int
    loading_per_batch_ns: int | None
    workers_needed: int | None
    workers_factor: float | None
    assumed_speedup: float
    upper_bound_speedup: float
    batch_tensors: float | None = None
    receive_ns: int | None = None
    batches_per_step: float = 1.0

    @property
    def assumed_step_ns(self) -> int:
        return round(self.batch_interval_ns / self.assumed_speedup)

    @property
    def receive_step_ns(self) -> int:
        """The pin-memory thread's time to receive a step's batches (0: not known): the advised
        loader's floor, and what its workers spend sending them."""
        return round(self.receive_ns * self.batches_per_step) if self.receive_ns else 0


def loader_plan(
    step_ns: float,
    hidden_ns: float,
    iterator: str | None,
    batch_tensors: float | None = None,
    batches_per_step: float | None = None,
) -> LoaderPlan | None:
    """The plan for a loader-bound step (None where hiding the loader saves nothing);
    ``batches_per_step``: the loader's calls in a step (micro-batches, a dataset iterated)."""
    if hidden_ns <= 0 or step_ns <= hidden_ns:
        return None
    # none recorded in the step thread (a pin-memory thread received them): not known there,
    # and not received there (audit 19: "tensors a batch carries 0" beside pinned batches)
    batch_tensors = batch_tensors or None
    receive = receive_ns(batch_tensors) if batch_tensors else None
    batches = max(1.0, batches_per_step or 1.0)
    # the advised loader's one pin-memory thread receives every batch from the workers, so
    # batches arrive no faster than it takes them in: the step with the loading hidden is no
    # shorter (a held-out DLRM, 55 tensors a batch: 15.35 ms each; its loading hidden read
    # 6.7 ms, and with 4 pinned workers the step measured 13.7-14.3 ms, 3.46-3.71x)
    achievable = min(step_ns, max(hidden_ns, (receive or 0) * batches))
    upper = step_ns / achievable
    if iterator == "single_process":
        loading = step_ns - hidden_ns
        # a worker also puts each batch's tensors in shared memory for that thread to take:
        # about what taking them costs (DLRM on a slower H100 host, 2 / 3 / 4 pinned workers:
        # 1.68-1.82x / 2.35-2.90x / 2.39-3.79x against 1.70 / 2.55 / 3.17x so priced; without
        # the sending, 2.32 / 3.17 / 3.17x)
        per_worker = loading + (receive or 0) * batches
        return LoaderPlan(
            iterator,
            round(step_ns),
            round(achievable),
            round(loading / batches),
            max(1, math.ceil(per_worker / achievable)),
            None,
            step_ns / max(achievable, per_worker / LOADER_ASSUMED_THROUGHPUT),
            upper,
            batch_tensors,
            receive,
            batches,
        )
    return LoaderPlan(
        iterator,
        round(step_ns),
        round(achievable),
        None,
        None,
        upper,
        step_ns / max(achievable, step_ns / LOADER_ASSUMED_THROUGHPUT),
        upper,
        batch_tensors,
        receive,
        batches,
    )
