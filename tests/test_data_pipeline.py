"""The dataloader_workers input pipeline: uint8 images normalised after the loader, the side-stream
copy (its order of operations, with the CUDA calls faked: no GPU here), the core count under a
container's CPU quota, and the /dev/shm budget for prefetched batches."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
from torch.utils.data import DataLoader

from common import data, harness, presets, runs

CPU = torch.device("cpu")
SMOKE = presets.PRESETS["dataloader_workers"]["smoke"].sizes
GPU_PRESET = presets.PRESETS["dataloader_workers"]["cuda"]


def images(uint8: bool, length: int = 4, jitter: bool = True, **sizes) -> data.JpegImages:
    return data.JpegImages(length=length, seed=0, uint8=uint8, jitter=jitter, **{**SMOKE, **sizes})


def test_uint8_images_normalised_later_equal_the_float32_pipeline():
    as_float, as_uint8 = images(uint8=False), images(uint8=True)
    floats, uint8s = [], []
    for index in range(len(as_float)):
        torch.manual_seed(index)  # the same random crop, flip and jitter for both
        floats.append(as_float[index][0])
        torch.manual_seed(index)
        uint8s.append(as_uint8[index][0])
    assert uint8s[0].dtype == torch.uint8 and floats[0].dtype == torch.float32
    # Same operations in the same order (/ 255, - mean, / std): equal to the last bit on a CPU.
    assert torch.equal(data.normalize(torch.stack(uint8s), *data.imagenet_stats(CPU)),
                       torch.stack(floats))


def test_batch_bytes_of_the_gpu_preset_are_the_readme_figures():
    crop = GPU_PRESET.sizes["crop_px"]
    uint8 = images(uint8=True, length=1, source_px=16, crop_px=crop, distinct_images=1)
    float32 = images(uint8=False, length=1, source_px=16, crop_px=crop, distinct_images=1)
    batch = GPU_PRESET.batch_size
    label_bytes = batch * torch.int64.itemsize
    assert batch * uint8.sample_bytes() == 256 * 3 * 224 * 224 + label_bytes  # 38.5 MB
    assert batch * float32.sample_bytes() == 4 * 256 * 3 * 224 * 224 + label_bytes  # 154 MB


def smoke_run(tmp_path, variant: str = "fixed") -> runs.Run:
    return harness.setup("dataloader_workers", variant,
                         ["--device", "cpu", "--smoke", "--out", str(tmp_path)])


def test_prefetcher_on_a_cpu_normalises_and_reports_the_loaders_settings(tmp_path):
    run = smoke_run(tmp_path)
    loader = DataLoader(images(uint8=True), batch_size=2)
    prefetcher = data.prefetch_to_device(loader, run)
    # harness.train records describe_loader() of what it is given: the DataLoader's settings.
    assert harness.describe_loader(prefetcher) == harness.describe_loader(loader)
    assert len(prefetcher) == len(loader) == 2
    assert "CPU" in run.config["to_device"]
    mean, std = data.imagenet_stats(CPU)
    torch.manual_seed(0)
    expected = [(data.normalize(x, mean, std), y) for x, y in loader]
    torch.manual_seed(0)
    for (images_, labels), (want_images, want_labels) in zip(prefetcher, expected, strict=True):
        assert images_.dtype == torch.float32 and torch.equal(images_, want_images)
        assert torch.equal(labels, want_labels)


def test_side_stream_queues_the_next_copy_before_the_step_and_guards_the_memory(monkeypatch):
    """The CUDA calls are faked (this machine has no GPU) to check their order: batch k+1's copy is
    queued on the side stream before step k's kernels (so it overlaps them); the compute stream
    waits for the side stream after step k-1 and before step k (so a step never reads a batch
    still in flight, and never waits for the copy of the batch after its own); each delivered
    batch is marked as used by the compute stream (record_stream), so its memory is not reused."""
    log = []

    class FakeStream:
        def __init__(self, name: str):
            self.name = name

        def wait_stream(self, other: FakeStream) -> None:
            log.append(f"{self.name} waits for {other.name}")

    side, compute = FakeStream("side"), FakeStream("compute")

    @contextlib.contextmanager
    def on_stream(stream: FakeStream):
        log.append(f"queue on {stream.name}")
        yield

    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: side)
    monkeypatch.setattr(torch.cuda, "stream", on_stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: compute)
    monkeypatch.setattr(torch.Tensor, "record_stream",
                        lambda tensor, stream: log.append(f"record {stream.name}"), raising=False)
    generator = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 256, (2, 3, 4, 4), dtype=torch.uint8, generator=generator),
                torch.tensor([step, step])) for step in range(3)]
    mean, std = data.imagenet_stats(CPU)
    delivered = data.side_stream_batches(batches, CPU)
    for step, (images_, labels) in enumerate(delivered):
        log.append(f"step {step}")
        assert torch.equal(images_, data.normalize(batches[step][0], mean, std))
        assert labels.tolist() == [step, step]
    guard = ["compute waits for side", "record compute", "record compute"]
    assert log == ["queue on side",  # the mean and std, once
                   "queue on side", *guard,  # batch 0
                   "queue on side", "step 0", *guard,  # batch 1 is copied while step 0 runs
                   "queue on side", "step 1", *guard,  # batch 2 is copied while step 1 runs
                   "step 2"]


# --- The colour jitter on a batch ----------------------------------------------------------------

JITTER_TOLERANCE = 1e-5  # float32 values in [0, 1]: the same arithmetic, grouped otherwise


def test_jitter_on_a_batch_is_torchvisions_on_each_image():
    """apply_jitter gives each image what torchvision's own tensor adjustments give it, with its
    own four factors in its own order: a gray image (no hue), pixels at 0 and 1 (the clamps), and
    ties between channels (where two of the hue's formulas meet)."""
    from torchvision.transforms import functional as F
    generator = torch.Generator().manual_seed(0)
    batch = torch.rand(24, 3, 10, 12, generator=generator)
    batch[0] = 0.5  # gray: no hue to turn
    batch[1, :, :3] = 1.0
    batch[2, :, :3] = 0.0
    batch[3, 1] = batch[3, 0]  # red and green tie
    batch[4, 2] = batch[4, 1]  # green and blue tie
    factors, order = data.jitter_draws(len(batch), generator)
    jittered = data.apply_jitter(batch, factors, order)
    adjust = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    assert len({tuple(row) for row in order.tolist()}) > 1  # orders differ between images
    for image, want_factors, want_order, got in zip(batch, factors, order, jittered):
        for k in want_order.tolist():
            image = adjust[k](image, float(want_factors[k]))
        assert torch.allclose(got, image, rtol=0, atol=JITTER_TOLERANCE)


def assert_compiled_jitter_is_eager(device: torch.device, images: int, size: int, seed: int,
                                    backend: str = "inductor") -> None:
    """jittered_normalized compiled whole by `backend` (fullgraph: a break fails) against eager,
    on a random uint8 batch of `images` images of `size` px: within JITTER_TOLERANCE of a 0-1
    pixel, after normalization's divide by the smallest std."""
    generator = torch.Generator(device=device).manual_seed(seed)
    batch = torch.randint(0, 256, (images, 3, size, size), dtype=torch.uint8, device=device,
                          generator=generator)
    draws = data.jitter_draws(len(batch), generator)
    mean, std = data.imagenet_stats(device)
    compiled = torch.compile(data.jittered_normalized, fullgraph=True, backend=backend)
    assert torch.allclose(compiled(batch, *draws, mean, std),
                          data.jittered_normalized(batch, *draws, mean, std),
                          rtol=0, atol=JITTER_TOLERANCE / min(data.IMAGENET_STD))


def test_the_jitter_compiles_whole_to_the_eager_values():
    """jitter_on_device compiles jittered_normalized (on a GPU eager would run ~60 kernels a
    stage): Dynamo captures it as one graph, no break, and AOTAutograd's graph of it (what
    Inductor is given) gives the eager values. Run by eager kernels (aot_eager): no run compiles
    the jitter for a CPU (rung 5 leaves it to the workers there), so Inductor's C++ build, 25 to
    40 s on 2 cores, would test code nothing runs; the cuda marker checks Inductor's GPU code."""
    assert_compiled_jitter_is_eager(CPU, images=4, size=16, seed=2, backend="aot_eager")


def test_jitter_draws_are_colorjitters_ranges_and_orders():
    generator = torch.Generator().manual_seed(1)
    factors, order = data.jitter_draws(1000, generator)
    spread = torch.tensor((data.JITTER_BRIGHTNESS, data.JITTER_CONTRAST, data.JITTER_SATURATION,
                           data.JITTER_HUE))
    centre = torch.tensor((1.0, 1.0, 1.0, 0.0))
    assert ((factors - centre).abs() <= spread).all()
    # Uniform over the range: with 1,000 draws each quarter of it is hit (a miss: p < 1e-120).
    quarter = ((factors - centre) / spread * 2 + 2).floor().clamp(0, 3)
    assert all(len(quarter[:, k].unique()) == 4 for k in range(4))
    assert torch.equal(order.sort(dim=1).values, torch.arange(4).expand(1000, 4))
    again = data.jitter_draws(1000, torch.Generator().manual_seed(1))
    assert torch.equal(again[0], factors) and torch.equal(again[1], order)


def test_workers_leave_the_jitter_out_only_for_uint8_images():
    without = images(uint8=True, jitter=False)
    assert "ColorJitter" not in repr(without.augment)
    assert "ColorJitter" in repr(images(uint8=True).augment)
    with pytest.raises(ValueError, match="uint8"):
        images(uint8=False, jitter=False)


def test_the_prefetcher_jitters_once_and_gives_the_jittered_batch(tmp_path, monkeypatch):
    """prefetch_to_device(jitter=True) wants images the workers left unjittered (and jitter=False
    images they jittered): either mismatch is refused rather than jittering twice or never. On a
    CPU the batch it gives is jittered_normalized with the draws of a generator seeded with the
    run's seed (torch.compile stood in for by the function itself: the smoke ladder runs it)."""
    monkeypatch.setattr(torch, "compile", lambda function: function)
    run = smoke_run(tmp_path)
    with pytest.raises(ValueError, match="once"):
        data.prefetch_to_device(DataLoader(images(uint8=True), batch_size=2), run, jitter=True)
    unjittered = DataLoader(images(uint8=True, jitter=False), batch_size=2)
    with pytest.raises(ValueError, match="once"):
        data.prefetch_to_device(unjittered, run)
    prefetcher = data.prefetch_to_device(unjittered, run, jitter=True)
    assert "jittered" in run.config["to_device"] and run.config["color_jitter"]
    mean, std = data.imagenet_stats(CPU)
    generator = torch.Generator().manual_seed(run.seed)
    torch.manual_seed(0)
    expected = [(x, data.jittered_normalized(x, *data.jitter_draws(len(x), generator), mean, std),
                 y) for x, y in unjittered]
    torch.manual_seed(0)
    for (images_, labels), (raw, want_images, want_labels) in zip(prefetcher, expected,
                                                                  strict=True):
        assert torch.equal(images_, want_images) and torch.equal(labels, want_labels)
        # jittered indeed: far from the same batch only normalised (a jitter moves values by
        # tenths; normalised, by about half a unit)
        assert (images_ - data.normalize(raw, mean, std)).abs().max() > 0.1


# --- Cores under a container's CPU quota ---------------------------------------------------------

@pytest.fixture
def cgroup(tmp_path, monkeypatch):
    """Fake cgroup roots (nothing in them yet) and a 100-thread host's affinity mask."""
    v1 = tmp_path / "cpu"
    v1.mkdir()
    monkeypatch.setattr(presets, "CGROUP_V2_CPU_MAX", tmp_path / "cpu.max")
    monkeypatch.setattr(presets, "CGROUP_V1_CPU_DIR", v1)
    monkeypatch.setattr(presets.os, "sched_getaffinity", lambda pid: set(range(100)),
                        raising=False)
    return SimpleNamespace(v2=tmp_path / "cpu.max", v1=v1)


@pytest.mark.parametrize("v2, v1, cpus", [
    ("400000 100000\n", None, 4),  # docker run --cpus=4 on cgroup v2
    ("150000 100000\n", None, 2),  # 1.5 CPUs: rounded up
    ("20000 100000\n", None, 1),  # a fifth of a CPU: still one
    ("max 100000\n", None, None),  # no limit
    (None, ("400000", "100000"), 4),  # cgroup v1
    (None, ("-1", "100000"), None),  # v1, no limit
    (None, None, None),  # no cgroup files (not Linux, or not mounted)
    ("garbage\n", ("x", "y"), None),  # unreadable values count as no quota, not as a crash
    ("800000 100000\n", ("300000", "100000"), 3),  # both present: the smaller limit
])
def test_cgroup_cpu_quota(cgroup, v2, v1, cpus):
    if v2 is not None:
        cgroup.v2.write_text(v2)
    if v1 is not None:
        (cgroup.v1 / "cpu.cfs_quota_us").write_text(v1[0] + "\n")
        (cgroup.v1 / "cpu.cfs_period_us").write_text(v1[1] + "\n")
    assert presets.cgroup_cpu_quota() == cpus
    assert presets.usable_cpu_count() == (cpus or 100)


def test_workers_follow_the_quota_and_stop_at_the_cap(cgroup):
    # A 100-thread host with no quota: the cap, not ~100 workers (or 98 beside a GPU).
    assert presets.loader_workers("cpu") == presets.loader_workers("cuda") == 16
    assert presets.MAX_LOADER_WORKERS == 16
    cgroup.v2.write_text("400000 100000\n")  # docker run --cpus=4
    assert (presets.main_process_threads("cpu"), presets.loader_workers("cpu")) == (2, 2)
    # With a GPU two cores stay with the training process: its Python thread and pin-memory thread.
    assert (presets.main_process_threads("cuda"), presets.loader_workers("cuda")) == (2, 2)


# --- /dev/shm budget -----------------------------------------------------------------------------

MB = 1_000_000


def gpu_preset_run(uint8: bool) -> tuple[SimpleNamespace, data.JpegImages]:
    run = SimpleNamespace(demo="dataloader_workers", variant="fixed", config={}, rank=0,
                          batch_size=GPU_PRESET.batch_size)
    return run, images(uint8=uint8, length=1, source_px=16, distinct_images=1,
                       crop_px=GPU_PRESET.sizes["crop_px"])


def test_enough_shm_keeps_the_wanted_prefetch_factor(monkeypatch, capsys):
    monkeypatch.setattr(data, "shm_free_bytes", lambda: 8_000 * MB)
    run, uint8_images = gpu_preset_run(uint8=True)
    # 14 workers x 4 x 38.5 MB (+ one in hand) / 0.8 = 2.7 GB: fits in 8 GB.
    assert data.shm_prefetch_factor(run, uint8_images, num_workers=14, wanted=4) == 4
    assert run.config == {} and capsys.readouterr().out == ""


def test_too_little_shm_lowers_the_prefetch_factor_and_says_so(monkeypatch, capsys):
    monkeypatch.setattr(data, "shm_free_bytes", lambda: 8_000 * MB)
    run, float_images = gpu_preset_run(uint8=False)
    # float32: 14 x 4 x 154 MB = 8.6 GB does not fit in 8 GB; 14 x 2 (+ 1) x 154 MB / 0.8 does.
    assert data.shm_prefetch_factor(run, float_images, num_workers=14, wanted=4) == 2
    out = capsys.readouterr().out
    assert "prefetch_factor 2, not 4" in out and "--shm-size" in out and out.count("\n") == 1
    assert run.config == {"prefetch_factor_wanted": 4, "shm_free_mb": 8000}


def test_no_room_for_one_batch_per_worker_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setattr(data, "shm_free_bytes", lambda: 64 * MB)  # Docker's default /dev/shm
    run, uint8_images = gpu_preset_run(uint8=True)
    with pytest.raises(SystemExit) as exit_info:
        data.shm_prefetch_factor(run, uint8_images, num_workers=14, wanted=4)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1
    assert "--shm-size=" in err and "Traceback" not in err


def test_no_shm_file_system_keeps_the_wanted_prefetch_factor(monkeypatch):
    monkeypatch.setattr(data, "SHM_PATH", data.Path("/no/such/dir"))
    run, uint8_images = gpu_preset_run(uint8=True)
    assert data.shm_prefetch_factor(run, uint8_images, num_workers=14, wanted=4) == 4
