"""Names: host-call patterns (launches, syncs, blocking copies, the allocator, data loading),
and kernel classification, one ordered rule table applied vectorized to unique names.

The first matching rule wins, so more specific classes come first (an ``implicit_gemm`` is a
convolution, a ``reduce_scatter`` is communication). Extend by adding a row; tests in
tests/test_classify.py hold one real kernel name per rule.
"""

from __future__ import annotations

from typing import NamedTuple

import polars as pl

from traceinsight.model.schema import KernelClassT

# Host-side name patterns (runtime API names are matched after version suffixes are stripped).
LAUNCH_API = (
    r"^(cuda|hip)(LaunchKernel|LaunchKernelExC|LaunchCooperativeKernel|GraphLaunch|ExtLaunchKernel|ModuleLaunchKernel)"
    r"|^cuLaunchKernel|^cuLaunchKernelEx|^cuGraphLaunch|^(cuda|hip)Memcpy\w*Async|^(cuda|hip)Memset\w*Async"
    r"|^hipExtModuleLaunchKernel|^launchKernel|^mtiaLaunch"
)
# The launch calls above that make a copy or a memset, not a kernel
COPY_LAUNCH_API = r"Memcpy|Memset"
SYNC_API = (
    r"^(cuda|hip)(StreamSynchronize|DeviceSynchronize|EventSynchronize|ThreadSynchronize)"
    r"|^cu(StreamSynchronize|CtxSynchronize|EventSynchronize)"
)
# Synchronous copies: the call returns when its copy is done. HIP's twins of CUDA's, and
# hipMemcpyWithStream, which PyTorch on ROCm uses for a synchronous copy (CUDA's is
# cudaMemcpyAsync then a stream sync).
BLOCKING_COPY_API = (
    r"^(cuda|hip)Memcpy(2D|3D|ToSymbol|FromSymbol|Peer)?$|^cuMemcpy(HtoD|DtoH|DtoD)?(_v2)?$"
    r"|^hipMemcpy(HtoD|DtoH|DtoD|WithStream)$"
)
DATALOADER_PATTERN = (
    r"enumerate\(DataLoader\)#|enumerate\(DataPipe\)#|DataLoader.*__next__|^DataLoader"
)
COMM_HOST_PATTERN = (
    r"^nccl:|^gloo:|^c10d::|record_param_comms|^ncclAllReduce|^ncclAllGather|^ncclReduceScatter"
    r"|^ncclBroadcast|^ncclSend|^ncclRecv|^ncclGroupEnd|barrier"
)
# Communicator setup and teardown (NCCL's NVTX ranges, nsys's nccl: domain): a one-time cost,
# not communication (a public NCCL job: 343-1676 ms of idle a rank inside ncclCommInitRank, the
# host in cudaFree/cudaHostAlloc, read as communication)
COMM_SETUP_PATTERN = (
    r"ncclCommInit|ncclCommSplit|ncclGetUniqueId|ncclCommDestroy|ncclCommFinalize|ncclCommAbort"
)
HOST_OP_KINDS = ("cpu_op", "user_annotation")
# an nn.Module call's frame in the Python stacks (Kineto's python_function rows)
MODULE_PATTERN = r"^nn\.Module: "
API_KINDS = ("runtime", "driver")
# The caching allocator's device-memory calls (pinned host memory, cudaMallocHost/cudaFreeHost,
# is not device memory): one definition for the memory analyzer and the step model.
DEVICE_ALLOC_API = r"^(cuda|hip)Malloc(Async|Managed|Pitch)?$|^cuMemAlloc|^cuMemCreate$"
DEVICE_FREE_API = r"^(cuda|hip)Free(Async)?$|^cuMemFree|^cuMemRelease$"
ALLOCATOR_API = f"{DEVICE_ALLOC_API}|{DEVICE_FREE_API}"
# Pinned host memory's calls: not the device allocator, but time the host spends allocating
# (an idle cause, analyzers/idle.py, with the device allocator's).
PINNED_HOST_ALLOC_API = r"^(cuda|hip)(MallocHost|HostAlloc|FreeHost|HostMalloc|HostFree)$"
# cudaFree (and so empty_cache) synchronizes the device before it returns memory.
IMPLICIT_SYNC_API = r"^(cuda|hip)Free$|^cuMemFree"
# Autograd's backward: its engine's evaluate_function ranges and the Backward nodes' ops.
BACKWARD_PATTERN = r"^autograd::engine::evaluate_function|Backward\d*$"
# One-time costs a steady-state loop does not pay: the runtime initialized, modules and
# libraries loaded (lazy loading loads a kernel's module at its first launch), streams,
# events and contexts created.
WARMUP_API = (
    r"^(cu|hip)Init$|^(cu|hip)Module(Load|GetFunction|GetGlobal)\w*|^cuLibrary(Load|Get)\w*"
    r"|^(cuda|hip)(StreamCreate|EventCreate)\w*|^cu(StreamCreate|EventCreate|CtxCreate)\w*"
    r"|^cuDevicePrimaryCtxRetain"
)
# Overhead rows that are the CUDA driver's own work, paid with or without a profiler (nsys's
# CUPTI overhead types, Kineto's "Lazy Function Loading"): not the profiler's idle. A module's
# load or JIT compile is one-time warm-up; a function's lazy load recurs wherever new kernels
# keep appearing (new shapes: the memory fixtures' dynamic batches read as a cold window)
CUDA_OWN_OVERHEAD = r"(?i)\(CUDA\)$|^lazy function loading"
CUDA_LOADING_OVERHEAD = r"(?i)module loading|JIT compiler"
# both: none of these rows is the profiler's own cost
CUDA_DRIVER_OVERHEAD = f"{CUDA_OWN_OVERHEAD}|{CUDA_LOADING_OVERHEAD.removeprefix('(?i)')}"
# A stream made to wait on an event (recorded on another stream, maybe one the trace lacks).
STREAM_WAIT_API = r"^(cuda|hip|cu)StreamWaitEvent\w*"
# Queries and settings of a kernel function's attributes: with CUDA's lazy loading (the
# default since CUDA 12.2) the first one for a function loads its module, which takes
# milliseconds (a public T4 trace: one cudaOccupancyMaxActiveBlocksPerMultiprocessor of 1.32
# ms, the trace's only, before a kernel's first launch; warm ones take microseconds). A device's
# properties queried as slowly: the runtime's first query of the device (audit 13: CuPy's
# 1.2 ms cudaGetDeviceProperties_v2 before its first kernels).
FUNC_ATTRIBUTE_API = (
    r"^(cuda|hip)(FuncGetAttributes?|FuncSetAttribute|OccupancyMaxActiveBlocksPerMultiprocessor"
    r"\w*|OccupancyMaxPotentialBlockSize\w*|GetFuncBySymbol|GetDeviceProperties)(_v\d+)?$"
    r"|^cu(FuncGetAttribute|FuncSetAttribute|KernelGetAttribute|KernelSetAttribute"
    r"|OccupancyMaxActiveBlocksPerMultiprocessor\w*|KernelGetFunction)(_v\d+)?$"
)
# torch.compile's own work (Dynamo, AOTAutograd, Inductor, autotuning), recorded as
# annotations (dynamo_timed): compiling is a first-call cost.
COMPILE_PATTERN = (
    r"^(_compile\.compile_inner|OutputGraph\.call_user_compiler|compile_fx|GraphLowering\."
    r"|CachingAutotuner\.benchmark|PyCodeCache\.load|async_compile\.|compile_file"
    r"|create_aot_dispatcher_function"
    # nvFuser's JIT (its NVTX ranges in an nsys export: 837 ms of NVRTC read as steady-state
    # cpu_work, audit 8)
    r"|FusionKernelRuntime::compile|KernelExecutor::compile|executor_utils::NVRTC)"
)
# CUDA/HIP graph capture: launches between a begin and an end capture run nothing.
CAPTURE_BEGIN_API = r"^(cuda|hip)StreamBeginCapture\w*|^cuStreamBeginCapture\w*"
CAPTURE_END_API = r"^(cuda|hip)StreamEndCapture\w*|^cuStreamEndCapture\w*"
# annotations frameworks put around a capture (vLLM capture_<bs>_<mode>, SGLang, torch's
# CUDAGraph.capture, graph_capture)
CAPTURE_ANNOTATION = r"(?i)^capture_|graph_capture|CUDAGraph\.capture|cuda_graph_capture"
# torch.compile's CUDA Graph Trees record a new graph in one Python frame (with stacks): the
# warm-up of the node's inputs and pools, its syncs and the capture itself (an MI300X xDiT
# capture: 639.5 ms under it, of which 93 ms of gaps outside the capture read "not explained")
CUDAGRAPH_RECORD_FRAME = r"cudagraph_trees\.py\(\d+\): record_function$"


