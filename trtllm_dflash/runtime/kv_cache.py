# SPDX-License-Identifier: Apache-2.0
"""Static KV cache: one preallocated [layers, max_batch, kv_heads, max_seq_len, head_dim] pair.

A request owns one row (slot) and its tokens sit at their absolute positions. Rows written for
rejected draft tokens are never cropped: attention masks keys by position (< the committed length),
and the next verify block starts exactly where the rejected rows begin, so it overwrites them.
"""
from __future__ import annotations

import torch


class KVCache:
    def __init__(self, num_layers: int, max_batch: int, kv_heads: int, max_seq_len: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (num_layers, max_batch, kv_heads, max_seq_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_seq_len = max_seq_len
        self._rows = torch.arange(max_batch, device=device)  # slot ids: a slice of it is a view, not a kernel

    def write(self, layer: int, rows, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        # k, v [n, T, H, d] at positions [n, T] of cache rows `rows` (slice or index tensor [n])
        r = self.row_ids(rows)[:, None]
        self.k[layer][r, :, positions] = k  # the indexed view is [n, T, H, d]
        self.v[layer][r, :, positions] = v

    def row_ids(self, rows) -> torch.Tensor:
        """rows (slice or index tensor [n]) -> index tensor [n]; a decode step's rows [0, n) are a view of a
        preallocated arange, not a kernel per layer."""
        return self._rows[rows] if isinstance(rows, slice) else rows

    def read(self, layer: int, rows, kv_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        # -> k, v [n, H, kv_len, d]; a view for a slice of rows, a gather for an index tensor
        return self.k[layer][rows, :, :kv_len], self.v[layer][rows, :, :kv_len]

    @property
    def nbytes(self) -> int:
        return 2 * self.k.numel() * self.k.element_size()
