"""The step model's columns, named once: the graph's own (what the replay reads), the flags
the build sets for the transforms, and the sub-gaps (a gap's share inside a kind of host work)
that scale with the gap when the profiler's cost is taken out."""

from __future__ import annotations

# The graph's own columns: the nodes, their edges and times (what the replay and the step times
# read). Anything else a transform reads (what a node is, the build's flags) it declares
# (causal/transforms.py Transform.host_reads, gpu_reads).
HOST_GRAPH_COLUMNS = (
    "node",
    "tid",
    "chain_tid",  # the chain the call is in (a joined autograd burst: the step thread's)
    "name",
    "start_ns",
    "end_ns",
    "gap_ns",
    "gap_from_ns",
    "dur_ns",
    "wait",
    "own_op",
    "queue_op",
    "follows_main",
)
GPU_GRAPH_COLUMNS = (
    "op",
    "chain",
    "start_ns",
    "end_ns",
    "dur_ns",
    "gap_ns",
    "launch",
    "launched",
    "launch_offset_ns",
    "latency_ns",
    "launch_key_ns",
    "after_op",  # the other stream's op it waited for, -1 for none
    "after_lag_ns",
)
# A torch op that launched nothing and ran this long computed on the CPU (the batch made by
# torch.randn on the host, CPU math): no dispatch of GPU work, whatever the dispatch cap, so
# neither the idle's launch overhead (analyzers/idle.py) nor a capture's saving (the step
# model's gap_ops_ns leaves it out). A public T4 trace, three steps of a 2-kernel loop: 3.4 and
# 4.1 ms inside CPU aten::randn read as launch overhead, the cap being 4x the median of gaps
# that were all such ops. The scale at which a launch call is a one-time cost, not a warm
# launch (analyzers/idle.py WARMUP_LAUNCH_MIN_NS).
CPU_ONLY_OP_MIN_NS = 1_000_000
# Torch ops that fill tensors with random data: one that ran on the CPU (for
# CPU_ONLY_OP_MIN_NS or longer, launching nothing, outside the loader's, the optimizer's and
# recompute's ranges) made the step's input on the host, work that grows with the batch
# (audit 18: torch.randn(10000, 10000) on the CPU, 88% of a step, then .cuda(): a 4x batch
# read 3.1x per sample with that time held). Not stack/cat (a model's forward on the CPU
# concatenates: an MTIA rank's 14.95 ms a step) nor randperm (a sampler's, per epoch).
HOST_INPUT_OPS = (
    r"^aten::(rand|randn|randint|rand_like|randn_like|randint_like|normal_|uniform_|random_)$"
)
# The host ranges whose work the transforms move: each gives a host column ``gap_<name>_ns``
# (the gap's time inside such a range on the call's own thread) and ``in_<name>`` (the call is
# inside one), and a GPU column ``in_<name>`` (the op was launched inside one).
# "model": what torch.compile(model) captures, the top-level module's forward calls and the
# backward ops (analyzers/replay.py model_ranges; none without Python stacks)
RANGES = ("dataloader", "empty_cache", "optimizer", "zero_grad", "recompute", "model")
# Inductor's Triton launch, recorded as an op named for its kernel (compiled code)
TRITON_LAUNCH_PATTERN = r"^triton_"
# The columns the build adds for the transforms (a transform declares those it reads).
HOST_FLAGS = (
    *(f"gap_{r}_ns" for r in RANGES),
    *(f"in_{r}" for r in RANGES),
    # the gap's time inside the thread's own torch ops: dispatch, launches (not an op that
    # launched nothing for CPU_ONLY_OP_MIN_NS: CPU computation)
    "gap_ops_ns",
    # the gap's time inside CPU ops that made tensors on the host (HOST_INPUT_OPS): the batch
    # made on the CPU, work a larger batch scales
    "gap_host_input_ns",
    # the gap's time outside every recorded op and annotation of the thread (Python between
    # ops, where stacks are not counted): what the profiler's unrecorded cost can lie in
    "gap_outside_ops_ns",
    "step",  # the step the call is in, -1 before the first
    # what the step thread's loader time would drop to with batches from workers: receiving
    # each of the step's batches (ModelInputs.loader_receive_ns x the batches in the step)
    "dataloader_floor_ns",
    "is_launch",
    "is_alloc",  # a device allocator call, model/classify.py ALLOCATOR_API
    "recorded_events",  # events the profiler recorded in the gap, plus the call
    "compiled_launch",  # the gap holds an inductor Triton launch's op (TRITON_LAUNCH_PATTERN)
    "launched_copy",  # the direction of the copy the call launched (HtoD, DtoH, ...), or null
    "after_copy",  # the direction of the copy the thread's previous call launched, or null
)
GPU_FLAGS = (
    *(f"in_{r}" for r in RANGES),
    "fp32_math",  # fp32 math on CUDA cores, model/classify.py
    "tf32_math",  # TF32 tensor-core math in a GEMM, conv or attention kernel
    "fp32_time_ratio",  # the device's fp32 peak over its 16-bit tensor peak (null: unknown)
    "tf32_time_ratio",  # its TF32 peak over its 16-bit tensor peak (null: unknown)
    # kernels a capturable optimizer adds beside this one when the step is captured in a CUDA
    # graph (a per-parameter Adam(W) step's per-parameter marker kernel; 0 elsewhere)
    "capture_extra_kernels",
    # the op's stream never ran beside its device's other streams in the recording
    "alone",
    # the first fp32/TF32 math kernel its torch matmul/convolution op launched (autocast's
    # casts of the op's operands run before it)
    "opens_math_op",
    # the alignment in elements (1, 2, 4; TENSOR_CORE_ALIGN_ELEMENTS: aligned, or no shapes
    # recorded) a matmul's recorded shapes allow 16-bit tensor-core kernels
    "align_16bit",
    # the kernels channels_last changes: the time they would take in it (ATen's depthwise and
    # cuDNN's channels-first batch norm as NHWC kernels: the layer's bytes at the memory
    # bandwidth; cuDNN's layout transposes 0; null elsewhere or unknown)
    "channels_last_ns",
    # the host time cuDNN's attention would spend building its graph before this kernel, were
    # the step in 16 bits (a new shape's first efficient SDPA call of its step; 0 elsewhere)
    "sdpa_plan_ns",
    # a pinned host-to-device copy's rate on the op's device (bytes/ns): the trace's own
    # pinned uploads where it has them, else the device's host link (the spec table)
    "pinned_bytes_per_ns",
)
# 16 bytes: the 16-bit elements cuBLAS's fastest tensor-core kernels load at a time (align_16bit)
TENSOR_CORE_ALIGN_ELEMENTS = 8
# The gap's shares inside kinds of host work: they shrink with the gap (without_profiler).
SUBGAPS = (
    *(f"gap_{r}_ns" for r in RANGES),
    "gap_ops_ns",
    "gap_host_input_ns",
    "gap_outside_ops_ns",
)
