"""Facts of the device a run is on, and the settings it needs: the CPU's name and BF16 units, a
GPU's dense BF16 peak (for model-FLOPs utilisation), TF32, and what torch.compile and CUDA
graphs need to work as the fix means them to."""
from __future__ import annotations

import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import torch

from common import presets, trace
from common.runs import Run, clear_run_dir, fail

# Kineto's log levels run VERBOSE 0 .. ERROR 4, USDT 5. On a machine with no GPU the CUDA build of
# Kineto logs "gpuGetDeviceCount failed" as an ERROR at every profile, harmless but alarming, and
# torch 2.14's writes "USDT: ... profiler_start" and "profiler_stop" at level 5: 6 hides both.
KINETO_LOG_LEVEL_CPU = "6"
# /proc/cpuinfo flags of CPUs that run BF16 matmuls in hardware (oneDNN uses them): AMX tiles
# (Intel Sapphire Rapids and later), AVX-512 BF16 dot products (Cooper Lake, AMD Zen 4), and "bf16"
# in an Arm CPU's Features line (Neoverse V1, Graviton3). Without any, BF16 is emulated in FP32.
CPU_NATIVE_BF16_FLAGS = ("amx_bf16", "avx512_bf16", "bf16")
# Only AMX's tile units multiply BF16 faster than the FP32 units: AVX-512 BF16 dot products alone
# measured 0.68x (BF16 slower) on this project's mixed_precision pair, AMX 1.8x.
CPU_BF16_MATRIX_UNIT_FLAG = "amx_bf16"
CPUINFO_PATH = Path("/proc/cpuinfo")

# Dense BF16 tensor-core peak (TFLOPS, no sparsity) of GPUs by a model name in their device name,
# the more specific first; from NVIDIA's datasheets (H100 SXM5 989.4, H100 NVL 835, H100 PCIe 756,
# H200 989.4, H200 NVL 835, GH200 989.4, B200 2250, GB200 2500 a GPU, A100 312, L40S 362, L40 181,
# L4 121). A run that records its model FLOPs (run.config["model_tflop_per_step"]) reports the
# share of this peak it reached: what is called model-FLOPs utilisation (MFU). A GPU not listed
# gets achieved TFLOPS only. Names match as whole words: "L4" is not "L40", "H200" not "GH200".
BF16_DENSE_PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4),
                          ("H200 NVL", 835.0), ("GH200", 989.4), ("H200", 989.4),
                          ("GB200", 2500.0), ("B200", 2250.0), ("A100", 312.0),
                          ("L40S", 362.0), ("L40", 181.0), ("L4", 121.0))


def bf16_peak_tflops(device_name: str) -> float | None:
    return next((peak for key, peak in BF16_DENSE_PEAK_TFLOPS
                 if re.search(rf"\b{re.escape(key)}\b", device_name)), None)


def flops_achieved(run: Run, step_ms_p50: float) -> dict:
    """Achieved TFLOPS at the timed step p50, and its share of the GPU's BF16 peak; {} for a run
    that records no model FLOPs."""
    tflop = run.config.get("model_tflop_per_step")
    if not tflop:
        return {}
    achieved = tflop / (step_ms_p50 / 1000.0)
    peak = bf16_peak_tflops(run.device_name) if run.is_cuda else None
    return {"achieved_tflops": achieved, "bf16_peak_tflops": peak,
            "bf16_peak_pct": None if peak is None else 100.0 * achieved / peak}


def cpuinfo_value(*keys: str) -> str | None:
    """The value of the first /proc/cpuinfo line starting with one of `keys` (None: no such line,
    or no Linux)."""
    try:
        lines = CPUINFO_PATH.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        if line.startswith(keys):
            return line.split(":", 1)[1].strip()
    return None


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    # platform.processor() is empty on most Linux systems; /proc/cpuinfo names the CPU
    model = cpuinfo_value("model name") or platform.processor() or platform.machine()
    return f"{model} ({presets.usable_cpu_count()} cores)"


def require_compile_toolchain(run: Run) -> None:
    """torch.compile writes C++ (Inductor on a CPU) or Triton code (on a GPU) and builds it with
    the system's compiler against Python's headers. Without them it fails deep inside Inductor
    with a long traceback; say what is missing in one line instead (exit code 2)."""
    compilers = ("c++", "g++", "clang++") if run.device.type == "cpu" else ("cc", "gcc", "clang")
    chosen = os.environ.get("CXX" if run.device.type == "cpu" else "CC")  # used alone when set
    missing = []
    if chosen and not shutil.which(chosen):
        missing.append(f"the compiler named by $CXX/$CC ({chosen})")
    elif not chosen and not any(shutil.which(c) for c in compilers):
        missing.append(f"a compiler ({', '.join(compilers)})")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").is_file():
        missing.append("Python's headers (Python.h)")
    if missing:
        fail(f"torch.compile needs {' and '.join(missing)}; on Debian or Ubuntu: "
             f"apt-get install build-essential python3-dev")


