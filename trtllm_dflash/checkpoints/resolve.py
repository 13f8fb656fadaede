# SPDX-License-Identifier: Apache-2.0
"""Turn what the user typed (short name, local folder, Hugging Face hub id) into a local checkpoint folder.

Hub ids download with ``huggingface_hub`` (its own progress bars) and pin the commit that was fetched.
Known short names also carry the public config values of the real models (``PUBLIC_CONFIGS``) so that a
``--dry_run`` can plan a deployment with no network at all.
"""
from __future__ import annotations

import copy
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ..errors import DFlashError

UNTRAINED = "untrained"     # drafter spec: a random z-lab drafter written for the target (demo only)
PACKAGED_SMOLLM2 = "packaged:smollm2-135m"
# Drafters that ship inside this package (trtllm_dflash/drafters/<folder>), by the spec users type.
SHIPPED_DRAFTERS = {"smollm2-135m-dflash": "smollm2-135m-dflash-b16"}


@dataclass(frozen=True)
class KnownModel:
    target: str              # HF hub id, or PACKAGED_SMOLLM2
    drafter: str             # HF hub id of its DFlash drafter, or UNTRAINED


KNOWN_MODELS: dict[str, KnownModel] = {
    "gpt-oss-120b": KnownModel("openai/gpt-oss-120b", "z-lab/gpt-oss-120b-DFlash"),
    "gpt-oss-20b": KnownModel("openai/gpt-oss-20b", "z-lab/gpt-oss-20b-DFlash"),
    "qwen3-8b": KnownModel("Qwen/Qwen3-8B", "z-lab/Qwen3-8B-DFlash-b16"),
    "llama-3.1-8b": KnownModel("meta-llama/Llama-3.1-8B-Instruct", "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"),
    # trained by dflash-train on 6k ShareGPT answers; see trtllm_dflash/drafters/*/README.md
    "smollm2-135m": KnownModel(PACKAGED_SMOLLM2, "smollm2-135m-dflash"),
}


