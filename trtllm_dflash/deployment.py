# SPDX-License-Identifier: Apache-2.0
"""A dflash-build deployment directory as a value: ``Deployment.open(path)`` reads and checks its
manifest.json once; everything that runs, serves or measures a deployment asks this object, never the file.

Layout (written by ``dflash-build``, the manifest last)::

  DIR/manifest.json          what went in, with which settings, and the sha256 of every file (format below)
  DIR/target/ DIR/drafter/   the HF checkpoints the runtimes load (paths named by the manifest)
  DIR/ranks/rankN.safetensors  this rank's slices, when built with --presharded
  DIR/llm_api_options.yaml   TensorRT-LLM's options (backend trtllm)
  DIR/triton/                the filled Triton model repository

``Deployment.write`` is the one writer of manifest.json: it stamps ``format_version``, so a reader built for
another format refuses the directory with one line instead of misreading it.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from .errors import DFlashError

MANIFEST = "manifest.json"
FORMAT_VERSION = 1
BACKENDS = ("torch", "trtllm")     # the runtime a deployment is built for (dflash-build --backend)
_REBUILD = "rebuild it with this version of dflash-build (--force)"


@dataclass(frozen=True)
class Deployment:
    """One deployment directory and its parsed manifest (``manifest``: the JSON object as written)."""

    path: Path
    manifest: dict = field(repr=False, compare=False)

    # ---- reading -------------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path) -> "Deployment":
        """Read ``path/manifest.json`` once and check it; DFlashError naming the file and the fix."""
        path = Path(path).expanduser().absolute()
        file = path / MANIFEST
        if not file.is_file():
            raise DFlashError(str(path), f"has no {MANIFEST}: not a complete deployment directory",
                              "pass a directory written by dflash-build (a killed build leaves none)")
        try:
            data = json.loads(file.read_bytes())
        except OSError as err:
            raise DFlashError(str(file), f"cannot be read ({err.strerror})", _REBUILD) from None
        except (ValueError, UnicodeDecodeError) as err:
            # a truncated file lands here too ("Expecting ..." at its last character)
            raise DFlashError(str(file), f"is not valid JSON, or is truncated ({str(err)[:80]})", _REBUILD) from None
        if not isinstance(data, dict):
            raise DFlashError(str(file), f"is a JSON {type(data).__name__}, not an object", _REBUILD)
        if data.get("format_version") != FORMAT_VERSION:
            raise DFlashError(f"{file}: format_version", f"is {data.get('format_version')!r}, this version reads "
                              f"{FORMAT_VERSION}", _REBUILD)
        if data.get("backend") not in BACKENDS:
            raise DFlashError(f"{file}: backend", f"is {data.get('backend')!r}, not one of {', '.join(BACKENDS)}",
                              _REBUILD)
        for key in ("tp_size", "ep_size"):
            value = data.get(key, 1)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise DFlashError(f"{file}: {key}", f"is {value!r}, not a positive integer", _REBUILD)
        return cls(path, data)

    @classmethod
    def of(cls, where: "Deployment | str | Path") -> "Deployment":
        """``where`` itself when it is already open (read once), else ``open(where)``: for APIs whose
        callers hold either."""
        return where if isinstance(where, Deployment) else cls.open(where)

    @staticmethod
    def is_deployment(path: str | Path) -> bool:
        """Whether ``path`` has a manifest (a finished build), without reading it."""
        return (Path(path) / MANIFEST).is_file()

    # ---- writing -------------------------------------------------------------------------------------
    @staticmethod
    def write(directory: str | Path, record: dict) -> None:
        """Write ``record`` as ``directory/manifest.json`` (format_version stamped): flushed and fsynced to a
        temporary file beside it, then renamed over it, so a killed writer leaves the old file or none."""
        path = Path(directory) / MANIFEST
        data = {**record, "format_version": FORMAT_VERSION}
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        with open(tmp, "w") as fh:
            json.dump(data, fh, indent=2, sort_keys=True)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    # ---- what the manifest says ----------------------------------------------------------------------
    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    @property
    def backend(self) -> str:
        """The runtime the directory was built for: torch (this package's engine) or trtllm (TensorRT-LLM)."""
        return self.manifest["backend"]

    @property
    def tp_size(self) -> int:
        return int(self.manifest.get("tp_size", 1))

    @property
    def ep_size(self) -> int:
        return int(self.manifest.get("ep_size", 1))

    @property
    def gpu(self) -> str | None:
        """The hardware profile it was built for (build_configs/)."""
        return self.manifest.get("gpu")

    @property
    def runtime(self) -> dict:
        """The manifest's runtime settings (max_batch_size, max_seq_len, block_size, dtype, draft_policy)."""
        return dict(self.manifest.get("runtime") or {})

    @property
    def draft_policy(self) -> str:
        """adaptive or fixed; directories built before the field existed ran fixed."""
        return self.runtime.get("draft_policy", "fixed")

    def runtime_config(self, overrides: dict | None = None):
        """The torch runtime's RuntimeConfig: the manifest's settings, then ``overrides`` (a server's flags)."""
        from .config import RuntimeConfig

        merged = {**self.runtime, **(overrides or {})}
        unknown = sorted(set(overrides or {}) - set(RuntimeConfig.__dataclass_fields__))
        if unknown:
            raise DFlashError(unknown[0], "is not a runtime setting (RuntimeConfig)", "drop it")
        return RuntimeConfig(**{k: v for k, v in merged.items() if k in RuntimeConfig.__dataclass_fields__})

    @property
    def target(self) -> dict:
        """The manifest's record of the target (source, revision, architecture, path, ...)."""
        return dict(self.manifest.get("target") or {})

    @property
    def drafter(self) -> dict:
        return dict(self.manifest.get("drafter") or {})

    @property
    def target_dir(self) -> Path:
        return self.path / self.target.get("path", "target")

    @property
    def drafter_dir(self) -> Path | None:
        """The drafter checkpoint, or None when the directory has none (an autoregressive deployment)."""
        path = self.path / self.drafter.get("path", "drafter")
        return path if path.is_dir() else None

    def rank_file(self, rank: int) -> Path | None:
        """``ranks/rank<rank>.safetensors`` (this rank's slices, --presharded builds), or None without one."""
        path = self.path / "ranks" / f"rank{rank}.safetensors"
        return path if path.is_file() else None

    @property
    def trtllm(self) -> dict:
        """What the build recorded about TensorRT-LLM (options file, versions, draft length schedule, ...);
        empty for a torch build."""
        return dict(self.manifest.get("trtllm") or {})

    @property
    def llm_api_options(self) -> Path | None:
        """TensorRT-LLM's options file (trtllm-serve --extra_llm_api_options); None for a torch build."""
        options = self.trtllm.get("options")
        return self.path / options if options else None

    @property
    def quant(self) -> dict | None:
        """quantize.QuantRecord as a dict, for a target quantized by the build; None otherwise."""
        return self.manifest.get("quant")

    @property
    def triton_repo(self) -> Path:
        """The model repository dflash-build filled (dflash-serve serves it)."""
        return self.path / "triton"

    def require_backend(self, backend: str, who: str, fix: str) -> None:
        """DFlashError unless the directory was built for ``backend`` (``who``: what needs it)."""
        if self.backend != backend:
            raise DFlashError(f"{self.manifest_path}: backend", f"is {self.backend!r}; {who} runs {backend!r} builds",
                              fix)
