# SPDX-License-Identifier: Apache-2.0
"""How far a result is from its reference, for the runtime's numeric tests."""
from __future__ import annotations

import torch


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """Relative error ||a - b|| / ||b|| in float64 on the host (either tensor may be on a GPU)."""
    a, b = a.double().cpu(), b.double().cpu()
    return ((a - b).norm() / b.norm()).item()