class KernelRule(NamedTuple):
    """One row of the classification table: the class, a case-insensitive regex on the kernel
    name, and the rule's id (tests/data/kernel_names.tsv has real names for each id)."""

    cls: str
    pattern: str
    rule: str


# Ordered: the first matching row wins. Rows that exist only to stop a later, broader row from
# matching (batch norm inside cuDNN, fbgemm's embeddings, ATen elementwise templated on a
# functor whose name says "gemm" or "attention") come before it.
KERNEL_RULES: list[KernelRule] = [
    # jobs.py reads row 0's pattern as the collective-kernel pattern: keep communication first
    KernelRule(
        "communication",
        r"^nccl|ncclkernel|nccldevkernel|rccl|all_?reduce|allgather|all_gather|reduce_?scatter"
        r"|all_?to_?all|alltoall|sendrecv|cross_device_reduce|multimem_|deep_ep|nvshmem|^hccl"
        # DeepEP's dispatch/combine kernels (deep_ep::internode_ll::..., DeepSeek's own build
        # dpsk::ep::internode::...): expert-parallel all-to-all; its ep::cuda:: layout kernels
        # only compute
        r"|ep::(inter|intra)node",
        "collective",
    ),
    # ATen's elementwise templates: the functor they run may carry any name (fbgemm_gpu::_float_to_hfp8)
    KernelRule(
        "elementwise",
        r"^void at::native::(\(anonymous namespace\)::)?(vectorized_|unrolled_)?elementwise_kernel",
        "aten_elementwise",
    ),
    # cuDNN's batch norm is a reduction, not a convolution (the cudnn row below would take it)
    KernelRule(
        "reduction",
        r"cudnn::bn_|bn_fw|bn_bw|batch_?norm|layer_?norm|rms_?norm|group_?norm|gammabeta|welford",
        "normalization",
    ),
    # embedding-bag kernels of fbgemm (DLRM): "fbgemm" contains "gemm" but they do no matrix math
    KernelRule("other", r"fbgemm|split_embedding|bounds_check_indices", "embedding"),
    # block-scale quantization: elementwise, though its arguments name flashinfer
    KernelRule("elementwise", r"quantize_with_block_size|quantize_\w*kernel", "quantize"),
    KernelRule(
        "attention",
        r"flash|fmha|attention|_attn|attn_|sdpa|xformers|mha_|paged_?attention|cudnn_?mha"
        r"|cudnn::fusion::",
        "attention",
    ),
    # "conv" not followed by "e": convolution, convolve, conv_fwd, but not _typeConvert
    KernelRule(
        "conv",
        r"conv([^e]|$)|implicit_gemm|wgrad|dgrad|fprop|winograd|im2col|fft[123]d_|miopen|cudnn"
        # cuDNN's FFT convolution multiplies and sums in the frequency domain
        r"|pointwise_mult_and_sum_complex",
        "conv",
    ),
    KernelRule(
        "gemm",
        r"gemm|gemv|cublas|cutlass|matmul|nvjet|wgmma|xmma|triton_tem_|^cijk_|bmm|_mm_|^mm_|hmma"
        r"|s884|h884|s1688|h1688|i8816|16816",
        "gemm",
    ),
    # "lamb" must not match "lambda", which every templated ATen kernel name contains
    KernelRule(
        "optimizer",
        r"adam|sgd|lamb(?:[^d]|$)|adagrad|rmsprop|novograd|multi_tensor_apply|optimizer|_foreach_",
        "optimizer",
    ),
    KernelRule(
        "reduction",
        r"reduce_kernel|reduction|norm_kernel|softmax|triton_red_|triton_per_|cub::|argmax|argmin"
        r"|cross_entropy|nll_loss|cunn_|topk|sort|scan",
        "reduction",
    ),
    KernelRule(
        "elementwise",
        r"elementwise|triton_poi_|pointwise|copy_kernel|fill_kernel|catarraybatchedcopy|cat_kernel"
        r"|index_kernel|scatter_gather|gather_kernel|where_kernel|dropout|unary|binary",
        "elementwise",
    ),
]

