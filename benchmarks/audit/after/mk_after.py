# ruff: noqa
import json, copy
B = json.load(open('verdicts.json'))['traces']
A = {}
def T(name, lever, findings, health=None, true_lever=None, healthy=None, change=""):
    t = {"gpu": B[name]["gpu"], "kind": B[name]["kind"], "lever": lever}
    if true_lever is not None:
        t["true_lever"] = true_lever
    elif "true_lever" in B[name]:
        t["true_lever"] = B[name]["true_lever"]
    if healthy:
        t["healthy"] = True
    t["findings"] = findings
    t["health"] = health if health is not None else []
    t["change"] = change
    A[name] = t

T("awsgpu_report2", False, [
  ["gpu_underutilized", "high", "right", None, "busy 0.0957 recomputed (99.5 of 1039.87 ms); HIGH at 90% idle is consistent with the other traces (was MEDIUM). Still misses one cause: the 39.156 ms cudaLaunchKernel_v7000 at +582.864 ms (the only launch; lazy loading, cuModuleGetLoadingMode traced) sits in the idle gap right before softmax_fused_1sc starts at +622.0 ms, yet cold_start is not raised and 940.24 of 940.34 ms are 'not explained'; the rest of the idle is host CPU work between UM page-fault migrations (copyKind 11/12 bursts with ~2.8 ms gaps)"],
  ["host_sync", "info", "right", None, "1 cudaDeviceSynchronize (35.63 ms, covers the kernel): 0.09 ms idle"]],
  [["metrics.h2d_bytes", "right", "6", "fixed: h2d_bytes 0 (the 834 copyKind 11 rows are UM migrations, not HtoD)"],
   ["metrics.short_kernel_ratio", "right", "6", "fixed: None (was 1.0 for one 35.63 ms kernel)"]],
  change="gpu_underutilized MEDIUM -> HIGH (still right); UM copies and short_kernel_ratio fixed")

T("extrap_exgpu_s1000", True, [
  ["cold_start", "low", "right", None, "'2.94 ms of GPU idle is one-time cost ... cudaLaunchKernel 2.93 ms': the 2.94 ms gap holds the first cudaLaunchKernel_v7000 (2.93 ms); minor: '2 one-time calls' is that one call counted twice (the export holds every runtime call twice, cudaLaunchKernel and cudaLaunchKernel_v7000 with equal times: warmup_calls lists offset 223089 and 223169 ns, dur 2927582 and 2927389 ns)"],
  ["host_sync", "info", "right", None, "was HIGH 2.98 ms; now 0.05 ms idle at info: the syncs total 0.16 ms"]],
  [["runtime rows", "unsure", None, "each runtime call appears twice in CUPTI_ACTIVITY_KIND_RUNTIME; the cold_start evidence lists the first launch twice"]],
  true_lever="none (toy); the 2.94 ms gap is one cold first cudaLaunchKernel: cold_start says so",
  change="host_sync HIGH (wrong) -> info; first finding cold_start low (right)")

T("extrap_concurrent_s16", False, [
  ["host_sync", "low", "wrong", "2", "first finding: '13 host syncs leave the GPU idle 238.90 ms; most from main' = all of the 238.90 ms idle of the 776.80 ms GPU span, but the 16 sync calls (cudaEventSynchronize x5 427.0 ms, cudaStreamSynchronize x10 111.1 ms, all while kernels run) overlap only 0.73 ms of that idle; 206.02 ms of it is pinned/device allocation between the experiments: cudaHostAlloc_v3020 115.94 ms, cudaFreeHost_v3020 59.98 ms, cudaMalloc_v3020 22.49 ms, cudaFree_v3020 7.61 ms (gaps of 170.15 ms at +61.54 ms and 68.36 ms at +281.57 ms); allocator_churn is not raised (cudaHostAlloc/cudaFreeHost not counted as allocator calls, or host_sync takes the gap first). LOW only because cold_start (info) caps the window"],
  ["cold_start", "info", "unsure", None, "'15 one-time calls, the longest cudaStreamCreate 0.03 ms': the streams are created per experiment (15 cudaStreamCreate, 172.46 ms in all, most in one call before the window); not a steady loop either way"]],
  [["crash", "right", "9", "fixed: exit 0, metadata read with the non-UTF-8 byte replaced"]],
  true_lever="none (CUDA sample); the GPU idle is per-experiment cudaHostAlloc/cudaFreeHost/cudaMalloc/cudaFree (206.0 of 238.9 ms): allocate once outside the loop",
  change="crash fixed; new output: first finding host_sync low attributes allocator idle to syncs (wrong)")