def full_fp32_matmuls() -> None:
    """FP32 matmuls and convolutions in full precision: TF32 (the middle rung) would run them on
    tensor cores. torch >= 2.9 has fp32_precision settings and deprecates allow_tf32."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        torch.backends.cuda.matmul.fp32_precision = "ieee"
        torch.backends.cudnn.conv.fp32_precision = "ieee"
    else:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False


def tf32_in_force() -> dict[str, bool]:
    """Whether FP32 matmuls and convolutions may use TF32, read from whichever API this torch has."""
    if hasattr(torch.backends.cuda.matmul, "fp32_precision"):
        return {"tf32_matmul": torch.backends.cuda.matmul.fp32_precision == "tf32",
                "tf32_cudnn": torch.backends.cudnn.conv.fp32_precision == "tf32"}
    return {"tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
            "tf32_cudnn": torch.backends.cudnn.allow_tf32}


def cpu_native_bf16_flags() -> list[str]:
    """The flags in CPU_NATIVE_BF16_FLAGS that /proc/cpuinfo lists (empty: none, or no Linux)."""
    present = set((cpuinfo_value("flags", "Features") or "").split())  # x86: flags, Arm: Features
    return [flag for flag in CPU_NATIVE_BF16_FLAGS if flag in present]


def cpu_bf16_matrix_units() -> bool:
    """Whether this CPU multiplies BF16 matrices faster than FP32 (CPU_BF16_MATRIX_UNIT_FLAG)."""
    return CPU_BF16_MATRIX_UNIT_FLAG in cpu_native_bf16_flags()


def note_cpu_bf16(run: Run) -> None:
    """Say what a BF16 result on this CPU can and cannot show, before it is measured: the note
    promises nothing the number may contradict (compare prints the measured ratio)."""
    flags = cpu_native_bf16_flags()
    run.extra["cpu_native_bf16"] = bool(flags)
    run.extra["cpu_native_bf16_flags"] = flags
    lesson = "the lesson is the GPU's, where BF16 runs on tensor cores (see the README)"
    if CPU_BF16_MATRIX_UNIT_FLAG in flags:
        run.notes.append(f"this CPU has native BF16 ({', '.join(flags)}), with AMX tile units "
                         f"that multiply BF16 matrices faster than FP32: a speed-up is possible "
                         f"here; {lesson}")
    elif flags:
        run.notes.append(f"this CPU has native BF16 instructions ({', '.join(flags)}) but no AMX "
                         f"tiles: BF16 matmuls may run no faster than FP32, or slower; only AMX "
                         f"makes BF16 faster on a CPU; {lesson}")
    else:
        run.notes.append("no native BF16 on this CPU; the speed-up needs tensor cores "
                         "(BF16 is emulated here, so expect a slowdown on this CPU)")
    if run.preset_name == presets.CPU_WITHOUT_BF16_UNITS:  # each demo has its own such preset
        sizes, steps = run.preset.sizes, run.steps
        run.notes.append(f"without AMX both variants run the smaller {run.preset_name} preset "
                         f"({sizes['blocks']} blocks, {sizes['seq_len']} tokens, {steps} timed "
                         f"step{'s' if steps != 1 else ''}): the slowdown is all there is to "
                         f"show, and at {run.demo}'s cpu preset an emulated BF16 step took "
                         f"{presets.CPU_EMULATED_BF16_STEP_S[run.demo]:g} s on a 2-core AMD EPYC")


def cpu_bf16_slow_why() -> str:
    """Why BF16 math is slow on this CPU, which has no AMX tiles: emulated, with no BF16
    instructions at all, or no faster than FP32 with them (CPU_NATIVE_BF16_FLAGS)."""
    flags = cpu_native_bf16_flags()
    if flags:
        return (f"this CPU has BF16 instructions ({', '.join(flags)}) but no AMX tiles, so BF16 "
                f"matmuls run no faster than FP32 (0.68x the samples/s on mixed_precision)")
    return ("this CPU has no BF16 instructions, so BF16 math is emulated, many times slower (on a "
            "2-core AMD EPYC: the ladder's BF16 step 34x slower than FP32, the memory ladder's "
            "first BF16 step 96.6 s against 1.9 s on a Xeon with AMX)")


def bf16_where_fast(run: Run) -> torch.dtype | None:
    """torch.bfloat16 where the device multiplies BF16 faster than FP32: a GPU with native BF16
    (tensor cores), a CPU with AMX tiles (cpu_bf16_matrix_units). None elsewhere, where BF16
    runs no faster, or is emulated, many times slower (the ladder's BF16 rung on a 2-core AMD EPYC
    with no BF16 instructions: 37.6 s a step against 1.09 s in FP32): the math stays FP32, as
    anyone on such a device would keep it, the rung measures the same as the one before, and the
    run says why (run.extra["bf16_kept_fp32"], a note)."""
    fast = (torch.cuda.is_bf16_supported(including_emulation=False) if run.is_cuda
            else cpu_bf16_matrix_units())
    run.extra["bf16_kept_fp32"] = not fast
    if fast:
        return torch.bfloat16
    why = (f"{device_name(run.device)} has no native BF16 (tensor cores of compute capability "
           f"8.0 or newer)" if run.is_cuda else cpu_bf16_slow_why())
    run.notes.append(f"{why}: the math stays FP32 here, and BF16's gain is a device's with BF16 "
                     f"matrix units (a recent GPU's tensor cores, an AMX CPU)")
    return None


MB_PER_GB = trace.MB_PER_GB  # the harness imports it from here


def cap_cuda_memory(device: torch.device, budget_mb: float, given: bool = True) -> float:
    """Cap the CUDA caching allocator at `budget_mb` (torch.cuda.set_per_process_memory_fraction
    of the GPU's memory): a step that needs more raises OutOfMemoryError, which the harness
    reports in one line. Returns the budget in force. A budget the user gave above the GPU's
    memory is an error; a preset's default above it (16 GB on a 16 GB card, which reports a
    little less) gives way to the GPU's own memory."""
    total_mb = torch.cuda.get_device_properties(device).total_memory / trace.BYTES_PER_MB
    if budget_mb > total_mb:
        if given:
            fail(f"--memory-budget-gb {budget_mb / MB_PER_GB:g}: above this GPU's "
                 f"{total_mb / MB_PER_GB:.1f} GB")
        budget_mb = total_mb
    # torch wants an index here, not the bare "cuda" of --device; None is the current GPU
    torch.cuda.set_per_process_memory_fraction(budget_mb / total_mb, torch.device(device).index)
    return budget_mb


