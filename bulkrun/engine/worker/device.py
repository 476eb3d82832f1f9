"""Which device a run uses: the one asked for, else CUDA where there is one, else the CPU."""

from __future__ import annotations

import torch


def resolve_device(requested: str | None) -> torch.device:
    return torch.device(requested or ("cuda" if torch.cuda.is_available() else "cpu"))
