"""What the step thread pays to receive one batch from DataLoader workers (issue 37, session 24).

A held-out PyTorch Geometric loop ran its 4-worker step 2-3 ms above the step without the loader's
waits, and its profiled trace showed 3.6-4.6 ms a batch in ``_MultiProcessingDataLoaderIter.__next__``
with 22 ops recorded. This times ``next(iterator)`` when the batch is already waiting (the consumer
sleeps first, so the workers are ahead): the receiving alone (queue get, unpickling, each tensor's
storage rebuilt from shared memory), by the number of tensors a batch carries, for plain
dict-of-tensor batches and, where torch_geometric is installed, for PyG's ``Batch``; and the same
batches collated in the step thread (num_workers=0) for scale.

    python benchmarks/loader_receive_cost.py [--batches 40] [--workers 4]

Prints one JSON line per case: tensors per batch, median / p90 receive ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.utils.data import DataLoader, Dataset


class Dicts(Dataset):
    """Samples of ``k`` small tensors each: the default collate stacks them into ``k``."""

    def __init__(self, k: int, n: int = 16384) -> None:
        self.k, self.n = k, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {f"t{j}": torch.full((64,), float(i)) for j in range(self.k)}


def _tensors(batch: object) -> int:
    """Tensors reachable from a batch (dicts, lists, PyG's stores and slice dicts)."""
    seen = 0
    stack = [batch]
    while stack:
        x = stack.pop()
        if isinstance(x, torch.Tensor):
            seen += 1
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif hasattr(x, "__dict__"):
            stack.extend(vars(x).values())
    return seen


def time_receive(loader: DataLoader, batches: int, pause_s: float) -> tuple[list[float], int]:
    it = iter(loader)
    first = next(it)
    for _ in range(10):  # warm: workers started, queue filled
        next(it)
    out = []
    for _ in range(batches):
        time.sleep(pause_s)  # the workers get ahead: next() only receives
        t = time.perf_counter_ns()
        next(it)
        out.append((time.perf_counter_ns() - t) / 1e6)
    return out, _tensors(first)


def report(case: str, ms: list[float], tensors: int, workers: int) -> None:
    ms = sorted(ms)
    print(
        json.dumps(
            {
                "case": case,
                "workers": workers,
                "tensors_per_batch": tensors,
                "median_ms": round(statistics.median(ms), 3),
                "p90_ms": round(ms[int(0.9 * (len(ms) - 1))], 3),
            }
        ),
        flush=True,
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--workers", type=int, default=4)
    a = ap.parse_args()
    cases: list[tuple[str, Dataset, type[DataLoader], dict]] = [
        (f"dict_of_{k}", Dicts(k), DataLoader, {}) for k in (1, 4, 16, 64)
    ]
    try:
        from torch_geometric.datasets import FakeDataset
        from torch_geometric.loader import DataLoader as GraphLoader

        torch.manual_seed(0)
        ds = FakeDataset(
            num_graphs=8192, avg_num_nodes=18, avg_degree=2.2, num_channels=7, task="graph"
        )
        cases.append(("pyg_batch_128_graphs", ds, GraphLoader, {"shuffle": True}))
    except ImportError:
        pass
    for case, ds, cls, kw in cases:
        # the collate in the step thread first; then the workers, the consumer pausing long
        # enough (1.5x a batch's collate over the workers) that every next() finds a batch ready
        ms, n = time_receive(cls(ds, batch_size=128, num_workers=0, **kw), a.batches, 0.0)
        report(case, ms, n, 0)
        pause_s = 1.5 * statistics.median(ms) / 1e3 / a.workers + 0.005
        loader = cls(
            ds,
            batch_size=128,
            num_workers=a.workers,
            persistent_workers=True,
            prefetch_factor=4,
            **kw,
        )
        ms, n = time_receive(loader, a.batches, pause_s)
        report(case, ms, n, a.workers)


if __name__ == "__main__":
    main()
