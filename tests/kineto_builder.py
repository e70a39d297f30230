"""Writes small Kineto-shaped traces for the analyzer's tests: ProfilerStep#N spans, CPU ops and
annotations, runtime calls linked to kernels, copies and memsets by correlation id (with the ac2g
flow events Kineto writes), [memory] events and deviceProperties, in any of three category
vocabularies. Times are µs; integral times are written as JSON integers, others as floats (as
Kineto does since it records ns precision)."""
from __future__ import annotations

import gzip
import json
from dataclasses import dataclass, field
from pathlib import Path

# Category names by role, per vocabulary: Kineto in 2021, Kineto now, and what our harness writes
# for the TensorBoard plugin (common/tensorboard_compat.py rewrites the current names: only the
# DataLoader spans user_annotation -> cpu_op, runtime and driver calls -> Runtime, the GPU copies
# of ProfilerStep#N gpu_user_annotation -> gpu_profiler_step, fwdbwd flows -> forward_backward
# (the builder writes none); ProfilerStep#N and our regions such as "forward" stay
# user_annotation, operators cpu_op, Python functions python_function).
VOCABULARIES = {
    "2021": dict(step="Operator", annotation="Operator", dataloader="Operator", op="Operator",
                 python="python_function", runtime="Runtime", driver="Runtime", kernel="Kernel",
                 memcpy="Memcpy", memset="Memset", gpu_annotation=None, flow=None),
    "current": dict(step="user_annotation", annotation="user_annotation",
                    dataloader="user_annotation", op="cpu_op", python="python_function",
                    runtime="cuda_runtime", driver="cuda_driver", kernel="kernel",
                    memcpy="gpu_memcpy", memset="gpu_memset", gpu_annotation="gpu_user_annotation",
                    flow="ac2g"),
    "tensorboard": dict(step="user_annotation", annotation="user_annotation", dataloader="cpu_op",
                        op="cpu_op", python="python_function", runtime="Runtime",
                        driver="Runtime", kernel="kernel", memcpy="gpu_memcpy",
                        memset="gpu_memset", gpu_annotation="gpu_profiler_step", flow="ac2g"),
}
MB = 10 ** 6  # the analyzer's MB: decimal, as in every output
H100_NAME = "NVIDIA H100 80GB HBM3"
H100_MEMORY_BYTES = 85_520_809_984  # totalGlobalMem Kineto reports for an H100 SXM 80 GB

# Kernel names as cuBLAS/cuDNN/PyTorch write them.
BF16_GEMM = ("sm80_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x32_stage4_"
             "warpsize2x2x1_tensor16x8x16_kernel")
FP32_GEMM = "ampere_sgemm_128x64_tn"
# cuBLAS nvjet kernels (Hopper), their types after "nvjet_": t bf16, h fp16, s FP32 (names as
# they appear in public H100 profiles).
NVJET_GEMM = "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NTT"  # bf16
NVJET_FP16_GEMM = "nvjet_hsh_256x128_64x4_2x1_v_bz_TNN"
NVJET_FP32_GEMM = "nvjet_sss_128x128_64x4_1x2_h_bz_TNT"  # plain FP32: CUDA cores
NVJET_TF32_GEMM = "nvjet_sss_tf32_128x256_TNT"  # FP32 tensors, TF32 tensor-core math
# FlashAttention 2 as PyTorch builds it (scaled_dot_product_attention), bf16 forward and fp16
# backward: the types are C++ names, not tags.
FLASH_BF16_FWD = ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<64, "
                  "128, 128, 4, false, false, cutlass::bfloat16_t, pytorch_flash::Flash_kernel_"
                  "traits<64, 128, 128, 4, cutlass::bfloat16_t> >, false, true, false, false, "
                  "true, true, false>(pytorch_flash::Flash_fwd_params)")
FLASH_FP16_BWD = ("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<pytorch_flash::"
                  "Flash_bwd_kernel_traits<64, 128, 128, 8, 2, 4, 2, false, false, cutlass::half_t,"
                  " pytorch_flash::Flash_kernel_traits<64, 128, 128, 8, cutlass::half_t> >, true, "
                  "false, false, false, false, false>(pytorch_flash::Flash_bwd_params)")
ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add"
               "<float>, at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>, "
               "at::detail::Array<char*, 3>)")