T("lighttransport_gemm_profile", None, [], [["no GPU activity", "right", None, "unchanged: 'the export has no CUDA GPU activity'"]], change="unchanged")
T("unsloth_puzzles_trace", None, [], [["no GPU activity", "right", None, "unchanged"]], change="unchanged")
T("zoology_a100_inference", None, [], [["no GPU activity", "right", "6", "fixed: data_quality error device_activity_missing '268 launch calls were traced but the trace has no GPU activity'"]], change="lost device activity now a data-quality error")
T("gpumodel_a100sxm_trace", None, [["host_sync", "info", "right", None, "busy 0.9999; nothing above low"]], healthy=True, change="unchanged")
T("kineto_v100_resnet50_nw4_1623212756351", True, [
  ["fp32_compute", "medium", "right", None, "unchanged: 99.9% of conv/GEMM time in fp32 kernels"],
  ["step_time_variance", "medium", "right", None, "unchanged: CV 0.18 (ours 0.172), outliers steps 5 and 9"],
  ["cold_start", "low", "wrong", "1", "new: 'A cold first pass: 44.99 ms of GPU idle is one-time cost (1 one-time call, the longest cudaMemcpyAsync 40.00 ms)', kind 'first_launch': the window is ProfilerStep#5-#10 (the profiler skipped steps 1-4), not a first pass; the 39.996 ms cudaMemcpyAsync at +8.556 ms is the pageable HtoD copy of step 5's batch under aten::to (36.5 ms) waiting for the stream, not a kernel's first launch. LOW, so not in the counts"]],
  change="new cold_start low (wrong: a memcpy taken as a first launch in a step-5 window)")
T("switchtransformers_trace", True, [
  ["cold_start", "low", "right", "1", "'161.81 ms of GPU idle is one-time cost (17 one-time calls)': independent: 17 cudaLaunchKernel > 1 ms, each the first launch of its kernel name (490.41 ms), overlap the GPU idle by 132.32 ms; the idle gaps that contain one total 159.84 ms (ti 161.81, +1.2%). Wording: 'the longest cudaLaunchKernel 357.80 ms' is the one at -357.79 ms, before the window"],
  ["gpu_underutilized", "low", "right", None, "was HIGH; 14.08 ms not explained of 185.92 ms idle, capped at low in the cold window"],
  ["launch_bound", "low", "right", None, "was HIGH; 7.34 ms (warm launch waits 13.1 ms by our 20 us rule), capped at low"]],
  true_lever="cold first pass: profile after warm-up; then fp32 sgemm (fp32_compute info)",
  change="gpu_underutilized HIGH + launch_bound HIGH (wrong) -> low; first finding cold_start (right)")
T("tl_h100_owlv2", True, [
  ["dataloader_stall", "high", "right", None, "unchanged: 619.0 ms DataLoader.__next__ over idle recomputed (ti 621.23)"],
  ["attention_unfused", "high", "right", "4", "new: 'softmax over 5185x5185 (16 batch x heads, head size 64) and its matmuls take 89.2% of kernel time (491.75 ms)': independent: kernels launched under aten::softmax on [16,5185,5185] (cunn_SoftMaxForward 262.42 ms) and aten::bmm with a [16,5185,5185] operand or output (cutlass s1688gemm 130.02 + 99.31 ms) = 491.75 ms of 551.45 ms kernel time = 89.17%; no SDPA/flash op"],
  ["host_sync", "info", "right", "10", "was HIGH (wrong, class 10): now info, 13.43 ms"]],
  change="host_sync HIGH (wrong) -> info; new attention_unfused HIGH (right)")
T("tl_h100_timesformer", False, [
  ["attention_unfused", "high", "right", "4", "new, first: T=3137, B*H=96 (softmax on [8,12,3137,3137], 12 calls), head size 64 (Q [8,12,3137,64]); eager kernel time 127.39 ms = cunn_SoftMaxForward 68.689 + the 24 cutlass_75 s1688gemm bf16 GEMMs of the Q@K^T/P@V matmuls 43.208 + the 12 aten::mul (scale) kernels on [8,12,3137,3137] 15.495 = 127.392 ms (82.3% of 154.86 ms kernel time); the q/k/v contiguous copies under aten::matmul (3.27 ms) are left out"],
  ["gpu_underutilized", "high", "right", None, "219.03 ms not explained (ours: the 218.12 ms gap at the step start + the 4.42 ms tail); MEDIUM -> HIGH at 58.6% idle; 'mostly while the host ran .../adapters/pipeline/model.py(40): run_on_input' covers 218.0 of the 218.12 ms gap: the user frame, true; the library frame doing the work is transformers video_classification.py(129) preprocess (217.47 ms: VideoMAE image processor 178.2 ms, read_video_pyav 36.0 ms)"],
  ["gemm_shape_inefficient", "info", "right", "4", "was MEDIUM (wrong: the reference was attention's GEMMs): now info on a 25089x3072x768 GEMM at 722 vs 726 TFLOP/s"]],
  true_lever="CPU preprocessing (VideoMAE image processor) 218 ms of the 382.5 ms step with the GPU idle; then eager attention (attention_unfused what-if: 115.66 ms). The first finding is the second-largest lever: the larger, gpu_underutilized (219 ms), sorts after it",
  change="gemm_shape_inefficient MEDIUM (wrong) -> info; attention_unfused HIGH first (right); gpu_underutilized MEDIUM -> HIGH (right)")
