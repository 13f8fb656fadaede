# SPDX-License-Identifier: Apache-2.0
"""A deployment is checked before a server starts on it: the config.json and safetensors headers of its
checkpoints (``Deployment.open`` checked the manifest). A broken one is one line naming the file and the fix,
before Triton or the engine starts.

Why: a truncated safetensors file gave dflash-openai a 44-line traceback that named no file, and dflash-serve
"tritonserver exited with code 1 ... see its log above", with the cause in Triton's model table; an invalid
manifest.json the same. Reading each file's header (8 bytes of length, then JSON) and comparing the tensor
data it declares with the file's size costs milliseconds, whatever the model's size.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

from ..deployment import Deployment
from ..errors import DFlashError

FIX = "rebuild the deployment with dflash-build --force (or fetch the checkpoint again)"
MAX_HEADER = 100 << 20       # safetensors' own bound on the header


def check_safetensors(path: Path) -> None:
    """``path`` has a readable safetensors header whose tensors fit in the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            raw = fh.read(8)
            if len(raw) < 8:
                raise DFlashError(str(path), f"is {size} bytes, too short for a safetensors file", FIX)
            (n,) = struct.unpack("<Q", raw)
            if n > MAX_HEADER or 8 + n > size:
                raise DFlashError(str(path), f"is not a safetensors file or is truncated (header of {n} bytes, "
                                  f"file of {size})", FIX)
            header = json.loads(fh.read(n))
    except DFlashError:          # a ValueError too: not the JSON failure below
        raise
    except OSError as err:
        raise DFlashError(str(path), f"cannot be read ({err.strerror})", FIX) from None
    except (ValueError, UnicodeDecodeError):
        raise DFlashError(str(path), "has a header that is not JSON (not a safetensors file, or corrupt)", FIX) from None
    if not isinstance(header, dict):
        raise DFlashError(str(path), "has a header that is not a JSON object", FIX)
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise DFlashError(str(path), f"has a bad entry for tensor {name[:60]!r} in its header", FIX)
        end = max(end, offsets[1])
    if 8 + n + end > size:
        raise DFlashError(str(path), f"is truncated: its header declares {end} bytes of tensor data, the file "
                          f"holds {size - 8 - n}", FIX)


def check_deployment(deployment: Deployment) -> Deployment:
    """``deployment``, after checking every checkpoint the servers load (target/, drafter/, ranks/): their
    config.json and the header of each safetensors file; DFlashError naming the first broken file. (Its
    manifest was checked when it was opened.)"""
    parts = [(deployment.target_dir, True)]
    if isinstance(deployment.drafter.get("path"), str):
        parts.append((deployment.path / deployment.drafter["path"], True))
    parts.append((deployment.path / "ranks", False))
    for root, needed in parts:
        if not root.exists():
            if needed:
                raise DFlashError(str(root), "is missing", FIX)
            continue
        if needed:
            config = root / "config.json"
            try:
                json.loads(config.read_bytes())
            except OSError:
                raise DFlashError(str(config), "is missing or unreadable", FIX) from None
            except (ValueError, UnicodeDecodeError) as err:
                raise DFlashError(str(config), f"is not valid JSON ({str(err)[:80]})", FIX) from None
        for file in sorted(root.rglob("*.safetensors")):
            check_safetensors(file)
    return deployment