def number(value: float):
    value = float(value)
    return int(value) if value.is_integer() else value


@dataclass
class KinetoTrace:
    vocabulary: str = "current"
    cpu_pid: int = 4242
    gpu_pid: int = 0  # Kineto puts a GPU's events under pid = device index
    stream: int = 7
    events: list = field(default_factory=list)
    device_properties: list = field(default_factory=list)
    # A real trace's correlation ids count every API call since the process began: ids below
    # its first call's belong to calls made before the recording (idle_causes.unrecorded_work).
    next_correlation: int = 1000

    def category(self, role: str) -> str | None:
        return VOCABULARIES[self.vocabulary][role]

    def span(self, role: str, name: str, ts: float, dur: float, pid=None, tid=None, **args):
        self.events.append({"ph": "X", "cat": self.category(role), "name": name,
                            "pid": self.cpu_pid if pid is None else pid,
                            "tid": self.cpu_pid if tid is None else tid,
                            "ts": number(ts), "dur": number(dur), "args": args})

    def step(self, number_: int, ts: float, dur: float) -> None:
        """ProfilerStep#N on the CPU, and its copy on the GPU timeline where Kineto writes one."""
        self.span("step", f"ProfilerStep#{number_}", ts, dur)
        if self.category("gpu_annotation"):
            self.span("gpu_annotation", f"ProfilerStep#{number_}", ts, dur, pid=self.gpu_pid,
                      tid=self.stream)

    def annotation(self, name: str, ts: float, dur: float) -> None:
        self.span("annotation", name, ts, dur)

    def op(self, name: str, ts: float, dur: float, tid=None) -> None:
        """An operator span; `tid`: another CPU thread (autograd's backward thread, say)."""
        self.span("op", name, ts, dur, tid=tid)

    def op_with_shapes(self, name: str, ts: float, dur: float, input_dims: list) -> None:
        """An operator recorded with record_shapes=True: its "Input Dims"."""
        self.span("op", name, ts, dur, **{"Input Dims": input_dims})

    def python(self, name: str, ts: float, dur: float) -> None:
        """A Python function span (with_stack=True), e.g. "nn.Module: Linear_0"."""
        self.span("python", name, ts, dur)

    def dataloader(self, ts: float, dur: float,
                   iterator: str = "_SingleProcessDataLoaderIter") -> None:
        """A DataLoader's __next__: `iterator` names where its batches are made, in the training
        process or (_MultiProcessingDataLoaderIter) in worker processes."""
        self.span("dataloader", f"enumerate(DataLoader)#{iterator}.__next__", ts, dur)

    def runtime(self, name: str, ts: float, dur: float, role: str = "runtime", tid=None) -> int:
        correlation = self.next_correlation
        self.next_correlation += 1
        self.span(role, name, ts, dur, tid=tid, correlation=correlation)
        return correlation

    def gpu_event(self, role: str, name: str, ts: float, dur: float, correlation: int,
                  launch_ts: float) -> None:
        self.span(role, name, ts, dur, pid=self.gpu_pid, tid=self.stream, device=self.gpu_pid,
                  stream=self.stream, correlation=correlation)
        if self.category("flow"):  # the runtime -> GPU arrow
            for phase, pid, at in (("s", self.cpu_pid, launch_ts), ("f", self.gpu_pid, ts)):
                self.events.append({"ph": phase, "id": correlation, "pid": pid, "tid": pid,
                                    "ts": number(at), "cat": self.category("flow"),
                                    "name": self.category("flow"), "bp": "e"})

    def launch(self, ts: float, dur: float, kernel_ts: float, kernel_dur: float,
               name: str = ELEMENTWISE, api: str = "cudaLaunchKernel") -> int:
        role = "driver" if api.startswith("cu") and not api.startswith("cuda") else "runtime"
        correlation = self.runtime(api, ts, dur, role=role)
        self.gpu_event("kernel", name, kernel_ts, kernel_dur, correlation, ts)
        return correlation

    def graph_launch(self, ts: float, dur: float, kernels: list[tuple[float, float]],
                     name: str = ELEMENTWISE, api: str = "cudaGraphLaunch", tid=None) -> int:
        """A CUDA graph replay: one `api` call (cudaGraphLaunch, cuGraphLaunch, hipGraphLaunch)
        and the graph's kernels, (start, duration) each, all with its correlation id, as CUPTI
        writes them."""
        role = "driver" if api.startswith("cu") and not api.startswith("cuda") else "runtime"
        correlation = self.runtime(api, ts, dur, role=role, tid=tid)
        for kernel_ts, kernel_dur in kernels:
            self.gpu_event("kernel", name, kernel_ts, kernel_dur, correlation, ts)
        return correlation

    def region(self, name: str, ts: float, dur: float, tid=None) -> None:
        """A record_function range (user_annotation in the current vocabulary), on thread `tid`
        (the CPU pid's main thread by default)."""
        self.span("annotation", name, ts, dur, tid=tid)

    def memcpy(self, ts: float, dur: float, gpu_ts: float, gpu_dur: float,
               kind: str = "HtoD", host_memory: str = "Pageable", api: str = "cudaMemcpyAsync",
               tid=None) -> int:
        """A copy: the runtime call `api` and the GPU's copy, named as Kineto names it; the host
        side is `host_memory`: Pageable, Pinned, or Host (ROCm's word for either)."""
        correlation = self.runtime(api, ts, dur, tid=tid)
        source, target = {"HtoD": (host_memory, "Device"), "DtoH": ("Device", host_memory),
                          "DtoD": ("Device", "Device")}[kind]
        self.gpu_event("memcpy", f"Memcpy {kind} ({source} -> {target})", gpu_ts, gpu_dur,
                       correlation, ts)
        return correlation

    def cuda_sync(self, kind: str, ts: float, dur: float, correlation: int) -> None:
        """A cuda_sync event (current Kineto): a sync recorded on the GPU's row, kind "Stream
        Sync", "Event Sync", "Context Sync" or "Stream Wait Event", with the correlation id of
        the runtime call that made it."""
        self.events.append({"ph": "X", "cat": "cuda_sync", "name": kind, "pid": self.gpu_pid,
                            "tid": self.stream, "ts": number(ts), "dur": number(dur),
                            "args": {"cuda_sync_kind": kind, "stream": self.stream,
                                     "correlation": correlation, "device": self.gpu_pid}})

    def memset(self, ts: float, dur: float, gpu_ts: float, gpu_dur: float) -> None:
        correlation = self.runtime("cudaMemsetAsync", ts, dur)
        self.gpu_event("memset", "Memset (Device)", gpu_ts, gpu_dur, correlation, ts)

    def memory(self, ts: float, total_allocated_bytes: int, device_type: int) -> None:
        self.events.append({"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]",
                            "pid": self.cpu_pid, "tid": self.cpu_pid, "ts": number(ts),
                            "args": {"Total Reserved": 0, "Total Allocated": total_allocated_bytes,
                                     "Bytes": 0, "Device Id": 0 if device_type else -1,
                                     "Device Type": device_type, "Addr": 0}})

    def gpu(self, name: str = H100_NAME, total_memory_bytes: int = H100_MEMORY_BYTES) -> None:
        self.device_properties.append({"id": len(self.device_properties), "name": name,
                                       "totalGlobalMem": total_memory_bytes,
                                       "computeMajor": 9, "computeMinor": 0})

    def to_json(self) -> dict:
        meta = [{"ph": "M", "name": "process_name", "pid": self.cpu_pid, "tid": 0,
                 "args": {"name": "python"}}]
        return {"schemaVersion": 1, "deviceProperties": self.device_properties,
                "displayTimeUnit": "ms", "traceEvents": meta + self.events}

    def write(self, path: Path, compress: bool = False) -> Path:
        text = json.dumps(self.to_json()).encode()
        Path(path).write_bytes(gzip.compress(text) if compress else text)
        return Path(path)


