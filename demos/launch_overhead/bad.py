"""Launch overhead (bad): a deep, narrow MLP (48 residual blocks 256 wide, batch 64 on a GPU) whose
every small op (a hand-written RMSNorm, GELU, residual add) is its own kernel. Each kernel runs for
a few microseconds, less than the CPU needs to launch it, so the GPU spends the step waiting for
the next launch. See README.md in this folder."""
from common import data, harness, models


def main() -> None:
    run = harness.setup(demo="launch_overhead", variant="bad")
    model, optimizer = models.residual_mlp(run)
    run.config["torch_compile"] = None  # eager: one kernel launch per op, >1,000 per step on a GPU
    harness.train_on_device(run, model, optimizer, data.staged_features(run))


if __name__ == "__main__":
    main()