# Kernels whose name alone says they are eager-mode elementwise (fusion candidates) vs fused.
EAGER_ELEMENTWISE = (
    r"vectorized_elementwise_kernel|unrolled_elementwise_kernel|(^|[^_])elementwise_kernel"
)
TRITON_POINTWISE = r"^triton_poi_"
# Inductor's generated kernels (pointwise, persistent and looped reductions, templates, combo)
INDUCTOR_KERNELS = r"^triton_(poi|per|red|tem|for)_"
# a fused optimizer step's kernels (apex's, ATen's _fused_adam(w)_ / _fused_sgd_ functors)
FUSED_OPTIMIZER_KERNELS = (
    r"(?i)fused\w*(adam|sgd|lamb|adagrad|optim)|_fused_"
    r"|(adam|adamw|lamb|sgd|novograd|adagrad|lion)\w*functor"
)
# the host ranges compiled code runs in: a dynamo frame's call, its AOT autograd forward and
# backward, Inductor's compiled graph; what they launch (Triton kernels or cuBLAS calls alike)
# is the compiled code's
COMPILED_CODE_RANGE = (
    r"^Torch-Compiled Region: |^CompiledFunction(Backward)?$|^## Call CompiledFxGraph "
)

# Host ops under which a launched kernel is communication even if its name is not.
COMM_OP_PATTERN = r"^nccl:|^gloo:|record_param_comms|^c10d::|^c10d_functional::|^_c10d_functional::"

