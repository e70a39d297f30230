"""A small GPU training trace shaped like the ones current PyTorch writes on a CUDA machine, for
tests that cannot make a real one (no GPU here).

Each step, on the CPU thread: the DataLoader span, a host-to-device copy, a linear layer (addmm)
and a ReLU in "forward", an optimizer update; every CUDA call is cuda_runtime (cudaLaunchKernel,
cudaMemcpyAsync) or cuda_driver (cuLaunchKernel, as for Triton kernels) with a correlation id, and
each kernel or copy on GPU stream 7 carries the same correlation id and an ac2g flow from its
launch. As Kineto does, the step marker ProfilerStep#N is repeated as a gpu_user_annotation over the
step's GPU work. The GPU runs behind: every kernel starts after the step's last launch, so no CUDA
call overlaps GPU work and the plugin's Runtime share is exactly the calls' total duration.
"""
from __future__ import annotations

CPU_PID = 4242  # the training process
GPU_PID = 0  # Kineto puts device 0's streams in "process" 0
STREAM = 7  # the default stream's id in CUPTI traces
BASE_US = 1_700_000_000_000.0  # an epoch-like start, as in real traces (µs)
FIRST_STEP = 2  # as torch.profiler.schedule(wait=1, warmup=1) numbers its first recorded step

# Kernel names as CUPTI reports them. The fp16 GEMM name contains "xmma_gemm", which the plugin's
# allowlist counts as a Tensor Core kernel; the fp32 one (a cuBLAS SIMT GEMM) does not.
GEMM_FP16 = "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_kernel"
GEMM_FP32 = "ampere_sgemm_128x64_nn"
RELU_KERNEL = ("void at::native::vectorized_elementwise_kernel<4, at::native::(anonymous namespace)"
               "::launch_clamp_scalar(at::TensorIteratorBase&, c10::Scalar, c10::Scalar, "
               "at::native::detail::ClampLimits)::{lambda()#1}::operator()() const, "
               "at::detail::Array<char*, 2> >(int, float, at::detail::Array<char*, 2>)")
SGD_KERNEL = "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<float>(...)"

# One step, in µs from the step's start: (start, end) of each piece.
STEP_US = 1000.0
DATALOADER_US = (1.0, 301.0)  # the step marker opens first
COPY_CALL_US = (303.0, 315.0)  # cudaMemcpyAsync
COPY_GPU_US = (316.0, 330.0)
GEMM_LAUNCH_US = (340.0, 350.0)  # cudaLaunchKernel from aten::addmm
RELU_LAUNCH_US = (520.0, 530.0)  # cuLaunchKernel (cuda_driver) from aten::relu
SGD_LAUNCH_US = (715.0, 725.0)  # cudaLaunchKernel from aten::add_
GEMM_GPU_US = (730.0, 930.0)
RELU_GPU_US = (930.0, 980.0)
SGD_GPU_US = (980.0, 995.0)


def length(span: tuple[float, float]) -> float:
    return span[1] - span[0]


# What the TensorBoard plugin should report per step for this trace, derived from the layout.
STEP_DATALOADER_US = length(DATALOADER_US)
STEP_RUNTIME_US = sum(map(length, (COPY_CALL_US, GEMM_LAUNCH_US, RELU_LAUNCH_US, SGD_LAUNCH_US)))
STEP_MEMCPY_US = length(COPY_GPU_US)
STEP_KERNEL_US = sum(map(length, (GEMM_GPU_US, RELU_GPU_US, SGD_GPU_US)))
GEMM_SHARE_OF_KERNEL_TIME = length(GEMM_GPU_US) / STEP_KERNEL_US