T("tl_mi300_owlv2", True, [
  ["dataloader_stall", "high", "right", None, "unchanged: 703.7 ms recomputed (ti 706.09)"],
  ["attention_unfused", "medium", "right", "4", "new: 249.22 ms = 76.1% of kernel time: independent 249.215 ms of 327.42 ms = 76.11% (cunn_SoftMaxForwardReg 153.70 + Cijk bmm 55.06 + 40.46 ms); MEDIUM at 22.7% of the window"],
  ["host_sync", "info", "right", "3,10", "was MEDIUM '0.00 ms' (wrong): now info, 81 syncs incl. hipMemcpyWithStream, 53.58 ms"]],
  health=[["device name", "right", "3", "fixed: device 2 taken as deviceProperties entry 0 (AMD Instinct MI300X VF), with a warning"]],
  change="host_sync MEDIUM (wrong) -> info; attention_unfused MEDIUM (right); device named")
T("tl_mi300_qwen05b", True, [["elementwise_heavy", "low", "right", None, "unchanged"]],
  health=[["device name", "right", "3", "fixed"], ["window", "right", None, "unchanged"]], change="device named")
T("tl_sglang_qwen3_prefilldecode", None, [
  ["host_sync", "high", "wrong", "7,15", "new, first: '5 host syncs leave the GPU idle 493.92 ms; most from aten::to', causal chain 'a sync blocked the host until the queue drained ... the GPU ran out of queued work and idled 493.28 ms'. The 493.208 ms hipMemcpyWithStream at +0.092 ms (correlation 91058) is a 60-byte HtoD input copy (kind 1; its Memcpy HtoD runs 4.686 us at +493.294 ms) under aten::to/_to_copy/copy_ from torch.tensor() inside a torch.device context (forward_batch_info.py(443)); no queue drained: resolve_future_token_ids_kernel, launched at +0.043 ms (correlation 91056), sat queued on stream 3 until +493.287 ms behind the hipStreamWaitEvent issued at +0.022 ms (correlation 91054), whose event's producer is not in the trace. So: not a read-back sync (input_copy_sync_count 0, yet it is an H2D .to(device) copy: sync_input_copy's case), the advice 'remove .item()/.cpu()' does not apply, and removing the host block would not return the 493 ms (the stream still waits on the event)"],
  ["gpu_underutilized", "info", "right", None, "0.11 ms left unexplained: fine"]],
  health=[["data_quality duration_invalid", "right", "6", "fixed: no data-quality error"], ["device name", "right", "3", "fixed: device 9 -> entry 0 (AMD Instinct MI300X)"]],
  true_lever="unknowable from this trace: the first 493 ms the stream waits (hipStreamWaitEvent at +0.022 ms) on an event recorded outside the trace while the host blocks in a 60-byte HtoD hipMemcpyWithStream; excluded from the lever count (was counted 'no')",
  change="gpu_underutilized INFO 'not explained' -> host_sync HIGH with the wrong mechanism and advice; duration_invalid and device name fixed")
T("tl_sglang_bs32_capture", False, [
  ["allocator_churn", "low", "wrong", "5", "new first finding: '0.0 cudaMalloc and 2.0 cudaFree per step (the cache released between ops, as empty_cache() does) cost 0.48 ms' on a capture phase: 2 hipFree (named cudaFree) in capture_32_DECODE; 'per step' for a phase that is not a step; it outranks graph_capture (info), which is the right first answer"],
  ["graph_capture", "info", "right", "5", "new: 'A graph capture phase: 33.71 ms of GPU idle while launches were captured, not run' (399 hipLaunchKernel + 145 hipExtModuleLaunchKernel captured, 2 real kernels)"],
  ["gpu_underutilized", "info", "right", "5", "was HIGH (wrong): now info"]],
  health=[["device name", "right", "3", "fixed"]],
  change="gpu_underutilized HIGH (wrong) -> info; graph_capture info; first finding allocator_churn low")