# GEMM/conv/attention kernels that run in fp32 on CUDA cores (no tensor cores), as (rule, regex on
# the lower-cased name). A name also matching TENSOR_CORE_PATTERN is never fp32.
FP32_RULES: list[tuple[str, str]] = [
    # cuBLAS/CUTLASS SIMT kernels: sgemm, dgemm, complex cgemm (cuDNN's FFT convolutions), FFMA math
    # (sgemm/dgemm as a token, or after "blas": not inside "batchedgemm", "groupedgemm" or
    # "fusedgemm": audit 22, CK's fp16 BatchedGemmKernel read as fp32 "dgemm")
    ("simt_gemm", r"simt|(^|[^a-z]|blas)[sd]gemm|_g?cgemm|ffma|gemmsn"),
    # xmma with fp32 inputs and outputs: "f32f32_f32f32_f32" but not "tf32f32_tf32f32_f32"
    ("xmma_f32", r"(^|[^t])f32f32_f32f32_f32"),
    # PyTorch's memory-efficient attention in fp32
    ("mem_efficient_attention_f32", r"cutlass[fb]_f32"),
    # cuDNN's single-precision implicit-GEMM convolutions: volta_/turing_/ampere_scudnn_*
    ("scudnn", r"scudnn"),
    # cuDNN's templated legacy engines on float: wgrad_alg0_engine<float, ...>, dgrad_engine<float,
    # implicit/explicit_convolve_sgemm<float, winograd*<float, fft1d/2d_*<float, im2col*<float; also
    # cuDNN's grouped (depthwise) weight gradient,
    # wgrad2d_grouped_direct_kernel<false, true, int, float, ...> (ConvNeXt's 7x7 depthwise
    # layers: 31 ms of a 185 ms fp32 step). Not ATen's own depthwise kernels: see
    # ATEN_DEPTHWISE_PATTERN, nor the layout transposes cuDNN runs around convolutions on
    # channels-first tensors (LAYOUT_KERNELS): no math, and bf16 keeps them (R(2+1)D-18's, 21.6
    # ms a step in fp32 and 17.8 in bf16; gone in channels_last), nor its tensor conversions
    # (``convertTensor_kernel<float, ...>``: "conv" before an "e" is no convolution; a compiled
    # ResNet-18's 1.74 of 2.36 ms of "fp32 math" on a public trace).
    (
        "cudnn_float_template",
        r"([dw]grad\w*|engine|convolve_sgemm|winograd\w*|fft[123]d_\w+|im2col\w*|conv([^e]\w*)?"
        r"|scalepackedtensor_kernel)<((\d+|true|false|int|long), )*float[,>]",
    ),
    # cuDNN's FFT convolution on float: its frequency-domain product (float2: complex fp32)
    ("cudnn_fft_product", r"pointwise_mult_and_sum_complex<float2"),
    # cuBLAS gemv and split-K reductions of fp32 GEMMs
    (
        "cublas_float_helper",
        r"gemv\w*<(int, )*float|gemmk1_kernel<(int, )?float|gemvx::kernel<int, int, float"
        r"|splitkreduce_kernel<(\d+, \d+, int, )?float, float, float",
    ),
]
FP32_MATH_PATTERN = "|".join(f"(?:{p})" for _, p in FP32_RULES)
TENSOR_CORE_PATTERN = (
    r"tensorop|wmma|hmma|tf32|bf16|f16|fp16|float16|half|bfloat16|e4m3|e5m2|e2m1|fp8|int8|s884|h884"
    r"|s1688|h1688|i8816|s16816|h16816|s161616|wgmma|nvjet|mfma|xdl"
)


