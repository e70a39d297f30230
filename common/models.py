"""Models and optimizers for the demos, already on the run's device."""
from __future__ import annotations

import torch
import torchvision

SGD_LR = 0.1  # torchvision's ResNet reference recipe (batch 256)
SGD_MOMENTUM = 0.9
SGD_WEIGHT_DECAY = 1e-4


def resnet(run) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """ResNet-18, randomly initialised (weights=None: nothing is downloaded), and SGD."""
    model = torchvision.models.resnet18(weights=None, num_classes=run.sizes["num_classes"])
    model = model.to(run.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD_LR, momentum=SGD_MOMENTUM,
                                weight_decay=SGD_WEIGHT_DECAY)
    return model, optimizer
