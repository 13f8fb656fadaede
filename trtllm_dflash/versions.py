# SPDX-License-Identifier: Apache-2.0
"""Installed package versions, for the manifests, reports and benchmark results that record them."""
from __future__ import annotations

import importlib.metadata


def installed(*dists: str) -> dict[str, str | None]:
    """Each distribution's installed version; None where it is not installed."""
    out: dict[str, str | None] = {}
    for dist in dists:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    return out