# TF32 tensor-core math (cuBLAS/CUTLASS name it: "sm90_xmma_gemm_f32f32_tf32f32_f32_...",
# "cutlass_80_tensorop_s1688tf32gemm_..."): bf16 autocast moves it to bf16 tensor cores too
TF32_MATH_PATTERN = r"tf32"


# Math on 16-bit (or narrower) inputs, named by its library: cuBLAS/CUTLASS/cuDNN dtype tags
# ("f16f16", "bf16", "s16816gemm_fp16", Volta's h884 and Turing's h1688), nvjet's operand
# letters ("nvjet_sm90_hsh_...": half inputs), flash and memory-efficient attention's element
# types ("cutlass::half_t", "bfloat16_t", "cutlassF_f16"), fp8 and int8. A kernel whose name
# carries no dtype (a cuDNN engine of unknown inputs) is not counted.
HALF_MATH_PATTERN = (
    r"bf16|f16|fp16|float16|half|bfloat16|h884|h1688|h16816|nvjet_sm\d+_[hb]|e4m3|e5m2|fp8"
    r"|int8|i8816"
)


def is_half_math(names: pl.Series) -> pl.Series:
    """Whether each (math-class) kernel name runs on 16-bit or narrower inputs."""
    lower = names.str.to_lowercase()
    return lower.str.contains(HALF_MATH_PATTERN) & ~lower.str.contains(TF32_MATH_PATTERN)


def is_tf32_math(names: pl.Series) -> pl.Series:
    """Whether each kernel name runs TF32 tensor-core math."""
    return names.str.to_lowercase().str.contains(TF32_MATH_PATTERN)


