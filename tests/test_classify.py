import csv
import re
from pathlib import Path

import polars as pl
import pytest

from tests.builder import Events
from traceinsight.api import analyze_trace
from traceinsight.model.classify import (
    FP32_RULES,
    KERNEL_RULES,
    classify_names,
    is_fp32_math,
    is_half_math,
)

# One real kernel name per class (from the shared corpus and the H200 fixtures).
CASES = [
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    (
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "communication",
    ),
    ("multimem_all_reduce_kernel", "communication"),
    (
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0",
        "attention",
    ),
    (
        "fmha_cutlassF_f32_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<float>)",
        "attention",
    ),
    ("void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int)", "conv"),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_bias_TNT", "gemm"),
    (
        "void cutlass::Kernel2<cutlass_80_simt_sgemm_128x256_8x4_nt_align1>(cutlass_80_simt_sgemm_128x256_8x4_nt_align1::Params)",
        "gemm",
    ),
    ("Cijk_Alik_Bljk_BBS_BH_MT128x128x64_MI16x16x16x1_SN", "gemm"),
    (
        "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous namespace)::FusedOptimizerTensorListMetadata<4>, at::native::(anonymous namespace)::FusedAdamMathFunctor<float, 4, (at::native::ADAM_MODE)1, false>>",
        "optimizer",
    ),
    (
        "void at::native::reduce_kernel<128, 4, at::native::ReduceOp<float, at::native::func_wrapper_t<float, at::native::sum_functor<float, float, float>::operator()(at::TensorIterator&)::{lambda(float, float)#1}>, unsigned int, float, 4> >",
        "reduction",
    ),
    (
        "void at::native::(anonymous namespace)::GammaBetaBackwardCUDAKernelTemplate<float, float, 32u, 32u, 256u, false, true, false>",
        "reduction",
    ),
    ("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0", "reduction"),
    (
        "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >",
        "elementwise",
    ),
    (
        "void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#7}::operator()() const::{lambda(float)#1}> >",
        "elementwise",
    ),
    ("triton_poi_fused_add_mul_0", "elementwise"),
    ("some_custom_kernel", "other"),
]


@pytest.mark.parametrize(("name", "cls"), CASES)
def test_one_name_per_rule(name, cls):
    assert classify_names(pl.Series([name])).cast(pl.String).to_list() == [cls]


def test_every_rule_has_a_case():
    assert {c for _, c in CASES} >= {r.cls for r in KERNEL_RULES}


def test_lambda_is_not_lamb_optimizer():
    name = "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}>"
    assert classify_names(pl.Series([name])).cast(pl.String).to_list() == ["elementwise"]


def test_fp32_pattern():
    s = pl.Series(
        [
            "cutlass_80_simt_sgemm_128x256",
            "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma",
            "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
        ]
    )
    assert is_fp32_math(s).to_list() == [True, True, False]


def test_names_matching_once_per_name():
    import polars as pl

    from traceinsight.model.classify import names_matching

    df = pl.DataFrame(
        {
            "name": ["aten::mm", "aten::add", None, "aten::mm", "nccl:all_reduce"],
            "i": [0, 1, 2, 3, 4],
        }
    )
    assert names_matching(df, r"^aten::")["i"].to_list() == [0, 1, 3]
    assert names_matching(df, r"^aten::", negate=True)["i"].to_list() == [4]  # null never matches
    assert names_matching(df.head(0), "x").height == 0


# Real kernel names from every GPU generation in the corpus (../shared/traces and the H200
# fixtures), with the class and fp32 flag reviewed by hand; tests/data/make_kernel_names.py made it.
NAMES = list(
    csv.DictReader(
        (Path(__file__).parent / "data" / "kernel_names.tsv").open(encoding="utf-8"),
        delimiter="\t",
        quoting=csv.QUOTE_NONE,
    )
)
MATH = ("gemm", "conv", "attention")


def test_real_names_cover_every_rule_and_generation():
    assert {r["rule"] for r in NAMES} >= {r.rule for r in KERNEL_RULES}
    assert {r["generation"] for r in NAMES} >= {
        "volta", "turing", "ampere", "hopper", "blackwell", "cdna"
    }  # fmt: skip
    fp32 = [r["name"].lower() for r in NAMES if r["fp32_math"] == "1"]
    for rule, pattern in FP32_RULES:
        assert any(re.search(pattern, n) for n in fp32), rule


