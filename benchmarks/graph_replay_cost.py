"""What replaying a CUDA graph costs by its node count, un-profiled (needs torch and a GPU):
the host's ``replay()`` call and one replay end to end, for graphs of N dependent tiny kernels.
The causal model's GRAPH_LAUNCH_NS and GRAPH_GAP_NS (causal/transforms.py) against it.

    python benchmarks/graph_replay_cost.py [OUT.json]
"""

from __future__ import annotations

import json
import sys
import time

import torch


def median(values: list[int]) -> int:
    return sorted(values)[len(values) // 2]


def main() -> None:
    x = torch.zeros(256, device="cuda")
    out: dict[int, dict[str, float]] = {}
    for n in (50, 200, 500, 1000, 1825, 3000):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up before capture, as torch.cuda.graphs asks
            for _ in range(n):
                x.add_(1)
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            for _ in range(n):
                x.add_(1)
        for _ in range(5):
            g.replay()
        call, whole = [], []
        for _ in range(20):
            torch.cuda.synchronize()
            t0 = time.perf_counter_ns()
            g.replay()
            call.append(time.perf_counter_ns() - t0)
            torch.cuda.synchronize()
            whole.append(time.perf_counter_ns() - t0)
        out[n] = {
            "replay_call_ns": median(call),
            "replay_synced_ns": median(whole),
            "per_node_ns": median(whole) / n,
        }
        print(n, out[n], flush=True)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