# ATen's own depthwise convolutions (conv_depthwise2d_forward_kernel<3, float, int>, its
# backward and grad_weight kernels; conv_depthwise3d_*), which PyTorch runs for channels-first
# depthwise layers where cuDNN is not chosen. Direct convolutions on CUDA cores in every dtype:
# bf16 autocast runs the same kernels on BFloat16 in the same time (EfficientNet-B0's, 21.5 ms
# of a step in fp32 and 21.9 in bf16, fixtures/h200/thirdparty/efficientnet.truth.json), so
# they are no fp32 math that bf16 moves to tensor cores; channels_last sends those layers to
# cuDNN's NHWC depthwise kernels instead (2.4 ms there).
ATEN_DEPTHWISE_PATTERN = r"conv_depthwise[23]d"
# What else channels_last changes, by lower-cased kernel name: cuDNN's channels-first batch
# norm (``bn_fw_tr_1C11_kernel_NCHW``, ``bn_bw_1C11_kernel_new``, their ``singleread`` forms;
# in channels_last cuDNN runs ``batchnorm_*_nhwc_semiPersist``: EfficientNet-B0 22.8 -> 8.3 ms
# a step, MobileNetV2 5.7 -> 2.3) and its layout transposes around convolutions on
# channels-first tensors (gone in channels_last)
NCHW_BATCH_NORM_KERNELS = r"cudnn::bn_(fw|bw)_\w*1c11"
LAYOUT_KERNELS = r"nchwtonhwckernel|nhwctonchwkernel"
# Every batch norm kernel, cuDNN's (``bn_fw_tr_1C11_*``, ``batchnorm_*_nhwc_*``) or ATen's
# (``batch_norm_*``, lower-cased): under bf16 autocast batch norm takes bf16 input with fp32
# parameters, which only ATen's own kernels run, in no less time (R(2+1)D-18: cuDNN's NCHW 30.4
# ms a step -> ATen's 38.9 in bf16; cuDNN's NHWC 16.8 -> ATen's channels_last 19.9)
BATCH_NORM_KERNELS = r"cudnn::bn_|batchnorm|batch_norm"


def is_channels_first_kernel(names: pl.Series) -> pl.Series:
    """Whether each kernel name is one channels_last moves to cuDNN's NHWC kernels: ATen's
    depthwise kernels or cuDNN's channels-first batch norm (not the layout transposes, which
    it removes)."""
    lower = names.str.to_lowercase()
    return lower.str.contains(ATEN_DEPTHWISE_PATTERN) | lower.str.contains(NCHW_BATCH_NORM_KERNELS)


def is_fp32_math(names: pl.Series) -> pl.Series:
    """Whether each (math-class) kernel name runs in fp32 on CUDA cores, math that bf16
    autocast moves to tensor cores (not ATen's depthwise kernels: :data:`ATEN_DEPTHWISE_PATTERN`,
    nor cuDNN's layout transposes: :data:`LAYOUT_KERNELS`)."""
    lower = names.str.to_lowercase()
    return (
        lower.str.contains(FP32_MATH_PATTERN)
        & ~lower.str.contains(TENSOR_CORE_PATTERN)
        & ~lower.str.contains(ATEN_DEPTHWISE_PATTERN)
        & ~lower.str.contains(LAYOUT_KERNELS)
    )


def classify_names(names: pl.Series) -> pl.Series:
    """Class of each kernel name (``other`` when no rule matches)."""
    lower = names.str.to_lowercase()
    frame = pl.DataFrame({"n": lower})
    expr: pl.Expr = pl.lit("other")
    for cls, pattern, _ in reversed(KERNEL_RULES):
        expr = pl.when(pl.col("n").str.contains(pattern)).then(pl.lit(cls)).otherwise(expr)
    return frame.select(expr.cast(KernelClassT).alias("kernel_class")).to_series()


def names_matching(
    df: pl.DataFrame,
    pattern: str,
    *,
    col: str = "name",
    negate: bool = False,
    names: pl.Series | None = None,
) -> pl.DataFrame:
    """Rows of ``df`` whose ``col`` matches the regex (or not, with ``negate``); null never matches.

    The regex runs once per distinct name and the rows are picked by hash lookup: a long trace
    repeats a few thousand names millions of times. ``names``: the column's distinct values,
    where the caller already has them.
    """
    if names is None:
        names = df.get_column(col).unique()
    hits = names.filter(names.str.contains(pattern))
    member = pl.col(col).is_in(hits.implode())
    keep = pl.col(col).is_not_null() & (~member if negate else member)
    if not negate:
        return df.filter(keep)
    # Leaving out the few matches usually keeps every row: then the rows as they are, not a
    # copy of them all (the host ops without step markers: millions of rows, 0.1 s).
    mask = df.select(keep).to_series()
    return df if mask.all() else df.filter(mask)