def gpu_training_trace(steps: int = 3, gemm_kernel: str = GEMM_FP32) -> dict:
    """The trace as torch.profiler writes it (before any rewrite)."""
    events: list[dict] = [
        {"ph": "M", "name": "process_name", "pid": CPU_PID, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_name", "pid": GPU_PID, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "pid": GPU_PID, "tid": 0,
         "args": {"labels": "GPU 0"}},
        {"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans",
         "tid": "PyTorch Profiler", "ts": BASE_US - 50, "dur": steps * STEP_US + 100,
         "args": {"Op count": 0}},
    ]
    ids = iter(range(1, 1_000_000))  # External ids and correlation ids, unique in the trace

    def span(category: str, name: str, start: float, dur: float, pid=CPU_PID, tid=CPU_PID,
             **args) -> dict:
        event = {"ph": "X", "cat": category, "name": name, "pid": pid, "tid": tid,
                 "ts": round(start, 3), "dur": round(dur, 3), "args": args}
        events.append(event)
        return event

    def launched(op_external_id: int, call: str, call_category: str, call_span, gpu_category: str,
                 gpu_name: str, gpu_span, t0: float) -> None:
        correlation = next(ids)
        call_start = t0 + call_span[0]
        gpu_start = t0 + gpu_span[0]
        span(call_category, call, call_start, length(call_span), **{
            "External id": op_external_id, "correlation": correlation})
        span(gpu_category, gpu_name, gpu_start, length(gpu_span), pid=GPU_PID, tid=STREAM, **{
            "External id": op_external_id, "correlation": correlation, "device": 0,
            "stream": STREAM, "context": 1, "grid": [132, 1, 1], "block": [256, 1, 1],
            "blocks per SM": 1.0, "est. achieved occupancy %": 25})
        events.append({"ph": "s", "id": correlation, "pid": CPU_PID, "tid": CPU_PID,
                       "ts": round(call_start, 3), "cat": "ac2g", "name": "ac2g"})
        events.append({"ph": "f", "id": correlation, "pid": GPU_PID, "tid": STREAM,
                       "ts": round(gpu_start, 3), "cat": "ac2g", "name": "ac2g", "bp": "e"})

    for index in range(steps):
        t0 = BASE_US + index * STEP_US
        step_name = f"ProfilerStep#{FIRST_STEP + index}"
        step_id = next(ids)
        span("user_annotation", step_name, t0, STEP_US, **{"External id": step_id})
        span("gpu_user_annotation", step_name, t0 + COPY_GPU_US[0] - 1,
             SGD_GPU_US[1] - COPY_GPU_US[0] + 1, pid=GPU_PID, tid=STREAM,
             **{"External id": step_id})
        span("user_annotation", "data", t0 + 0.5, 335, **{"External id": next(ids)})
        span("user_annotation", "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
             t0 + DATALOADER_US[0], length(DATALOADER_US), **{"External id": next(ids)})
        copy_id = next(ids)
        span("cpu_op", "aten::copy_", t0 + COPY_CALL_US[0] - 1, length(COPY_CALL_US) + 2,
             **{"External id": copy_id})
        launched(copy_id, "cudaMemcpyAsync", "cuda_runtime", COPY_CALL_US, "gpu_memcpy",
                 "Memcpy HtoD (Pinned -> Device)", COPY_GPU_US, t0)
        span("user_annotation", "forward", t0 + 336, 364, **{"External id": next(ids)})
        linear_id, addmm_id = next(ids), next(ids)
        span("cpu_op", "aten::linear", t0 + 337, 170, **{"External id": linear_id})
        span("cpu_op", "aten::addmm", t0 + 338, 160, **{"External id": addmm_id})
        launched(addmm_id, "cudaLaunchKernel", "cuda_runtime", GEMM_LAUNCH_US, "kernel",
                 gemm_kernel, GEMM_GPU_US, t0)
        relu_id = next(ids)
        span("cpu_op", "aten::relu", t0 + 510, 100, **{"External id": relu_id})
        launched(relu_id, "cuLaunchKernel", "cuda_driver", RELU_LAUNCH_US, "kernel",
                 RELU_KERNEL, RELU_GPU_US, t0)
        span("user_annotation", "optimizer", t0 + 705, 250, **{"External id": next(ids)})
        add_id = next(ids)
        span("cpu_op", "aten::_foreach_add_", t0 + 710, 50, **{"External id": add_id})
        launched(add_id, "cudaLaunchKernel", "cuda_runtime", SGD_LAUNCH_US, "kernel",
                 SGD_KERNEL, SGD_GPU_US, t0)
    return {
        "schemaVersion": 1,
        "deviceProperties": [{
            "id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 85_029_158_912,
            "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024,
            "maxThreadsPerMultiprocessor": 2048, "regsPerBlock": 65536, "warpSize": 32,
            "sharedMemPerBlock": 49152, "numSms": 132, "regsPerMultiprocessor": 65536,
            "sharedMemPerBlockOptin": 232448, "sharedMemPerMultiprocessor": 233472}],
        "displayTimeUnit": "ms",
        "traceEvents": events,
    }
