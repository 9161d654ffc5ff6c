import polars as pl
import pytest

from traceinsight.model.classify import FP32_SIMT_PATTERN, KERNEL_RULES, classify_names

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
    assert {c for _, c in CASES} >= {c for c, _ in KERNEL_RULES}


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
    assert s.str.to_lowercase().str.contains(FP32_SIMT_PATTERN).to_list() == [True, True, False]


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