T("tl_vllm_piecewise_capture", True, [
  ["graph_capture", "info", "right", "5", "new, first: 54.33 ms of GPU idle while launches were captured (capture_8192_PIECEWISE)"],
  ["gpu_underutilized", "info", "right", "5", "was HIGH (wrong): now info"]],
  true_lever="none: capture phase; graph_capture first says so", change="gpu_underutilized HIGH (wrong) -> info; graph_capture first")
T("tl_vllm_piecewise_exec", None, [["h2d_not_overlapped", "info", "right", None, "unchanged: busy 0.9976"]], healthy=True, change="unchanged")
T("tl_xdit_flux_aiter_sage", None, [["launch_bound", "info", "right", None, "unchanged: busy 0.8067"]], health=[["device name", "right", "3", "fixed"]], healthy=True, change="device named")
T("tl_xdit_sd35", True, [
  ["launch_bound", "medium", "right", None, "unchanged: ti 278.72 ms, ours 392 ms"],
  ["gpu_underutilized", "medium", "right", None, "unchanged id/severity: busy 0.5962; 193.62 ms not explained"]],
  health=[["device name", "right", "3", "fixed"]], change="device named")
T("tl_normalization_test", True, [
  ["cold_start", "low", "right", "1", "new, first: '988.80 ms of GPU idle is one-time cost (15 one-time calls, the longest hipLaunchKernel 331.63 ms)': independent: 13 first-time launches > 1 ms + hipModuleLoadData calls (1093.18 ms of calls) overlap 981.82 ms of the 1067.76 ms idle; the idle gaps containing one total 1008.38 ms (ti -1.9%)"],
  ["gpu_underutilized", "low", "right", None, "76.45 ms unexplained of 1067.76 ms, capped at low"],
  ["launch_bound", "info", "right", None, "was HIGH 991 ms (wrong): now 2.52 ms at info (warm launch waits 9.4 ms by our rule)"]],
  true_lever="none: cold first launches; cold_start first says so", change="launch_bound HIGH (wrong) -> info; cold_start first (right)")
T("tl_mi300_ddp_resnet18", True, [
  ["allocator_churn", "high", "right", "2", "new, first: '2756 cudaMalloc/cudaFree calls take 3356.66 ms of host time and leave the GPU idle 3025.63 ms': independent: 2756 hipMalloc/hipFree calls inside the 3391.35 ms GPU span (of 1460 + 1360), 3356.658 ms of host time (exact), their union overlaps 3007.56 ms of the 3032.41 ms idle (ti +0.6%). Wording: the calls are hipMalloc/hipFree, named cudaMalloc/cudaFree"],
  ["gpu_underutilized", "info", "right", "2", "was HIGH 'mostly while the host ran aten::conv2d' (wrong): 1.43 ms unexplained now"]],
  true_lever="allocator: hipFree/hipMalloc (caching allocator off) 3346 ms of 3391 ms; allocator_churn first says so", change="gpu_underutilized HIGH (wrong) -> info; allocator_churn HIGH first (right)")
T("tl_nv_moe02", True, [["elementwise_heavy", "low", "right", None, "unchanged"]], health=[["device spec", "unsure", None, "unchanged: B300 not in the spec table"]], change="unchanged")
T("dlprof_nsys_profile", False, [
  ["host_sync", "low", "wrong", "1", "still first: '28 host syncs leave the GPU idle 3.39 ms; most from conv2d' (was HIGH): the 28 sync calls overlap 0.905 ms of the 4.97 ms idle (cudaEventSynchronize 0.866 ms: cuDNN algorithm search); LOW now, the op name is fixed ('conv2d', not the NVTX dict), the 3.39 ms is not"],
  ["gpu_underutilized", "low", "right", "1", "was MEDIUM (wrong): low in a cold window"],
  ["cold_start", "info", "unsure", "1", "'part of a first pass (48 one-time calls, the longest cudaStreamCreateWithPriority 0.19 ms)': right that it is a first pass, but info and last; setup/alloc calls overlap 0.24 + 0.64 ms of idle"]],
  health=[["op labels", "right", "11", "fixed: 'most from conv2d'"]],
  change="host_sync HIGH -> low (number still wrong), gpu_underutilized MEDIUM -> low, NVTX labels fixed")
