"""Runs of several processes (torch.distributed): a demo script started with plain python
relaunches itself under torchrun (python -m torch.distributed.run, one process per rank on this
machine); each rank then joins the process group and trains its share. Which backend: NCCL with
one GPU per rank, gloo when ranks must share one GPU (NCCL needs a GPU each) or run on CPUs."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

from common import stopping

CPU_RANKS = 2  # processes on a CPU: the 2-core box runs one per core
MIN_GPU_RANKS = 2  # on a GPU machine one per GPU, and at least two (they then share a GPU)
# A job that runs longer is stopped, every rank with it: a rank stuck outside a collective (a
# deadlock, a hung data worker) waits forever, and gloo's and NCCL's own collective timeouts (30 and
# 10 minutes by default) cover only the collectives. The full-size ddp_no_sync run takes about
# 100 s on the H100 and a few minutes on a 2-core CPU: an hour only stops a hung job.
RELAUNCH_TIMEOUT_S = 3600
# What torchrun prints for each failed rank ("exitcode  : 2"), from its error summary.
EXITCODE_LINE = re.compile(r"exitcode\s*:\s*(-?\d+)")


def launched() -> bool:
    """Whether this process is a rank that torchrun started (it sets RANK and WORLD_SIZE)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def ranks_for(device_type: str) -> int:
    if device_type == "cuda":
        return max(MIN_GPU_RANKS, torch.cuda.device_count())
    return CPU_RANKS


def torchrun_command(script: str, argv: list[str], ranks: int, log_dir: str) -> list[str]:
    """One machine, `ranks` processes; each rank's stderr goes to a file under log_dir (read back
    when a rank fails), its stdout (the progress lines) to the console."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={ranks}", "--log-dir", log_dir, "--redirects", "2",
            script, *argv]


def last_error_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no message)"


def relaunch(script: str, argv: list[str], ranks: int,
             timeout_s: float = RELAUNCH_TIMEOUT_S) -> int:
    """Run `script argv` under torchrun with `ranks` processes and wait; the exit code: 0, or
    that of a failed rank (2 for the harness's one-line errors, else 1) after one line per
    failed rank. torchrun stops every other rank when one fails; a job still running after
    timeout_s is stopped whole (one line, exit 1). Either way none is left running."""
    # SIGTERM to this process stops the job too (sigterm_raises), as Ctrl-C does.
    with stopping.sigterm_raises(), tempfile.TemporaryDirectory(prefix="torchrun_") as log_dir:
        # Its own process group, so that a stop reaches the ranks and not only torchrun.
        process = subprocess.Popen(torchrun_command(script, argv, ranks, log_dir),
                                   stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            _, stderr = process.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stopping.stop(process, group=True)
            print(f"error: the {ranks} ranks were still running after {timeout_s:g} s: stopped "
                  f"them all (a rank is stuck; its progress lines above show where)",
                  file=sys.stderr)
            return 1
        except BaseException:  # Ctrl-C reaches only this process: the ranks are in their group
            stopping.stop(process, group=True)
            raise
        if process.returncode == 0:
            return 0
        failed = []
        for log in sorted(Path(log_dir).rglob("stderr.log")):
            text = log.read_text(errors="replace")
            if text.strip():
                failed.append(f"rank {log.parent.name}: {last_error_line(text)}")
    codes = [int(code) for code in EXITCODE_LINE.findall(stderr)]
    for line in failed or [f"torchrun: {last_error_line(stderr)}"]:
        print(f"error: {line}", file=sys.stderr)
    return 2 if 2 in codes else 1


def join(device_type: str) -> tuple[torch.device, str, str]:
    """Join the process group of this torchrun job: (this rank's device, backend, what ran)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ["WORLD_SIZE"])
    if device_type == "cuda" and torch.cuda.device_count() >= world_size:
        device, backend = torch.device("cuda", local_rank), "nccl"
        mode = f"NCCL, one GPU per rank ({world_size} GPUs)"
        torch.cuda.set_device(device)
    elif device_type == "cuda":
        device, backend = torch.device("cuda", 0), "gloo"
        mode = (f"gloo, {world_size} ranks sharing one GPU (NCCL needs a GPU per rank; the "
                f"all-reduce goes through host memory)")
    else:
        device, backend = torch.device("cpu"), "gloo"
        mode = f"gloo on the CPU, {world_size} processes"
    dist.init_process_group(backend)
    return device, backend, mode


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def leave() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
