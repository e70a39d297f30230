"""Data for the demos. The images are real JPEG files held in memory (as an image folder sits in
the page cache after the first epoch): every sample is decoded and augmented on the CPU, so the
cost a real input pipeline pays is paid here too."""
from __future__ import annotations

import io
import math
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from common import harness, runs
from common.trace import BYTES_PER_MB

# The usual ImageNet normalisation constants (torchvision's reference training scripts).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
JPEG_QUALITY = 90  # a typical camera/ImageNet quality; lower would make decoding cheaper
SYNTHETIC_DETAIL_PX = 16  # side of the random colour grid that is smoothed into a photo-like image
SYNTHETIC_NOISE_STD = 12.0  # grain (0..255 scale), so the JPEG is not trivially compressible


def synthetic_photo(rng: np.random.Generator, side_px: int) -> Image.Image:
    """A smooth colour field with grain: compresses and decodes like a photograph, not like noise."""
    grid = rng.integers(0, 256, size=(SYNTHETIC_DETAIL_PX, SYNTHETIC_DETAIL_PX, 3), dtype=np.uint8)
    smooth = np.asarray(Image.fromarray(grid).resize((side_px, side_px), Image.BICUBIC), np.float32)
    grain = rng.normal(0.0, SYNTHETIC_NOISE_STD, size=smooth.shape)
    return Image.fromarray(np.clip(smooth + grain, 0, 255).astype(np.uint8))


