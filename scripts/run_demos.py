"""Run the bad and the fixed script of each demo, then compare them.

Examples:
  ./scripts/run_demos.sh                          every demo, on the GPU if there is one
  ./scripts/run_demos.sh dataloader_workers --device cpu
  ./scripts/run_demos.sh --smoke                  tiny sizes: checks that everything runs
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEMOS_DIR = ROOT / "demos"
VARIANTS = ("bad", "fixed")


def available_demos() -> list[str]:
    return sorted(d.name for d in DEMOS_DIR.iterdir()
                  if all((d / f"{variant}.py").is_file() for variant in VARIANTS))


def parse_flags(argv: list[str] | None = None) -> argparse.Namespace:
    demos = available_demos()
    parser = argparse.ArgumentParser(
        prog="run_demos.sh", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"Demos: {', '.join(demos)}.")
    parser.add_argument("demos", nargs="*", metavar="DEMO", help="demos to run (default: all)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto",
                        help="passed to every script (default: auto)")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes and few steps")
    parser.add_argument("--out", type=Path, default=ROOT / "traces",
                        help="output root (default: traces/)")
    flags = parser.parse_args(argv)
    unknown = [name for name in flags.demos if name not in demos]
    if unknown:
        parser.error(f"unknown demo {', '.join(map(repr, unknown))}; choose from: {', '.join(demos)}")
    flags.demos = flags.demos or demos
    return flags


def run_variant(demo: str, variant: str, flags: argparse.Namespace) -> bool:
    command = [sys.executable, str(DEMOS_DIR / demo / f"{variant}.py"), "--device", flags.device,
               "--out", str(flags.out)] + (["--smoke"] if flags.smoke else [])
    return subprocess.run(command, cwd=ROOT).returncode == 0


def load_summary(out: Path, demo: str, variant: str) -> dict | None:
    path = out / demo / variant / "summary.json"
    return json.loads(path.read_text()) if path.is_file() else None


def comparison_lines(demo: str, bad: dict, fixed: dict) -> list[str]:
    speedup = fixed["samples_per_s"] / bad["samples_per_s"]
    lines = [f"{demo} on {bad['device']} ({bad['device_name']}), torch {bad['torch_version']}, "
             f"preset {bad['preset']}",
             f"  {'':8}{'samples/s':>12}{'step p50 ms':>14}{'step p95 ms':>14}{'peak MB':>10}"]
    for name, summary in (("bad", bad), ("fixed", fixed)):
        peak = summary["peak_memory_mb"]
        lines.append(f"  {name:8}{summary['samples_per_s']:12.1f}{summary['step_ms_p50']:14.1f}"
                     f"{summary['step_ms_p95']:14.1f}{'n/a' if peak is None else f'{peak:.0f}':>10}")
    lines.append(f"  fixed / bad: {speedup:.2f}x samples/s")
    return lines


def main(argv: list[str] | None = None) -> int:
    flags = parse_flags(argv)
    failed = []
    started = time.perf_counter()
    total = len(flags.demos) * len(VARIANTS)
    for index, (demo, variant) in enumerate(
            [(d, v) for d in flags.demos for v in VARIANTS], start=1):
        print(f"\n=== [{index}/{total}] {demo}/{variant} ({time.perf_counter() - started:.0f} s elapsed)",
              flush=True)
        if not run_variant(demo, variant, flags):
            failed.append(f"{demo}/{variant}")
    print("\n=== comparison")
    for demo in flags.demos:
        bad, fixed = (load_summary(flags.out, demo, v) for v in VARIANTS)
        if f"{demo}/bad" in failed or f"{demo}/fixed" in failed or not bad or not fixed:
            print(f"{demo}: no comparison (a run failed)")
            continue
        print("\n".join(comparison_lines(demo, bad, fixed)))
    print(f"\ntraces and summaries under {flags.out} ({time.perf_counter() - started:.0f} s); "
          f"open them with ./scripts/tensorboard.sh or tensorboard --logdir {flags.out}")
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