def coded_names(df: pl.DataFrame, col: str = "name") -> pl.DataFrame:
    """``df`` with ``col`` as an Enum of its distinct values, for a group_by on it and another
    key: two keys are hashed as one encoded row per event, which holds the whole name (kernel
    names run to hundreds of bytes: 53 MB for the 10x trace's kernels), where an Enum is a small
    integer code. Cast it back to String before sorting by it (an Enum sorts by code)."""
    names = df.get_column(col).drop_nulls().unique()
    return df.with_columns(pl.col(col).cast(pl.Enum(names)))


def name_matches(df: pl.DataFrame, pattern: str, col: str = "name") -> pl.Expr:
    """``col`` matches the regex, as an expression over ``df``'s rows: the regex runs once per
    distinct value (null never matches), as in :func:`names_matching`."""
    names = df.get_column(col).drop_nulls().unique()
    return pl.col(col).is_in(names.filter(names.str.contains(pattern)).implode())


def add_kernel_class(events: pl.DataFrame) -> pl.DataFrame:
    """Fill ``kernel_class`` for GPU activity rows; rules run once per unique kernel name and
    only kernel rows are looked up (a join over every row would hash every host op's name).
    Kernels a parser already classified (nsys, by string id) keep their class."""
    base = (
        pl.when(pl.col("kind") == "memcpy")
        .then(pl.lit("memcpy").cast(KernelClassT))
        .when(pl.col("kind") == "memset")
        .then(pl.lit("memset").cast(KernelClassT))
        .when(pl.col("kind") == "kernel")
        .then(pl.col("kernel_class"))
        .otherwise(pl.lit(None, KernelClassT))
        .alias("kernel_class")
    )
    out = events.with_columns(base)
    rows = (
        (out.get_column("kind") == "kernel") & out.get_column("kernel_class").is_null()
    ).arg_true()
    if rows.len() == 0:
        return out
    names = out.get_column("name").gather(rows)
    uniq = names.drop_nulls().unique()
    classes = names.replace_strict(
        uniq, classify_names(uniq), default=None, return_dtype=KernelClassT
    ).fill_null("other")
    return out.with_columns(out.get_column("kernel_class").scatter(rows, classes))


def mark_comm_by_launcher(events: pl.DataFrame) -> pl.DataFrame:
    """Kernels launched from a collective op (``record_param_comms``, ``nccl:*``) are communication.

    Join kernel -> runtime call on correlation (per pid where known), then runtime call -> host op
    on the runtime call's external id: the kernel's own external id is unreliable for NCCL in
    torch 2.0/2.1 (kineto#782).
    """
    cols = events.select("kind", "name", "external_id", "correlation")  # filter 4 columns, not all
    host_ops = (
        names_matching(
            cols.filter(
                pl.col("kind").is_in(["cpu_op", "user_annotation"])
                & pl.col("external_id").is_not_null()
            ),
            COMM_OP_PATTERN,
        )
        .select("external_id")
        .unique()
    )
    if host_ops.height == 0:
        return events
    calls = cols.filter(
        pl.col("kind").is_in(["runtime", "driver"]) & pl.col("correlation").is_not_null()
    ).join(host_ops, on="external_id", how="semi")
    if calls.height == 0:
        return events
    # a membership test, not a join: joining would copy every column of every event
    comm = (pl.col("kind") == "kernel") & pl.col("correlation").is_in(
        calls.get_column("correlation").unique().implode()
    )
    return events.with_columns(
        pl.when(comm)
        .then(pl.lit("communication", KernelClassT))
        .otherwise(pl.col("kernel_class"))
        .alias("kernel_class")
    )
