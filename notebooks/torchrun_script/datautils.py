"""The data of train.py: a small regression set, made the same on every rank (seeded)."""

import torch
from torch.utils.data import Dataset


class NoisyLine(Dataset):
    """``y = x · w + noise`` for 8 features: a loss that falls fast, and a final loss to compare."""

    def __init__(self, size: int = 2048) -> None:
        generator = torch.Generator().manual_seed(1234)
        self.x = torch.randn(size, 8, generator=generator)
        weights = torch.arange(1.0, 9.0).unsqueeze(1) / 8
        self.y = self.x @ weights + 0.05 * torch.randn(size, 1, generator=generator)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]
