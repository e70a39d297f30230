"""Data for the demos. The images are real JPEG files held in memory (as an image folder sits in
the page cache after the first epoch): every sample is decoded and augmented on the CPU, so the
cost a real input pipeline pays is paid here too."""
from __future__ import annotations

import io
import math
import shutil
from collections.abc import Callable, Iterator
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
# The colour jitter of torchvision's ImageNet-style recipes (ColorJitter's arguments): brightness,
# contrast and saturation factors drawn from [1 - x, 1 + x], a hue shift from [-x, x] of a turn.
JITTER_BRIGHTNESS = JITTER_CONTRAST = JITTER_SATURATION = 0.4
JITTER_HUE = 0.1


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
    float32 takes 4), and normalize() gives a batch of them the same values later.
    jitter=False leaves the colour jitter out too, for apply_jitter() to do on a whole batch."""

    def __init__(self, length: int, source_px: int, crop_px: int, num_classes: int,
                 distinct_images: int, seed: int, uint8: bool = False, jitter: bool = True):
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
        if not (uint8 or jitter):
            raise ValueError("jitter=False needs uint8=True: the jitter comes before normalising")
        self.crop_px, self.uint8, self.jitter = crop_px, uint8, jitter
        to_tensor = ([transforms.PILToTensor()] if uint8 else
                     [transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
        colors = [transforms.ColorJitter(brightness=JITTER_BRIGHTNESS, contrast=JITTER_CONTRAST,
                                         saturation=JITTER_SATURATION, hue=JITTER_HUE)]
        self.augment = transforms.Compose([
            transforms.RandomResizedCrop(crop_px),
            transforms.RandomHorizontalFlip(),
            *(colors if jitter else []),
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


def augmented_images(run, uint8: bool = False, jitter: bool = True) -> JpegImages:
    """Enough samples for one run (warm-up, timed and profiled steps, run.loader_steps), so no
    epoch restarts in the middle of a measurement. uint8, jitter: see JpegImages."""
    run.config["batch_dtype"] = "uint8" if uint8 else "float32"
    sizes = {key: value for key, value in run.sizes.items() if key != "resnet_depth"}  # model's
    return JpegImages(length=run.loader_steps * run.batch_size, seed=run.seed, uint8=uint8,
                      jitter=jitter, **sizes)


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


# --- Colour jitter on a batch --------------------------------------------------------------------
# ColorJitter on a PIL image is most of a worker's time per image (2.3 of 3.7 ms for a 224 px crop
# on the project's 2-core box, the hue alone 1.7: a round trip through HSV). On a batch on the
# device it is a few passes over memory. The same adjustments as torchvision's on tensors
# (transforms.functional.adjust_*), each image with its own four factors and its own order of
# them, as ColorJitter draws them per image.
def blend(images: torch.Tensor, other: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """factor * images + (1 - factor) * other, in [0, 1]; factor [batch, 1, 1, 1]."""
    return (factor * images + (1 - factor) * other).clamp(0, 1)


def shift_hue(images: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Each image's hue turned by its shift (a share of a turn, [batch, 1, 1, 1]): to HSV as
    torchvision (and Pillow) convert, and back by the closed form f(n) = v - v s clamp(min(k,
    4 - k), 0, 1), k = (n + 6 h) mod 6, n = 5, 3, 1 for red, green, blue."""
    r, g, b = images.unbind(dim=1)
    value, low = images.amax(dim=1), images.amin(dim=1)
    chroma = value - low
    gray = chroma == 0  # no hue: any value of it gives the same colour back
    saturation = chroma / torch.where(gray, torch.ones_like(value), value)
    divisor = torch.where(gray, torch.ones_like(chroma), chroma)
    rc, gc, bc = (value - r) / divisor, (value - g) / divisor, (value - b) / divisor
    hue = torch.where(value == r, bc - gc,
                      torch.where(value == g, 2.0 + rc - bc, 4.0 + gc - rc))
    hue = torch.remainder(hue / 6.0 + shift.view(-1, 1, 1), 1.0)
    k = torch.remainder(torch.tensor((5.0, 3.0, 1.0), device=images.device).view(1, 3, 1, 1)
                        + 6.0 * hue.unsqueeze(1), 6.0)
    ramp = torch.minimum(k, 4.0 - k).clamp(0, 1)
    return value.unsqueeze(1) * (1 - saturation.unsqueeze(1) * ramp)


def apply_jitter(images: torch.Tensor, factors: torch.Tensor, order: torch.Tensor
                 ) -> torch.Tensor:
    """images [batch, 3, H, W] in [0, 1]; factors [batch, 4]: brightness, contrast, saturation
    (multipliers) and hue (a shift); order [batch, 4]: each image's permutation of the four.
    Every stage computes each adjustment and keeps, per image, the one its order names there."""
    from torchvision.transforms.v2.functional import rgb_to_grayscale  # see JpegImages
    per_image = factors.view(-1, 4, 1, 1, 1).unbind(dim=1)
    for stage in range(4):
        pick = order[:, stage].view(-1, 1, 1, 1)
        gray = rgb_to_grayscale(images)  # [batch, 1, H, W]
        adjusted = (blend(images, torch.zeros_like(images), per_image[0]),
                    blend(images, gray.mean(dim=(1, 2, 3), keepdim=True), per_image[1]),
                    blend(images, gray, per_image[2]),
                    shift_hue(images, per_image[3]))
        images = torch.where(pick == 0, adjusted[0], torch.where(
            pick == 1, adjusted[1], torch.where(pick == 2, adjusted[2], adjusted[3])))
    return images