def peak_resident_mb() -> float:
    """The process's peak resident memory so far (getrusage's ru_maxrss: KiB on Linux, bytes on
    macOS): every byte the training process touched, Python and PyTorch's own ~0.3-0.5 GB
    included; not its DataLoader workers'."""
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return (maxrss if sys.platform == "darwin" else maxrss * 1024) / trace.BYTES_PER_MB


def memory_budget_check(run: Run, peak_reserved_mb: float | None,
                        peak_resident_mb: float | None) -> dict | None:
    """With --memory-budget-gb: the budget, the peak held against it, what that peak is, and
    whether it fits. On a GPU the allocator's peak reserved (the cap enforced it: a run that
    needed more stopped); on a CPU the process's peak resident memory as the timed steps left it
    (peak_resident_mb, read before the profiler's phase, whose own trace would count), which the
    budget does not enforce."""
    if run.memory_budget_mb is None:
        return None
    if run.is_cuda:
        peak, of = peak_reserved_mb, "reserved by the CUDA caching allocator"
    else:
        peak, of = peak_resident_mb, ("the process's resident memory (ru_maxrss) over the warm-up "
                                      "and timed steps")
    return {"budget_mb": run.memory_budget_mb, "peak_mb": peak, "peak_of": of,
            "fits": peak is not None and peak <= run.memory_budget_mb}


def require_cuda_graphs(run: Run) -> None:
    """torch.compile(mode="reduce-overhead") falls back to running without CUDA graphs when it
    cannot record one (an input it mutates, a CPU tensor, a sync), with a line in its log at
    most: the run would then measure the fix without its graphs. Stop instead."""
    from torch._dynamo.utils import counters
    skips = counters["inductor"]["cudagraph_skips"]
    if skips:
        clear_run_dir(run.out_dir)
        fail(f"{run.demo}/{run.variant}: torch.compile(mode='reduce-overhead') skipped CUDA graphs "
             f"{skips} time(s), so the step runs without them; rerun with "
             f"TORCH_LOGS=perf_hints to see why; nothing was written")


# How Dynamo names the limit on compiles of one frame in its unimplemented reasons: "Dynamo
# recompile limit exceeded" (torch 2.14); older releases called the setting cache_size_limit.
RECOMPILE_LIMIT_REASON = re.compile(r"(?:recompile|cache)[ _](?:size[ _])?limit", re.IGNORECASE)
# Dynamo's own timer of a whole frame's compile (tracing and the backend), in compile_times().
DYNAMO_COMPILE_TIMER = "_compile.compile_inner"