def simulate_training(trace: KinetoTrace, *, steps: int = 3, start: float = 1_000_000.0,
                      kernels_per_step: int = 20, kernel_us: float = 200.0,
                      kernel_name: str = BF16_GEMM, launch_us: float = 5.0,
                      launch_gap_us: float = 10.0, gpu_latency_us: float = 3.0,
                      dataloader_us: float = 0.0, h2d_us: float = 0.0, syncs_per_step: int = 0,
                      after_sync_us: float = 0.0, peak_memory_bytes: int = 0,
                      input_batch: int | None = None, backward: bool = False) -> KinetoTrace:
    """Lay out `steps` training steps the way a CUDA stream runs them: the host launches a kernel
    every `launch_gap_us`; each kernel starts `gpu_latency_us` after its launch or when the one
    before it ends. A sync makes the host wait for the GPU, then spend `after_sync_us` before its
    next launch. Memory rises to `peak_memory_bytes` in each step and falls back. `input_batch`:
    each step starts with an aten::linear whose "Input Dims" (record_shapes) hold that batch.
    `backward`: each step holds a "backward" region (a training step; without, inference)."""
    host = start
    gpu_free = start
    for number_ in range(1, steps + 1):
        step_start = host
        if input_batch is not None:
            trace.op_with_shapes("aten::linear", host, 1, [[input_batch, 256], [256, 256], [256]])
        if backward:
            trace.annotation("backward", host + 1, 1)
        if dataloader_us:
            trace.dataloader(host, dataloader_us)
            host += dataloader_us
        if h2d_us:
            trace.memcpy(host, launch_us, max(host + gpu_latency_us, gpu_free), h2d_us)
            gpu_free = max(host + gpu_latency_us, gpu_free) + h2d_us
            host += launch_gap_us
        sync_every = kernels_per_step // syncs_per_step if syncs_per_step else 0
        for index in range(kernels_per_step):
            kernel_start = max(host + gpu_latency_us, gpu_free)
            trace.launch(host, launch_us, kernel_start, kernel_us, name=kernel_name)
            gpu_free = kernel_start + kernel_us
            host += launch_gap_us
            if sync_every and (index + 1) % sync_every == 0:
                sync_end = max(host + 1.0, gpu_free + 1.0)
                trace.runtime("cudaStreamSynchronize", host, sync_end - host)
                host = sync_end + after_sync_us
        if peak_memory_bytes:
            trace.memory(step_start + 1, peak_memory_bytes // 4, 1)
            trace.memory(host - 1, peak_memory_bytes, 1)
            trace.memory(host, peak_memory_bytes // 4, 1)
        trace.step(number_, step_start, host - step_start)
    return trace


def write_demo_run(out: Path, demo: str, variant: str, built: KinetoTrace, *,
                   samples_per_s: float, peak_memory_mb: float | None,
                   created_utc: str = "2025-01-01T00:00:00+00:00", batch_size: int = 64,
                   notes: list[str] | None = None) -> Path:
    """<out>/<demo>/<variant>/ as a demo script leaves it: a gzip trace and summary.json (the
    fields compare and the report read; the numbers are the caller's)."""
    run_dir = Path(out) / demo / variant
    run_dir.mkdir(parents=True, exist_ok=True)
    trace_name = f"{demo}_{variant}.1.pt.trace.json.gz"
    built.write(run_dir / trace_name, compress=True)
    summary = {"demo": demo, "variant": variant, "device": "cuda", "device_name": H100_NAME,
               "torch_version": "2.6.0", "preset": "cuda", "batch_size": batch_size,
               "steps": 30, "samples_per_s": samples_per_s,
               "step_ms_p50": 1000 * batch_size / samples_per_s,
               "step_ms_p95": 1.1 * 1000 * batch_size / samples_per_s,
               "peak_memory_mb": peak_memory_mb, "config": {}, "trace_file": trace_name,
               "created_utc": created_utc, "notes": notes or []}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return run_dir