def jitter_draws(batch: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """ColorJitter's random draws for `batch` images, on the generator's device: the factors
    (apply_jitter's) and each image's order of the four adjustments."""
    device = generator.device
    uniform = torch.rand(batch, 4, generator=generator, device=device) * 2 - 1  # in [-1, 1)
    order = torch.rand(batch, 4, generator=generator, device=device).argsort(dim=1)
    # Numbers, not a tensor of them: on a GPU, torch.tensor(numbers) is a copy the host waits for
    factors = [centre + spread * uniform[:, k] for k, (centre, spread) in enumerate(
        ((1.0, JITTER_BRIGHTNESS), (1.0, JITTER_CONTRAST), (1.0, JITTER_SATURATION),
         (0.0, JITTER_HUE)))]
    return torch.stack(factors, dim=1), order


# --- Getting batches onto the device -------------------------------------------------------------
# .to(device, non_blocking=True) on a pinned batch frees the CPU, but the copy still waits in the
# *current* stream behind the kernels already queued there (the previous step), and the next step
# waits behind the copy: nothing overlaps on the GPU. A second stream carries the copy (and the
# normalising) of batch N+1 while the compute stream runs step N; timm's PrefetchLoader does this.


def jittered_normalized(images: torch.Tensor, factors: torch.Tensor, order: torch.Tensor,
                        mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 images [batch, 3, H, W] -> what the workers' ColorJitter, ToTensor and Normalize
    give: / 255, apply_jitter, - mean, / std."""
    return (apply_jitter(images.float() / 255, factors, order) - mean) / std


def jitter_on_device(device: torch.device, seed: int
                     ) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """jittered_normalized(images, <draws>, mean, std) as a function of (images, mean, std), its
    draws from a generator on `device` seeded with `seed`. Compiled: eager, each stage's four
    adjustments are ~60 kernels over the batch (86 ms for 64 images of 64 px on one CPU core,
    21 ms compiled)."""
    generator = torch.Generator(device=device).manual_seed(seed)
    compiled = torch.compile(jittered_normalized)

    def jitter(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
        return compiled(images, *jitter_draws(images.shape[0], generator), mean, std)
    return jitter


def side_stream_batches(loader: DataLoader, device: torch.device, jitter_seed: int | None = None
                        ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(images, labels) of `loader` on the CUDA `device`, images normalised (and jittered, with
    a seed: jitter_on_device): each batch is copied and prepared on a side stream while the
    compute stream runs the step on the one before."""
    side = torch.cuda.Stream(device=device)
    with torch.cuda.stream(side):  # made, and only ever read, on the side stream
        mean, std = imagenet_stats(device)
        prepare = normalize if jitter_seed is None else jitter_on_device(device, jitter_seed)
    ready = None
    for images, labels in loader:
        with torch.cuda.stream(side):  # queued on the side stream: runs beside the step's kernels
            images = prepare(images.to(device, non_blocking=True), mean, std)
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
    normalised; with a jitter_seed, colour-jittered first (JpegImages(jitter=False) left it out).
    On a GPU the copy and the preparing of the next batch run on a side stream during the
    current step (side_stream_batches); on a CPU there is nothing to overlap, so each batch is
    only prepared, in the training process. Iterating it is one pass over the loader."""
    loader: DataLoader
    device: torch.device
    jitter_seed: int | None = None

    # What harness.describe_loader() records: the wrapped DataLoader's own settings.
    num_workers = property(lambda self: self.loader.num_workers)
    pin_memory = property(lambda self: self.loader.pin_memory)
    persistent_workers = property(lambda self: self.loader.persistent_workers)
    prefetch_factor = property(lambda self: self.loader.prefetch_factor)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self.device.type == "cuda":
            return side_stream_batches(self.loader, self.device, self.jitter_seed)
        mean, std = imagenet_stats(self.device)
        prepare = (normalize if self.jitter_seed is None
                   else jitter_on_device(self.device, self.jitter_seed))
        return ((prepare(images.to(self.device), mean, std), labels.to(self.device))
                for images, labels in self.loader)


def prefetch_to_device(loader: DataLoader, run, jitter: bool = False) -> DevicePrefetcher:
    """`loader`'s uint8 batches on run.device, normalised; jitter=True: colour-jittered there
    first, a whole batch at once (for JpegImages(jitter=False)); see DevicePrefetcher."""
    if getattr(loader.dataset, "jitter", not jitter) == jitter:
        raise ValueError("jitter=True wants a dataset that leaves the jitter out (JpegImages("
                         "jitter=False)), and jitter=False one that does it: once, either way")
    prepared = "jittered and normalised" if jitter else "normalised"
    run.config["to_device"] = (f"side CUDA stream, one batch ahead, {prepared} there"
                               if run.is_cuda else
                               f"{prepared} in the training process (a CPU: no copy)")
    if jitter:
        harness.require_compile_toolchain(run)  # the jitter is compiled: see jitter_on_device
        run.config["color_jitter"] = "on the device, a whole batch at once"
    return DevicePrefetcher(loader, run.device, run.seed if jitter else None)


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