def _drafter(hidden, inter, layers, heads, kv, head_dim, block, ids, n_target, mask, vocab, rope, bias=False):
    return {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "hidden_size": hidden,
            "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv, "head_dim": head_dim, "block_size": block, "num_target_layers": n_target,
            "dflash_config": {"mask_token_id": mask, "target_layer_ids": ids}, "vocab_size": vocab,
            "rope_theta": rope, "attention_bias": bias, "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


def _gpt_oss(layers, experts):
    return {"architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "hidden_size": 2880,
            "num_hidden_layers": layers, "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
            "intermediate_size": 2880, "num_local_experts": experts, "num_experts_per_tok": 4,
            "vocab_size": 201088, "max_position_embeddings": 131072, "rope_theta": 150000,
            "tie_word_embeddings": False}


# Public config.json values of the real checkpoints, used only by --dry_run (the real build reads the
# downloaded config.json). Sources: each model's config.json on the Hugging Face hub
# (huggingface.co/<id>/blob/main/config.json) and the z-lab drafters' model cards; the gpt-oss-120b drafter's
# heads/head_dim are taken from the gpt-oss-20b drafter's config (same hidden size);
# the Llama drafter's mask_token_id is unverified (a Llama-3 reserved special id).
PUBLIC_CONFIGS: dict[str, dict] = {
    "openai/gpt-oss-120b": _gpt_oss(36, 128),
    "openai/gpt-oss-20b": _gpt_oss(24, 32),
    "z-lab/gpt-oss-120b-DFlash": _drafter(2880, 7680, 8, 64, 8, 64, 10, [1, 9, 17, 25, 33], 36, 200000, 201088,
                                          150000, bias=True),
    "z-lab/gpt-oss-20b-DFlash": _drafter(2880, 7680, 8, 64, 8, 64, 8, [1, 6, 11, 16, 21], 24, 200000, 201088,
                                         150000, bias=True),
    "Qwen/Qwen3-8B": {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 4096,
                      "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                      "intermediate_size": 12288, "vocab_size": 151936, "max_position_embeddings": 40960,
                      "rope_theta": 1000000, "tie_word_embeddings": False},
    "z-lab/Qwen3-8B-DFlash-b16": _drafter(4096, 12288, 5, 32, 8, 128, 16, [1, 9, 17, 25, 33], 36, 151669, 151936,
                                          1000000),
    "meta-llama/Llama-3.1-8B-Instruct": {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 14336,
        "vocab_size": 128256, "max_position_embeddings": 131072, "rope_theta": 500000, "tie_word_embeddings": False},
    "z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat": _drafter(4096, 12288, 5, 32, 8, 128, 10, [1, 8, 15, 22, 29], 32,
                                                            128002, 128256, 500000),
    PACKAGED_SMOLLM2: {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 576,
                       "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64,
                       "intermediate_size": 1536, "vocab_size": 49152, "max_position_embeddings": 8192,
                       "rope_theta": 100000, "tie_word_embeddings": True},
}

# Files a deployment needs from a hub repo: weights, configs, tokenizer, chat template, remote code.
# gpt-oss repos also hold original/ and metal/ copies of the weights, which we never download.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken", "*.py"]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class Resolved:
    """A checkpoint as a local folder (``path`` is None in a dry run of a hub id)."""

    spec: str                 # what the user typed
    source: str               # hub id, absolute local path, PACKAGED_SMOLLM2, a SHIPPED_DRAFTERS key or UNTRAINED
    kind: str                 # hub | local | packaged | untrained
    path: Path | None
    revision: str | None      # hub commit sha when known


def expand_short_name(target: str, drafter: str | None) -> tuple[str, str]:
    """Short names resolve to the HF target and its known drafter; an explicit --drafter wins."""
    known = KNOWN_MODELS.get(target.lower())
    if known is not None:
        return known.target, drafter or known.drafter
    if "/" not in target and not Path(target).expanduser().exists():
        # Neither a short name, a folder nor a hub id (owner/name): a mistyped target, not a drafter problem.
        raise DFlashError("target", f"{target!r} is not a short name, a folder or a hub id (owner/name)",
                          did_you_mean(target) + f"use a short name ({', '.join(KNOWN_MODELS)}), a folder or a hub id")
    if drafter is None:
        raise DFlashError("drafter", f"no known DFlash drafter for target {target!r}",
                          f"pass --drafter (hub id or folder), or use a short name: {', '.join(KNOWN_MODELS)}")
    return target, drafter


def did_you_mean(name: str) -> str:
    """``"did you mean X? "`` for the closest short name, or nothing."""
    import difflib

    close = difflib.get_close_matches(name.lower(), list(KNOWN_MODELS), n=1, cutoff=0.6)
    return f"did you mean {close[0]}? " if close else ""


def public_config(source: str) -> dict | None:
    cfg = PUBLIC_CONFIGS.get(source)
    return None if cfg is None else copy.deepcopy(cfg)


def resolve(spec: str, *, role: str, revision: str | None = None, download: bool = True) -> Resolved:
    """A local folder for ``spec`` (role is 'target' or 'drafter', for messages).

    ``download=False`` (dry run) never touches the network: hub ids come back with ``path=None`` unless a
    copy is already in the local HF cache.
    """
    if spec == UNTRAINED:
        return Resolved(spec, UNTRAINED, "untrained", None, None)
    if spec in SHIPPED_DRAFTERS:  # already on disk, so dry runs read it too
        return Resolved(spec, spec, "packaged", shipped_drafter_dir(spec), None)
    if spec == PACKAGED_SMOLLM2:
        if not download:
            return Resolved(spec, spec, "packaged", None, None)
        from . import packaged  # written by another stage; imported only when the demo target is used

        return Resolved(spec, spec, "packaged", Path(packaged.smollm2_target_dir()), None)
    local = Path(spec).expanduser()
    if local.exists() or spec.startswith((".", "/", "~")):
        if not local.is_dir():
            raise DFlashError(role, f"{spec} is not a directory", "pass a Hugging Face checkpoint folder")
        return Resolved(spec, str(local.resolve()), "local", local.resolve(), None)
    if not _HUB_ID.match(spec):
        raise DFlashError(role, f"{spec!r} is neither a local folder, a hub id (org/name) nor a short name",
                          f"pass a folder, an org/name hub id, or one of {', '.join(KNOWN_MODELS)}")
    return _from_hub(spec, role=role, revision=revision, download=download)


def shipped_drafter_dir(name: str) -> Path:
    path = Path(__file__).resolve().parent.parent / "drafters" / SHIPPED_DRAFTERS[name]
    if not (path / "model.safetensors").is_file():
        raise DFlashError("drafter", f"{name} is missing from this installation ({path})",
                          "reinstall trtllm-dflash (the wheel ships trtllm_dflash/drafters), or pass a drafter folder")
    return path


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0", "false", "False")


@contextmanager
def _hub_errors(repo_id: str, role: str):
    """Hub failures as one-line DFlashErrors that name HF_HUB_OFFLINE and local folders."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled

    try:
        yield
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as err:
        why = ("is not in the local HF cache and HF_HUB_OFFLINE is set" if _offline()
               else f"cannot be downloaded ({str(err).splitlines()[0]})")
        raise DFlashError(role, f"{repo_id} {why}",
                          "download it where the hub is reachable (HF_HUB_OFFLINE unset) into the HF cache, "
                          "or pass a local folder (e.g. --target /models/x --drafter /models/y)") from None
    except (HfHubHTTPError, OSError, ValueError) as err:
        raise DFlashError(role, f"{repo_id} could not be fetched from the hub ({type(err).__name__}: "
                          f"{str(err).splitlines()[0] if str(err) else ''})",
                          "check the id and your network, or pass a local folder") from None


def _from_hub(repo_id: str, *, role: str, revision: str | None, download: bool) -> Resolved:
    import huggingface_hub as hf
    from huggingface_hub.errors import LocalEntryNotFoundError

    if not download:
        # Dry runs and planning: the local cache only, never the network.
        try:
            path = Path(hf.snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS,
                                             local_files_only=True))
        except (LocalEntryNotFoundError, OSError, ValueError):
            return Resolved(repo_id, repo_id, "hub", None, revision)
        return Resolved(repo_id, repo_id, "hub", path, path.name)
    with _hub_errors(repo_id, role):
        path = Path(hf.snapshot_download(repo_id, revision=revision, allow_patterns=HUB_PATTERNS,
                                         local_files_only=_offline()))
    # snapshot folders are named by the commit they hold: that is the revision we pin in the manifest.
    return Resolved(repo_id, repo_id, "hub", path, path.name)


def fetch_config(res: Resolved, role: str) -> Path:
    """Only config.json of a hub checkpoint (validation runs before the weights are downloaded)."""
    import huggingface_hub as hf

    with _hub_errors(res.source, role):
        cfg = hf.hf_hub_download(res.source, "config.json", revision=res.revision, local_files_only=_offline())
    return Path(cfg).parent