class JpegImages(Dataset):
    """Labelled JPEG images, decoded and augmented in __getitem__ (ImageNet-style training
    transforms: random resized crop, flip, colour jitter, then to-tensor and normalise).
    uint8=True stops before the last two: images stay uint8 [3, crop, crop] (1 byte a value,
    float32 takes 4), and normalize() gives a batch of them the same values later."""

    def __init__(self, length: int, source_px: int, crop_px: int, num_classes: int,
                 distinct_images: int, seed: int, uint8: bool = False):
        # Here, not at the top: importing torchvision takes ~1.5 s (its models), which every
        # demo without images would pay at start-up.
        from torchvision import transforms
        rng = np.random.default_rng(seed)
        self.jpegs = []
        for _ in range(distinct_images):
            buffer = io.BytesIO()
            synthetic_photo(rng, source_px).save(buffer, format="JPEG", quality=JPEG_QUALITY)
            self.jpegs.append(buffer.getvalue())
        self.labels = torch.from_numpy(rng.integers(0, num_classes, size=length))
        self.crop_px, self.uint8 = crop_px, uint8
        to_tensor = ([transforms.PILToTensor()] if uint8 else
                     [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        self.augment = transforms.Compose([
            transforms.RandomResizedCrop(crop_px),
            transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
            *to_tensor,
        ])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        jpeg = self.jpegs[index % len(self.jpegs)]
        image = Image.open(io.BytesIO(jpeg)).convert("RGB")
        return self.augment(image), self.labels[index]

    def sample_bytes(self) -> int:
        """Bytes of one sample as a DataLoader batch holds it: the image and its int64 label."""
        image_dtype = torch.uint8 if self.uint8 else torch.float32
        return 3 * self.crop_px ** 2 * image_dtype.itemsize + self.labels.dtype.itemsize


def augmented_images(run, uint8: bool = False) -> JpegImages:
    """Exactly enough samples for one run (warm-up, timed and profiled steps), so no epoch
    restarts in the middle of a measurement. uint8: see JpegImages."""
    run.config["batch_dtype"] = "uint8" if uint8 else "float32"
    sizes = {key: value for key, value in run.sizes.items() if key != "resnet_depth"}  # model's
    return JpegImages(length=run.total_steps * run.batch_size, seed=run.seed, uint8=uint8, **sizes)


def imagenet_stats(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """IMAGENET_MEAN and IMAGENET_STD as float32 [1, 3, 1, 1] tensors on `device`: they broadcast
    over a batch [batch, 3, H, W] as Normalize's [3, 1, 1] do over one image."""
    return (torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1),
            torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1))


def normalize(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 images [batch, 3, H, W] -> float32 with the values ToTensor and Normalize give each
    image of the float32 pipeline, by the same operations in the same order: / 255, - mean, / std.
    Runs on the device the images are on."""
    return images.float().div_(255).sub_(mean).div_(std)


# --- Getting batches onto the device -------------------------------------------------------------
# .to(device, non_blocking=True) on a pinned batch frees the CPU, but the copy still waits in the
# *current* stream behind the kernels already queued there (the previous step), and the next step
# waits behind the copy: nothing overlaps on the GPU. A second stream carries the copy (and the
# normalising) of batch N+1 while the compute stream runs step N; timm's PrefetchLoader does this.


def side_stream_batches(loader: DataLoader, device: torch.device
                        ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, labels) of `loader` on the CUDA `device`, images normalised: each batch is copied
    and normalised on a side stream while the compute stream runs the step on the one before."""
    side = torch.cuda.Stream(device=device)
    with torch.cuda.stream(side):
        mean, std = imagenet_stats(device)  # made, and only ever read, on the side stream
    ready = None
    for images, labels in loader:
        with torch.cuda.stream(side):  # queued on the side stream: runs beside the step's kernels
            images = normalize(images.to(device, non_blocking=True), mean, std)
            labels = labels.to(device, non_blocking=True)
        if ready is not None:
            yield ready  # the caller queues its step on this one, beside the copy just queued
        compute = torch.cuda.current_stream(device)
        compute.wait_stream(side)  # the next step's kernels start only once its batch has landed
        # Allocated from the side stream's memory pool, read on the compute stream: without this
        # the allocator could hand the memory to a later copy while a step still reads it.
        images.record_stream(compute)
        labels.record_stream(compute)
        ready = images, labels
    if ready is not None:
        yield ready


@dataclass
class DevicePrefetcher:
    """Batches of a DataLoader of uint8 images (JpegImages(uint8=True)), delivered on `device` and
    normalised. On a GPU the copy and the normalising of the next batch run on a side stream
    during the current step (side_stream_batches); on a CPU there is nothing to overlap, so each
    batch is only normalised, in the training process. Iterating it is one pass over the loader."""
    loader: DataLoader
    device: torch.device

    # What harness.describe_loader() records: the wrapped DataLoader's own settings.
    num_workers = property(lambda self: self.loader.num_workers)
    pin_memory = property(lambda self: self.loader.pin_memory)
    persistent_workers = property(lambda self: self.loader.persistent_workers)
    prefetch_factor = property(lambda self: self.loader.prefetch_factor)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.device.type == "cuda":
            return side_stream_batches(self.loader, self.device)
        mean, std = imagenet_stats(self.device)
        return ((normalize(images.to(self.device), mean, std), labels.to(self.device))
                for images, labels in self.loader)


def prefetch_to_device(loader: DataLoader, run) -> DevicePrefetcher:
    """`loader`'s uint8 batches on run.device, normalised; see DevicePrefetcher."""
    run.config["to_device"] = ("side CUDA stream, one batch ahead, normalised there" if run.is_cuda
                               else "normalised in the training process (a CPU: no copy)")
    return DevicePrefetcher(loader, run.device)


# --- Shared memory for prefetched batches --------------------------------------------------------
# DataLoader workers hand finished batches to the training process as shared-memory tensors, which
# live in /dev/shm on Linux: up to num_workers x prefetch_factor batches wait there at once, and
# the one the training process is taking in. When /dev/shm is full a worker dies of SIGBUS ("bus
# error"); Docker gives a container 64 MB of it unless run with --shm-size.
SHM_PATH = Path("/dev/shm")
# Plan for at most this share of /dev/shm's free bytes (ours): other processes may share it (a
# second run, NCCL), and the free space can shrink while the run goes on.
SHM_USABLE_FRACTION = 0.8
BATCHES_IN_HAND = 1  # the batch the training process is receiving, still in /dev/shm meanwhile
BYTES_PER_GIB = 1024 ** 3  # what Docker's --shm-size=<n>g means


def shm_free_bytes() -> int | None:
    """Free bytes in SHM_PATH (None: no such file system here, e.g. macOS)."""
    try:
        return shutil.disk_usage(SHM_PATH).free
    except OSError:
        return None


def shm_needed_bytes(batch_bytes: int, num_workers: int, prefetch_factor: int) -> float:
    """/dev/shm free bytes that num_workers x prefetch_factor batches (and the one in hand) need,
    margin included."""
    return (num_workers * prefetch_factor + BATCHES_IN_HAND) * batch_bytes / SHM_USABLE_FRACTION


def shm_prefetch_factor(run, images: JpegImages, num_workers: int, wanted: int) -> int:
    """`wanted`, or the largest prefetch_factor below it whose batches fit in /dev/shm: a lowered
    value is printed and recorded in run.config. If even 1 does not fit: a one-line error naming
    Docker's --shm-size, exit code 2 (better than a worker's bus error mid-run)."""
    free = shm_free_bytes()
    if free is None:
        return wanted
    batch_bytes = run.batch_size * images.sample_bytes()
    fits = wanted
    while fits >= 1 and shm_needed_bytes(batch_bytes, num_workers, fits) > free:
        fits -= 1
    if fits == wanted:
        return wanted
    free_mb, batch = free / BYTES_PER_MB, f"{batch_bytes / BYTES_PER_MB:.3g} MB"
    workers = f"{num_workers} DataLoader worker{'s' if num_workers != 1 else ''}"
    wanted_gib = math.ceil(shm_needed_bytes(batch_bytes, num_workers, wanted) / BYTES_PER_GIB)
    shm_size = f"--shm-size={wanted_gib}g"
    if fits < 1:
        runs.fail(f"{SHM_PATH} has {free_mb:.0f} MB free, too little for {workers} to hand "
                     f"over even one {batch} batch each; give the container more shared memory: "
                     f"docker run {shm_size} ...")
    runs.log(run, f"prefetch_factor {fits}, not {wanted}: {workers} x {wanted} batches of "
                     f"{batch} do not fit in {SHM_PATH} ({free_mb:.0f} MB free); for {wanted}, "
                     f"docker run {shm_size}")
    run.config.update(prefetch_factor_wanted=wanted, shm_free_mb=round(free_mb))
    return fits


# Distinct batches staged on the device and taken in turn: two, so consecutive steps see different
# data while the device memory they hold stays small (a GPU-resident dataset, in effect).
STAGED_BATCHES = 2


def staged(run, make_batch) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """STAGED_BATCHES batches from make_batch(generator), generated on the CPU from run.seed (the
    same data on every device) and moved to the run's device before anything is measured."""
    generator = torch.Generator().manual_seed(run.seed)
    batches = []
    for _ in range(STAGED_BATCHES):
        inputs, targets = make_batch(generator)
        batches.append((inputs.to(run.device), targets.to(run.device)))
    return batches


def staged_images(run) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random images [batch, 3, image_px, image_px] and class labels [batch], on the device."""
    side, classes, batch = run.sizes["image_px"], run.sizes["num_classes"], run.batch_size
    return staged(run, lambda g: (torch.randn(batch, 3, side, side, generator=g),
                                  torch.randint(0, classes, (batch,), generator=g)))


def staged_tokens(run) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random token ids [batch, seq_len] and a target token per position, on the device."""
    vocab, shape = run.sizes["vocab"], (run.batch_size, run.sizes["seq_len"])
    return staged(run, lambda g: (torch.randint(0, vocab, shape, generator=g),
                                  torch.randint(0, vocab, shape, generator=g)))


def staged_features(run) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Random feature vectors [batch, width] and class labels [batch], on the device."""
    width, classes, batch = run.sizes["width"], run.sizes["num_classes"], run.batch_size
    return staged(run, lambda g: (torch.randn(batch, width, generator=g),
                                  torch.randint(0, classes, (batch,), generator=g)))


# Variable-length texts (padding_waste): lengths from a log-normal, as real text has (most short,
# a long tail). sigma 1.0: the longest of 32 is typically ~7x the median.
TEXT_LENGTH_SIGMA = 1.0
TEXT_MIN_TOKENS = 4


@dataclass
class Texts:
    """Token ids of variable-length texts (a list, one 1-D tensor each) and a class label each."""
    tokens: list[torch.Tensor]
    labels: torch.Tensor

    @property
    def lengths(self) -> np.ndarray:
        return np.array([len(t) for t in self.tokens])


def variable_length_texts(run) -> Texts:
    """One text per sample the run trains on (run.total_steps batches: one epoch), lengths
    log-normal around sizes["median_len"] and clipped to [TEXT_MIN_TOKENS, sizes["max_len"]],
    random tokens (1..vocab-1: harness.PAD_TOKEN_ID is padding) and labels, from run.seed."""
    sizes = run.sizes
    rng = np.random.default_rng(run.seed)
    count = run.batch_size * run.total_steps
    lengths = np.clip(rng.lognormal(np.log(sizes["median_len"]), TEXT_LENGTH_SIGMA, count),
                      TEXT_MIN_TOKENS, sizes["max_len"]).astype(int)
    generator = torch.Generator().manual_seed(run.seed)
    tokens = [torch.randint(1, sizes["vocab"], (int(n),), generator=generator) for n in lengths]
    return Texts(tokens, torch.randint(0, sizes["num_classes"], (count,), generator=generator))


def random_order(run, texts: Texts) -> np.ndarray:
    """The texts in a random order (a shuffled epoch), from run.seed."""
    return np.random.default_rng(run.seed).permutation(len(texts.tokens))


def length_sorted_order(run, texts: Texts) -> np.ndarray:
    """The texts sorted by length, cut into batches, and the batches shuffled (run.seed): every
    batch holds texts of about one length, and the epoch still visits lengths at random."""
    by_length = np.argsort(texts.lengths, kind="stable")
    batches = by_length.reshape(-1, run.batch_size)
    return batches[np.random.default_rng(run.seed).permutation(len(batches))].ravel()


def padded_batches(run, texts: Texts, order: np.ndarray
                   ) -> tuple[list[tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]],
                              list[tuple[int, int]]]:
    """The texts in `order`, run.batch_size at a time, each batch padded to its longest text:
    ((tokens [batch, longest], padding mask [batch, longest], True at padding), labels) on the
    device, and each batch's (real, padded) token counts."""
    batches, counts = [], []
    for start in range(0, len(order), run.batch_size):
        chosen = order[start:start + run.batch_size]
        rows = [texts.tokens[i] for i in chosen]
        tokens, mask = harness.padded(rows)
        batches.append(((tokens.to(run.device), mask.to(run.device)),
                        texts.labels[chosen].to(run.device)))
        counts.append((int(sum(len(r) for r in rows)), int(tokens.numel())))
    return batches, counts


# Prompts for generation (llm_decode): the same in both variants, from the run's seed.
PROMPT_COUNT = 8  # distinct prompts, taken in turn by the requests


def prompts(run) -> list[torch.Tensor]:
    """PROMPT_COUNT prompts of sizes["prompt_tokens"] random token ids each, [1, prompt_tokens] on
    the device, from run.seed."""
    generator = torch.Generator().manual_seed(run.seed)
    return [torch.randint(0, run.sizes["vocab"], (1, run.sizes["prompt_tokens"]),
                          generator=generator).to(run.device) for _ in range(PROMPT_COUNT)]


# Text requests (tokenizer_bound): English-like texts made here (common/bpe.py), and a BPE
# vocabulary trained on other texts of the same kind, so some request words are new to it.
VOCABULARY_TRAINING_TEXTS = 2000  # ~0.3 s of training on the project's 2-core box


def request_texts(run) -> list[str]:
    """One text per request the run serves (run.total_steps batches), sizes["words"] long at most
    and half that at least, from run.seed."""
    from common import bpe  # tokenizers: needed by this demo only
    words = run.sizes["words"]
    return bpe.corpus(run.batch_size * run.total_steps, seed=run.seed,
                      words_per_text=(words // 2, words))


def bpe_vocabulary(run):
    """A BPE vocabulary of sizes["vocab"] tokens and its merges, trained in-process on
    VOCABULARY_TRAINING_TEXTS texts from another seed than the requests'."""
    from common import bpe
    return bpe.train(bpe.corpus(VOCABULARY_TRAINING_TEXTS, seed=run.seed + 1), run.sizes["vocab"])
