"""Whether a run's recorded steps stand for its timed ones. The harness times its steps without
the profiler (samples/s, the step p50, the data wait), then records a few under it; the analyzer
reads only those few. Where the two disagree, a sentence says so (compare prints it for a pair,
the waterfall for each rung of a ladder):

- the profiled step p50 over the timed p50 (profiler_overhead_ratio) above
  trace.PROFILER_OVERHEAD_WARN_RATIO: the profiler's cost per operator inflates the trace's CPU
  time; and where the GPU alone was busy longer a recorded step than a whole timed step took
  (gpu_busy_ratio above 1), the recorded steps held more GPU work or met a slower GPU;
- the timed steps' data wait and the recorded steps' DataLoader share more than
  trace.DATA_WAIT_GAP_POINTS apart: the trace understates a wait the timed steps had (or
  exaggerates it), and the dataloader rule, which reads the trace, may say otherwise than the
  timed wait. (The harness records a round of a loader's workers where a few timed steps in a
  row stand that far off the timed wait: profiling.loader_round_steps.)

Imports no torch."""
from __future__ import annotations

from common import trace
from common.verdicts import dataloader_share_min_pct

# A p95 more than half again the p50: steps differ more than most fixes gain (a DataLoader that
# delivers in bursts, a sync on some steps), so one run's mean says little.
STEP_SPREAD_MAX = 1.5


def profiler_overhead_ratio(summary: dict) -> float | None:
    """Profiled step p50 / timed step p50, as the harness writes it (profiler_overhead_ratio), or
    from the two p50s when only they are there; None for an older summary without them."""
    if summary.get("profiler_overhead_ratio") is not None:
        return summary["profiler_overhead_ratio"]
    profiled, timed = summary.get("profiled_step_ms_p50"), summary.get("step_ms_p50")
    return profiled / timed if profiled is not None and timed else None


def gpu_busy_ratio(summary: dict, analysis: dict) -> float | None:
    """A GPU trace's busy time per recorded step (its utilization of the window, over the steps)
    ÷ the timed step p50; None on a CPU trace or without the p50. The profiler's own cost is the
    host's: a recorded step keeps the GPU busy longer than a whole timed step took only if it held
    more GPU work or the GPU ran slower while recorded. (The H100 reference's runs whose GPU is
    busy 99 % or more of the window keep it busy within 1 % of their timed p50.)"""
    gpu = analysis.get("gpu") or {}
    busy_pct, steps, window_ms = (gpu.get("utilization_pct"), analysis.get("steps"),
                                  analysis.get("window_ms"))
    timed_ms = summary.get("step_ms_p50")
    if busy_pct is None or not steps or not window_ms or not timed_ms:
        return None
    return busy_pct / 100 * window_ms / steps / timed_ms


def overhead_warning(overhead: float | None, busy: float | None, trust: str) -> str | None:
    """The profiled steps' p50 against the timed p50 (`overhead`), and why they differ: where
    the GPU alone was busy longer a recorded step than a whole timed step took (`busy`,
    gpu_busy_ratio, above 1), which no cost on the host explains, that part is the GPU's; the
    rest is the profiler's cost on the CPU. `trust`: what the run's speed is read from."""
    if overhead is None or overhead <= trace.PROFILER_OVERHEAD_WARN_RATIO:
        return None
    why = ("the trace exaggerates CPU time" if busy is None or busy <= 1
           else f"the GPU alone was busy {busy:.2f}x the timed step p50 a recorded step (more "
                f"GPU work in those steps, or a GPU that ran slower while recorded), the "
                f"profiler's CPU cost the remainder")
    return (f"profiled steps ran {overhead:.2f}x the timed step p50 (warn above "
            f"{trace.PROFILER_OVERHEAD_WARN_RATIO}x): {why}; trust {trust}")


def data_wait_warning(summary: dict, analysis: dict) -> str | None:
    """The timed steps' data wait against the recorded steps' DataLoader share, where both are
    there (a trace with no loader span at all says nothing of a loader: its data came another
    way); a wide spread of the timed steps (STEP_SPREAD_MAX) adds that the batches came in
    bursts, which a few recorded steps can fall between (fewer than the DataLoader's workers: a
    round of them holds a burst); where the two stand on either side of the
    dataloader rule's threshold (verdicts.dataloader_share_min_pct: lower with workers), what the
    rule would say by the timed wait."""
    timed, recorded = summary.get("data_wait_pct"), analysis.get("dataloader_pct")
    if timed is None or recorded is None:
        return None
    if recorded == 0 and analysis.get("dataloader_workers") is None:  # no loader span
        return None
    if abs(timed - recorded) <= trace.DATA_WAIT_GAP_POINTS:
        return None
    less = timed > recorded
    p50, p95 = summary.get("step_ms_p50"), summary.get("step_ms_p95")
    workers = (summary.get("config") or {}).get("num_workers") or 0
    round_recorded = workers and analysis["steps"] >= workers  # no burst to fall between
    bursts = (f"; their p95 is {p95 / p50:.2f}x their p50: the batches came in bursts, which "
              f"{analysis['steps']} recorded steps can fall between (record more: "
              f"--recorded-steps)"
              if less and p50 and p95 and p95 / p50 > STEP_SPREAD_MAX and not round_recorded
              else "")
    cut = dataloader_share_min_pct(analysis.get("dataloader_workers"))
    fires = timed >= cut
    rule = (f"; by the timed wait the dataloader rule (>= {cut:.0f} %"
            f"{' with workers' if analysis.get('dataloader_workers') else ''}) "
            f"would {'fire' if fires else 'stay silent'}"
            if fires != (recorded >= cut) else "")
    return (f"the timed steps waited for data {timed:.1f} % of the time, the recorded steps "
            f"{recorded:.1f} % (DataLoader share; warn above a "
            f"{trace.DATA_WAIT_GAP_POINTS:.0f}-point gap): the trace "
            f"{'understates' if less else 'exaggerates'} the wait; trust the timed steps' "
            f"wait{rule}{bursts}")


def recorded_warnings(summary: dict, analysis: dict, trust: str) -> list[str]:
    """Each way the run's recorded steps fail to stand for its timed ones, a sentence each; [] for
    a run without a summary (a trace alone has no timed steps to hold it to)."""
    if not summary:
        return []
    found = (overhead_warning(profiler_overhead_ratio(summary), gpu_busy_ratio(summary, analysis),
                              trust),
             data_wait_warning(summary, analysis))
    return [sentence for sentence in found if sentence]