T("unschlagbar_prof", None, [
  ["gpu_underutilized", "info", "right", "6", "was HIGH (wrong): disowned by the data-quality error"],
  ["pageable_memcpy", "info", "unsure", "6", "was MEDIUM (right): 135 pageable cuMemcpyHtoDAsync, 216.8 MB, 40.96 ms host time are recorded correctly; demoted to info because data_quality device_activity_missing lists it as affected. The copies' host cost does not depend on the missing kernels: a right finding lost"]],
  health=[["missing kernel table", "right", "6", "fixed: data_quality error device_activity_missing '540 copies/memsets were recorded but no kernel, while 4 module loads were traced'"]],
  change="gpu_underutilized HIGH (wrong) -> info; missing kernels reported; pageable_memcpy MEDIUM (right) -> info")
T("flowmatching_rtx3090_trace", None, [["host_sync", "info", "right", None, "unchanged"]], health=[["no GPU activity", "right", None, "unchanged"]], change="unchanged")
T("tritonserver_chrome_trace", None, [], [["format detection", "right", "12", "fixed: refused, exit 2 'not a PyTorch profiler (Kineto) trace: 2,000 Chrome-trace events, no duration event of a profiler category'"]], change="now refused")
T("part_a100_gpu_working", True, [
  ["cold_start", "low", "right", "1", "new, first: '1346.66 ms of GPU idle is one-time cost (1 call, cudaLaunchKernel 1337.13 ms)': independent: the 1337.13 ms first cudaLaunchKernel at +384.56 ms overlaps 1337.12 ms of idle; its gap is 1344.22 ms (ti +0.2%)"],
  ["gpu_underutilized", "low", "right", "13", "was MEDIUM 'mostly while the host ran aten::contiguous' (wrong): now '367.39 ms ... mostly outside any recorded op', low in the cold window"],
  ["launch_bound", "info", "right", "1", "was HIGH 1346.31 ms (wrong): 0.77 ms at info"]],
  true_lever="none: a cold first pass; cold_start first says so", change="launch_bound HIGH + gpu_underutilized MEDIUM (wrong) -> info/low; cold_start first")
T("part_a100_fwd_bs2", True, [["launch_bound", "high", "right", None, "unchanged: 25.21 ms (ours 27.2 ms of 32.3 ms)"]], change="unchanged")
T("part_a100_fwd_bs128", True, [
  ["attention_unfused", "high", "wrong", "14", "new, first. The lever is real, the size is not: 'softmax over 128x128 scores (1024 batch x heads) and its matmuls take 47.0% of kernel time (12.11 ms, 179 kernels)'. Independent: the ops on the [1024,128,128] score tensor (aten::baddbmm Q@K^T+bias 0.676 ms GEMM + 1.148 ms copy, aten::softmax 1.135 ms, aten::bmm P@V 0.555 ms GEMM + 1.154 ms copy, the mask aten::add [1024,128,128]+[1024,1,128] 1.737 ms, the need_weights aten::mean over [128,8,128,128] 0.620 ms) launch 7.03 ms = 27.3% of 25.75 ms kernel time. The other ~5.1 ms come from ops on [128 particles, 128 batch, 128 embed] activations that only look like T x T: aten::native_layer_norm [128,128,128] 1.929 ms, aten::linear [128,128,128] 0.666 + 0.522 ms, aten::copy_ [128,128,128] 0.706 ms, aten::add_ 0.452 ms, aten::copy_ [3,128,128,128] 0.450 ms, aten::mul [128],[128,128,128] 0.202 ms. Head size also recordable (baddbmm [1024,128,16] x [1024,16,128]: 16) but reported unknown"]],
  true_lever="eager attention in nn.MultiheadAttention (need_weights=True path: baddbmm + softmax + bmm + weights mean on [1024,128,128]), 7.0 ms = 27% of kernel time at 85.7% busy -> need_weights=False lets PyTorch use SDPA. The before audit called this trace healthy: wrong, its fact sheet counted only the softmax kernel (1.16 ms)",
  change="was 'healthy' (elementwise_heavy low first); attention_unfused HIGH first: the right lever with an overstated size (12.11 vs 7.03 ms)")
assert set(A) == set(B), set(B) ^ set(A)
out = {"_doc": "Audit verdicts on the 'after' traceinsight (main @ 85af646) over the same 29 foreign traces (see AUDIT.md, 'After'). Same format as verdicts.json: each finding [id, severity, verdict, class, reason]; every changed or new high/medium finding and every trace's first finding re-judged against the raw events (check_kineto.py, check_nsys.py, check_after.py). lever: whether the FIRST finding is the largest lever (null = healthy, no GPU data, data-quality error, or unknowable). change: what moved since the before run.", "traces": {k: A[k] for k in B}}
json.dump(out, open('verdicts_after.json', 'w'), indent=1)
print('ok')
