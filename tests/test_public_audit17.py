"""The seventeenth search of public traces (session 63: 20 traces of 15 repositories; OpenACC
and OpenMP-offload programs in Nsight Systems exports, an MI300X rocprofv3 database, a 2021
V100 training trace timed in whole microseconds), each defect reproduced on a hand-written
trace whose numbers are worked out by hand."""

from __future__ import annotations

from traceinsight.pipeline import analyze_trace

from .builder import Events

KERNEL = "fill_kernel"


def _synced_loop(*, alloc: bool = False) -> Events:
    """100 iterations 40 us apart of a CUDA program: a 10 us launch, its 2 us kernel 10 us
    later, a stream sync from 11 to 15 us (it waits for the kernel, which ends at 12, and
    returns 3 us later), then the host's own work until the next launch at 40 (with
    ``alloc``, a cudaMalloc of 2 us at 20, never freed). The GPU idles from each kernel's end
    to the next one's start, 38 us, each gap starting inside the sync: 99 gaps, 3,762 us. The
    host waits in the syncs 4 us an iteration, 400 us in all."""
    ev = Events()
    for i in range(100):
        t = 40 * i
        ev.kernel(KERNEL, t + 10, 2, launch_us=t, launch_dur_us=10)
        ev.runtime("cudaStreamSynchronize", t + 11, 4)
        if alloc:
            ev.runtime("cudaMalloc", t + 20, 2)
    return ev


def test_a_host_bound_loop_gets_back_only_its_wait_in_the_syncs() -> None:
    """Audit s63 D1: an OpenACC loop's 1,942 syncs "leave the GPU idle 55.72 ms" (HIGH), the
    host inside them 10.34 ms: each returned 1-3 us into a 29 us gap its next allocation and
    launch filled. Without a step model nothing says whether the host would queue ahead once
    the syncs went, and it gains the time it waited in them, no more: the GPU's idle shrinks by
    at most that. The idle is still said (3.76 ms); the graded saving is the 0.40 ms waited."""
    a = analyze_trace(_synced_loop().trace())
    f = next(f for f in a.findings if f.id == "host_sync")
    assert f.evidence["idle_ns"] == 99 * 38_000
    assert f.evidence["host_sync_blocked_ns"] == 100 * 4_000
    assert f.cost_ns == 400_000
    assert "leave the GPU idle 3.76 ms" in f.title
    assert "gives the host back the 0.40 ms it waits in them" in f.title
    assert f.severity != "high"  # 0.40 of a 3.96 ms window: 10%, medium


def test_allocations_all_through_the_window_are_no_cache_fill() -> None:
    """Audit s63 D2: 1,942 cuMemAlloc, one an iteration and never freed (190-200 in each tenth
    of the window), were listed as 1,942 one-time calls "later steps do not pay". Mallocs with
    no frees are a fill where they come first and stop; here one in each of the 100
    iterations, 25 in each quarter of the window: allocator calls every iteration pays, none of
    them one-time."""
    from traceinsight.analyzers.idle import churning

    a = analyze_trace(_synced_loop(alloc=True).trace())
    assert a.results.idle.warmup_call_count < 100
    assert not any(c.kind == "first_alloc" for c in a.results.idle.warmup_calls)
    cold = next((f for f in a.findings if f.id == "cold_start"), None)
    assert cold is None or "100 one-time" not in cold.title
    # the same 100 mallocs all in the first quarter are the cache filling: one-time
    ev = Events()
    for i in range(100):
        t = 40 * i
        ev.kernel(KERNEL, t + 10, 2, launch_us=t, launch_dur_us=10)
        if i < 20:
            for j in range(5):
                ev.runtime("cudaMalloc", t + 20 + 3 * j, 2)
    b = analyze_trace(ev.trace())
    assert b.results.idle.warmup_call_count >= 100
    del churning  # (imported to name what decides it)


def test_kernels_shorter_than_the_clock_are_counted() -> None:
    """Audit s63 D3: a 2021 V100 trace timed in whole microseconds holds 639 kernels of
    duration 0 among its 8,868 (the shortest, the launch-bound ones); the headline counted
    8,868, the kernel statistics 8,229. Here 10 kernels of 5 us and 30 of 0 us between them:
    40 kernels, 30 of them elementwise, 50 us of kernel time."""
    ev = Events()
    ew = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>>"
    for i in range(10):
        t = 100 * i
        ev.kernel("ampere_sgemm_128x64_nn", t, 5, launch_us=t - 20)
        for j in range(3):
            ev.kernel(ew, t + 20 + 20 * j, 0, launch_us=t + 10 + 20 * j)
    k = analyze_trace(ev.trace()).results.kernels
    assert (k.kernel_count, k.kernel_ns, k.elementwise_eager_count) == (40, 50_000, 30)
    assert k.elementwise_kernel_count_ratio == 30 / 40