def test_real_names_get_their_class_and_precision():
    names = pl.Series([r["name"] for r in NAMES])
    got = classify_names(names).cast(pl.String).to_list()
    fp32 = is_fp32_math(names).to_list()
    wrong = [
        (r["expected_class"], g, r["name"][:90])
        for r, g in zip(NAMES, got, strict=True)
        if g != r["expected_class"]
    ]
    assert not wrong
    wrong_fp32 = [
        r["name"][:90]
        for r, f in zip(NAMES, fp32, strict=True)
        if r["expected_class"] in MATH and f != (r["fp32_math"] == "1")
    ]
    assert not wrong_fp32


@pytest.mark.parametrize(
    ("name", "cls", "fp32"),
    [
        # V100 ResNet-50 in fp32 (kineto-samples/worker0.1623143089861): cuDNN's legacy engines
        (
            "void cudnn::cnn::wgrad_alg0_engine<float, 128, 6, 7, 3, 3, 5, false, 512>(int)",
            "conv",
            True,
        ),
        ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int)", "conv", True),
        ("volta_scudnn_128x64_stridedB_splitK_xregs_large_nn_v1", "conv", True),
        (
            "void implicit_convolve_sgemm<float, float, 128, 6, 7, 3, 3, 5, 1, false, true, true>(int)",
            "conv",
            True,
        ),
        # the same on A100 with TF32 on (hta/critical_path/alexnet): tensor cores, not fp32
        (
            "sm80_xmma_fprop_implicit_gemm_indexed_tf32f32_tf32f32_f32_nhwckrsc_nchw_tilesize128x128x16",
            "conv",
            False,
        ),
        # cuDNN's FFT convolution in fp32 (the H200 conv net with TF32 off, fixtures/h200/cnn):
        # its frequency-domain product is a third of the kernel time, conv math, not elementwise
        (
            "void pointwise_mult_and_sum_complex<float2, 8, 4>(float2*, float2*, float2*, int, int, "
            "int, int, int, float2)",
            "conv",
            True,
        ),
        # batch norm is a reduction though cuDNN runs it
        (
            "void cudnn::bn_fw_tr_1C11_kernel_NCHW<float, float, 512, true, 1>(cudnnTensorStruct)",
            "reduction",
            False,
        ),
        # vllm's fused_add_rms_norm (tracelens/b200): "_typeConvert" is not a convolution
        (
            "std::enable_if<vllm::_typeConvert<c10::BFloat16>::exists, void>::type vllm::fused_add_rms_norm_kernel<c10::BFloat16, 8>",
            "reduction",
            False,
        ),
        # cuDNN's tensor conversion (a public compiled ResNet-18, session 52): cuDNN's helper,
        # "conv" before an "e": no fp32 convolution math
        (
            "void cudnn::engines_precompiled::convertTensor_kernel<float, float, float, (cudnnKernelDataType_t)0>(float, float const*, float, float*, unsigned long)",
            "conv",
            False,
        ),
        # fbgemm's embedding bags (hta/timeline_analysis DLRM) do no GEMM
        (
            "void fbgemm_gpu::permute_2D_lengths_kernel<int>(int, int, int const*, int const*, int*)",
            "other",
            False,
        ),
    ],
)
def test_named_faults(name, cls, fp32):
    s = pl.Series([name])
    assert classify_names(s).cast(pl.String).to_list() == [cls]
    assert is_fp32_math(s).to_list() == [fp32]


