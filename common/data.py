"""Data for the demos. The images are real JPEG files held in memory (as an image folder sits in
the page cache after the first epoch): every sample is decoded and augmented on the CPU, so the
cost a real input pipeline pays is paid here too."""
from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset
from torchvision import transforms

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
    transforms: random resized crop, flip, colour jitter, to-tensor, normalise)."""

    def __init__(self, length: int, source_px: int, crop_px: int, num_classes: int,
                 distinct_images: int, seed: int):
        rng = np.random.default_rng(seed)
        self.jpegs = []
        for _ in range(distinct_images):
            buffer = io.BytesIO()
            synthetic_photo(rng, source_px).save(buffer, format="JPEG", quality=JPEG_QUALITY)
            self.jpegs.append(buffer.getvalue())
        self.labels = torch.from_numpy(rng.integers(0, num_classes, size=length))
        self.augment = transforms.Compose([
            transforms.RandomResizedCrop(crop_px),
            transforms.RandomHorizontalFlip(),
            transforms.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.4, hue=0.1),
            transforms.ToTensor(),
            transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        jpeg = self.jpegs[index % len(self.jpegs)]
        image = Image.open(io.BytesIO(jpeg)).convert("RGB")
        return self.augment(image), self.labels[index]


def augmented_images(run) -> JpegImages:
    """Exactly enough samples for one run (warm-up, timed and profiled steps), so no epoch
    restarts in the middle of a measurement."""
    return JpegImages(length=run.total_steps * run.batch_size, seed=run.seed, **run.sizes)


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
