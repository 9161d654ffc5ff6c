"""Where the time of a whole-step CUDA graph goes on a real training step, un-profiled (needs
torch, timm and a GPU): the launch-bound third-party loop (fixtures/generate/thirdparty/
loop_launch_bound.py: timm mobilenetv3_small_050, batch 16 of 96x96, AdamW) captured whole
(forward, loss, backward, optimizer step) as its ``cudagraph`` fix does, with the per-parameter
optimizer (foreach=False, capturable) and with the fused one.

For each variant, medians over the timed steps: the host's ``replay()`` call, the GPU's time for
one replay (CUDA events on the replay's stream around it, the host waiting before the replay so
nothing queues ahead), the step with the loop's two ``.item()`` reads after each replay, and the
step with no read (N replays, one synchronize). The causal model prices a whole-step graph as the
kernels' time plus a per-node gap (causal/transforms.py); this says what a replay adds to that.

    python benchmarks/graph_step_cost.py [OUT.json]
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
import torch.nn.functional as F

BATCH, HW, CLASSES, STEPS = 16, 96, 100, 30


def median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def variant(fused: bool) -> dict[str, Any]:
    import timm

    torch.manual_seed(0)
    model = timm.create_model("mobilenetv3_small_050", pretrained=False, num_classes=CLASSES).cuda()
    model.train()
    kw: dict[str, Any] = {"lr": 1e-3, "capturable": True}
    kw["fused" if fused else "foreach"] = fused
    opt = torch.optim.AdamW(model.parameters(), **kw)
    xs = [torch.randn(BATCH, 3, HW, HW, device="cuda") for _ in range(8)]
    ys = [torch.randint(0, CLASSES, (BATCH,), device="cuda") for _ in range(8)]

    def body(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = model(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        opt.step()
        return loss.detach(), (out.argmax(1) == y).sum()

    sx, sy = xs[0].clone(), ys[0].clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            body(sx, sy)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(g):
        s_loss, s_correct = body(sx, sy)
    for _ in range(5):
        g.replay()
    torch.cuda.synchronize()

    # the replay call and the GPU's time for one replay, nothing queued ahead of it
    call, gpu, whole = [], [], []
    for i in range(STEPS):
        sx.copy_(xs[i % 8])
        sy.copy_(ys[i % 8])
        torch.cuda.synchronize()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter_ns()
        e0.record()
        g.replay()
        t1 = time.perf_counter_ns()
        e1.record()
        torch.cuda.synchronize()
        t2 = time.perf_counter_ns()
        call.append((t1 - t0) / 1e6)
        gpu.append(float(e0.elapsed_time(e1)))
        whole.append((t2 - t0) / 1e6)

    # the loop's step: copies in, replay, two .item() reads
    synced = []
    torch.cuda.synchronize()
    last = time.perf_counter_ns()
    for i in range(STEPS):
        sx.copy_(xs[i % 8])
        sy.copy_(ys[i % 8])
        g.replay()
        float(s_loss.item())
        int(s_correct.item())
        now = time.perf_counter_ns()
        synced.append((now - last) / 1e6)
        last = now

    # no reads: the replays queue back to back
    torch.cuda.synchronize()
    t0 = time.perf_counter_ns()
    for i in range(STEPS):
        sx.copy_(xs[i % 8])
        sy.copy_(ys[i % 8])
        g.replay()
    torch.cuda.synchronize()
    unsynced = (time.perf_counter_ns() - t0) / 1e6 / STEPS
    res = {
        "optimizer": "fused" if fused else "foreach=False",
        "replay_call_ms": median(call),
        "replay_gpu_ms": median(gpu),
        "replay_synced_ms": median(whole),
        "step_with_item_reads_ms": median(synced),
        "step_no_reads_ms": unsynced,
        "replay_call_ms_all": call,
        "replay_gpu_ms_all": gpu,
    }
    del g
    torch.cuda.synchronize()
    return res


def main() -> None:
    out = [variant(False), variant(True)]
    for r in out:
        print(
            {
                k: (round(v, 3) if isinstance(v, float) else v)
                for k, v in r.items()
                if not k.endswith("_all")
            }
        )
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