# Apex's multi_tensor_apply_kernel is a free template (apex/csrc/multi_tensor_apply.cuh) whose
# functor is the optimizer (csrc/multi_tensor_adam.cu AdamFunctor); PyTorch's foreach kernels are
# in at::native with generic list functors (names from hta/nccl_parser_config, param/resnet).
APEX_ADAM = (
    "void multi_tensor_apply_kernel<TensorListMetadata<4>, AdamFunctor<float, float, int>, float, "
    "float, float, float, float, float, adamMode_t, float>(long, int volatile*, TensorListMetadata<4>, "
    "AdamFunctor<float, float, int>, float, float, float, float, float, float, adamMode_t, float)"
)
FOREACH_ADD = (
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::(anonymous "
    "namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::BinaryOpListAlphaFunctor"
    "<float, 3, 2, 2>, std::plus<float>, float>(at::native::(anonymous namespace)::TensorListMetadata<3>)"
)


def _optimizer_trace(opt_class: str, kernel: str, n_kernels: int):
    """Two optimizer steps of ``n_kernels`` kernels each, launched inside ``Optimizer.step#``."""
    e = Events()
    for s in range(2):
        t0 = 1000 * s
        e.step(s, t0, 900)
        e.op(f"Optimizer.step#{opt_class}.step", t0 + 100, 500)
        for i in range(n_kernels):
            e.kernel(kernel, t0 + 200 + 50 * i, 30, launch_us=t0 + 110 + 20 * i)
    return e.trace()


@pytest.mark.parametrize(
    ("opt_class", "kernel", "mode", "fires"),
    [
        ("FusedAdam", APEX_ADAM, "fused", False),  # Apex FusedAdam: already fused
        ("Adam", APEX_ADAM, "fused", False),  # the functor alone says fused
        ("Adam", FOREACH_ADD, "foreach", True),  # torch foreach: fused=True would help
    ],
)
def test_optimizer_mode(opt_class, kernel, mode, fires):
    assert classify_names(pl.Series([kernel])).cast(pl.String).to_list() == ["optimizer"]
    a = analyze_trace(_optimizer_trace(opt_class, kernel, 4))
    assert a.results.optimizer.mode == mode
    assert a.results.optimizer.kernels_per_step == 4  # 4 launches inside each of the 2 ranges
    assert ("unfused_optimizer" in {f.id for f in a.findings}) is fires


def test_v100_resnet50_trained_in_fp32_reads_as_fp32():
    """The 2021 plugin sample (ResNet-50 on a V100, fixtures/corpus) trains in fp32: no kernel in
    the raw file has a tensor-core or half-precision name, so the fp32 share of math must be ~1
    (it was 0.20 when cuDNN's float engines were not recognised)."""
    import lzma

    import orjson

    path = (
        Path(__file__).parents[1]
        / "fixtures/corpus/plugin_2021-01_resnet50_nw0_worker0.pt.trace.json.xz"
    )
    with lzma.open(path, "rb") as f:
        kernels = [e for e in orjson.loads(f.read()) if e.get("cat") == "Kernel"]
    names = {e["name"] for e in kernels}
    assert not any(re.search(r"(?i)884|1688|tensorop|hmma|fp16|half|bf16|f16", n) for n in names)
    # batch norm time, from the raw events: must count as reduction, not convolution
    bn_us = sum(e["dur"] for e in kernels if "cudnn::bn_" in e["name"])
    from traceinsight.api import analyze

    a = analyze(path)
    k = a.results.kernels
    assert k.fp32_gemm_time_ratio > 0.99
    assert "fp32_compute" in {f.id for f in a.findings}
    # the whole trace's kernels (by_class covers only the step window)
    ev = a.trace.events.filter(pl.col("kind") == "kernel")
    by = dict(
        ev.group_by("kernel_class")
        .agg(pl.col("dur_ns").sum())
        .cast({"kernel_class": pl.String})
        .iter_rows()
    )
    assert by["reduction"] >= bn_us * 1000 * 0.999
    # each distinct name classified alone (one call per name, not per kernel)
    distinct = sorted(names)
    classes = dict(zip(distinct, classify_names(pl.Series(distinct)).cast(pl.String), strict=True))
    conv_us = sum(e["dur"] for e in kernels if classes[e["name"]] == "conv")
    assert by["conv"] == pytest.approx(conv_us * 1000, rel=1e-3)


def test_half_math_by_name_and_never_fp32_or_tf32():
    """16-bit (or narrower) math by its library's dtype tags: nvjet's operand letters, cuDNN's
    generated attention, flash attention's element type, Volta's h884; never a name the fp32
    or TF32 readings claim (the real names above: the three are disjoint)."""
    half = [
        "nvjet_sm90_hsh_128x192_64x5_2x1_v_bz_coopB_bias_TNN",
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64",
        "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, "
        "false, false, cutlass::bfloat16_t>>",
        "volta_h884gemm_64x64_ldg8_nn",
        "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn",
    ]
    not_half = [
        "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
        "sm80_xmma_gemm_f32f32_f32f32_f32_tn_n_tilesize128x64x8_stage3",
        "sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32",
        "fmha_cutlassF_f32_aligned_64x64_rf_sm80",
        "void implicit_convolve_sgemm<float, float, 1024, 6, 7, 3, 3, 5, 1, false, true, true>",
    ]
    assert is_half_math(pl.Series(half)).to_list() == [True] * len(half)
    assert is_half_math(pl.Series(not_half)).to_list() == [False] * len(not_half)
    names = pl.Series([r["name"] for r in NAMES if r["expected_class"] in MATH])
    both = is_half_math(names) & (
        is_fp32_math(names) | names.str.to_lowercase().str.contains("tf32")
    )
    assert not both.any()