def dynamo_report() -> dict | None:
    """What torch.compile did in this process so far, from Dynamo's counters
    (torch._dynamo.utils.counters; None without torch.compile): frames compiled, recompiles,
    graphs made, graph breaks and their reasons (each reason's first line), whether a frame hit the
    recompile limit (then it runs eagerly, with a warning only), and seconds spent compiling."""
    if "torch._dynamo" not in sys.modules:
        return None
    from torch._dynamo.utils import compile_times, counters
    reasons: dict[str, int] = {}
    for reason, count in counters["graph_break"].items():
        first = str(reason).strip().splitlines()[0]
        reasons[first] = reasons.get(first, 0) + count
    names, seconds = compile_times(repr="csv", aggregate=True)
    timers = dict(zip(names, seconds))
    # Compile ids handed out per frame (the C of "Torch-Compiled Region: F/C"): those beyond a
    # frame's first are its recompiles, the attempt that hit the limit among them. A module
    # global of Dynamo's (torch >= 2.1); None where a release lacks it.
    per_frame = getattr(sys.modules.get("torch._dynamo.convert_frame"),
                        "FRAME_COMPILE_COUNTER", None)
    return {"frames_compiled": dynamo_frames_compiled(),
            "recompiles": (None if per_frame is None
                           else sum(max(0, count - 1) for count in per_frame.values())),
            "graphs": counters["stats"]["unique_graphs"],
            "graph_breaks": sum(reasons.values()), "graph_break_reasons": reasons,
            "recompile_limit_hit": any(RECOMPILE_LIMIT_REASON.search(str(reason))
                                       for reason in counters["unimplemented"]),
            "compile_s": (float(timers[DYNAMO_COMPILE_TIMER])
                          if DYNAMO_COMPILE_TIMER in timers else None)}


def dynamo_frames_compiled() -> int:
    """Python frames torch.compile has compiled so far in this process (0 without torch.compile)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters
    return counters["frames"]["ok"]


# --compile-log: torch.compile's structured log (torch._logging) goes to the folder the TORCH_TRACE
# environment variable names, which torch reads once, when it is imported; tlparse (pip install
# tlparse) turns the log into an HTML report of every compile: its guards, graph breaks with their
# reasons and lines, recompiles with the guard that failed.
TORCH_TRACE_VAR = "TORCH_TRACE"
TORCH_TRACE_LOG_GLOB = "dedicated_log_torch_trace_*.log"
TLPARSE_DIR = "tlparse"  # inside the --compile-log folder
TLPARSE_TIMEOUT_S = 120


def start_compile_log(folder: Path, argv_given: bool) -> Path:
    """Make this process log torch.compile to `folder`. torch is already imported here, so a
    process started without TORCH_TRACE set to it restarts itself once with it set (the same
    command line); the first start removes an earlier run's logs and report from the folder."""
    folder = folder.resolve()
    if os.environ.get(TORCH_TRACE_VAR) == str(folder):
        return folder
    if argv_given:
        fail("--compile-log needs the script's own command line (it restarts the script with "
             "TORCH_TRACE set); run the script from a shell")
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(TORCH_TRACE_LOG_GLOB):
        old.unlink()
    shutil.rmtree(folder / TLPARSE_DIR, ignore_errors=True)
    os.environ[TORCH_TRACE_VAR] = str(folder)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


def tlparse_program() -> str | None:
    """tlparse beside this Python (a venv's bin, not always on PATH), else on PATH."""
    beside = Path(sys.executable).parent / "tlparse"
    return str(beside) if beside.exists() else shutil.which("tlparse")


def finish_compile_log(run: Run) -> dict:
    """The structured log this run wrote and, with tlparse installed, its HTML report
    (<folder>/tlparse/index.html): {"log": path or None, "report": path or None, "note": ...}."""
    folder = run.compile_log
    logs = sorted(folder.glob(TORCH_TRACE_LOG_GLOB), key=lambda path: path.stat().st_mtime)
    if not logs:
        return {"log": None, "report": None,
                "note": f"torch.compile wrote no log to {folder} (nothing was compiled)"}
    log, report = logs[-1], None
    program = tlparse_program()
    if program is None:
        note = (f"install tlparse (pip install tlparse) for an HTML report of each compile: "
                f"tlparse {log} -o {folder / TLPARSE_DIR} --no-browser")
    else:
        done = subprocess.run([program, str(log), "-o", str(folder / TLPARSE_DIR), "--overwrite",
                               "--no-browser"], capture_output=True, text=True,
                              timeout=TLPARSE_TIMEOUT_S)
        index = folder / TLPARSE_DIR / "index.html"
        if done.returncode == 0 and index.exists():
            report, note = index, f"tlparse's report of each compile: {index}"
        else:
            last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            note = f"tlparse failed on {log} (exit {done.returncode}): {last[0]}"
    return {"log": str(log), "report": None if report is None else str(report), "note": note}
