# SPDX-License-Identifier: Apache-2.0
"""What a model's Hugging Face config.json says, as frozen dataclasses: the targets the torch runtime runs and the
DFlash drafter. One ``ModelConfig`` base owns the fields every decoder has and how config.json spells them; each
family adds its own.

This module reads no weights and imports no torch: ``checkpoints/`` validates a pair with it before anything is
loaded, and ``runtime/`` builds its modules from the same objects (the arrow points from both down to here).
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import DFlashError

LLAMA_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
GPT_OSS_ARCHITECTURES = ("GptOssForCausalLM",)
# Every target architecture the torch runtime has a model for (runtime/models/__init__.py maps each to its family).
TORCH_RUNTIME_ARCHITECTURES = LLAMA_ARCHITECTURES + GPT_OSS_ARCHITECTURES

# transformers' GptOssConfig fills these when config.json has no rope_scaling / rope_parameters.
YARN_DEFAULT = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 4096}
# Optional reference-package drafter fields that change the math; we refuse them rather than ignore them.
_DRAFTER_UNSUPPORTED = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None}


def rope_parameters(cfg: dict) -> dict:
    """One RoPE dict from either config style: transformers 5 ``rope_parameters`` or the older
    ``rope_theta`` + ``rope_scaling`` pair that hub configs still carry."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params = {**scaling, **params}
    params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default")) or "default"
    return params


def gpt_oss_rope(cfg: dict) -> dict:
    """RoPE parameters as transformers' GptOssConfig reads config.json: YaRN defaults when none are given
    (also used for gpt-oss DFlash drafters, whose config.json says ``model_type: gpt_oss`` and has none)."""
    has_scaling = cfg.get("rope_scaling") or (cfg.get("rope_parameters") or {}).get("rope_type")
    cfg = {**cfg, "rope_theta": cfg.get("rope_theta", 150000.0)}  # GptOssConfig.default_theta
    return rope_parameters(cfg if has_scaling else {**cfg, "rope_scaling": YARN_DEFAULT})


def build_target_layer_ids(num_target_layers: int, num_features: int) -> list[int]:
    """The DFlash paper's default taps: uniform from the 2nd layer to the 3rd-to-last."""
    if num_features == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_features - 1)) for i in range(num_features)]


def architecture(cfg: dict) -> str:
    return (cfg.get("architectures") or ["?"])[0]


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """The decoder fields every model here has. ``vocab_size`` is None only for a drafter whose config.json leaves
    it out (it shares the target's embeddings and lm_head)."""

    vocab_size: int | None
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope: dict
    max_position_embeddings: int
    attention_bias: bool

    @staticmethod
    def shared_fields(cfg: dict, who: str, fix: str, *, rope: dict, head_dim: int | None = None,
                      rms_norm_eps: float = 1e-6, max_position_embeddings: int = 4096,
                      attention_bias: bool = False, required: tuple[str, ...] = ()) -> dict:
        """The base's fields from config.json, in its spelling (num_hidden_layers, num_attention_heads, ...). The
        keyword defaults are what config.json may leave out; families whose transformers config class fills other
        values pass those. A missing required field is a DFlashError naming it, ``who`` and ``fix``."""
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", *required):
            if name not in cfg:
                raise DFlashError(f"{who} config.json {name}", "missing", fix)
        heads = cfg["num_attention_heads"]
        return dict(
            vocab_size=cfg.get("vocab_size"), hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"], num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or head_dim or cfg["hidden_size"] // heads,
            rms_norm_eps=cfg.get("rms_norm_eps", rms_norm_eps), rope=rope,
            max_position_embeddings=cfg.get("max_position_embeddings", max_position_embeddings),
            attention_bias=bool(cfg.get("attention_bias", attention_bias)),
        )


_TARGET_FIX = "use the model's own config.json (from its hub repository)"


@dataclass(frozen=True, kw_only=True)
class LlamaConfig(ModelConfig):
    """Llama-family targets: Llama 2/3.x, SmolLM2, Mistral, Qwen2 (q/k/v bias) and Qwen3 (per-head q/k norm)."""

    architecture: str
    tie_word_embeddings: bool
    qk_norm: bool

    @classmethod
    def from_hf(cls, cfg: dict) -> LlamaConfig:
        arch = architecture(cfg)
        if arch not in LLAMA_ARCHITECTURES:
            raise DFlashError("target architectures", f"{arch} is not supported by the torch runtime",
                              f"use one of {', '.join(LLAMA_ARCHITECTURES)}")
        return cls(**ModelConfig.shared_fields(cfg, "target", _TARGET_FIX, rope=rope_parameters(cfg),
                                               attention_bias=arch == "Qwen2ForCausalLM", required=("vocab_size",)),
                   architecture=arch, tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                   qk_norm=arch == "Qwen3ForCausalLM")


@dataclass(frozen=True, kw_only=True)
class GptOssConfig(ModelConfig):
    """gpt-oss targets (openai/gpt-oss-20b and -120b): transformers' GptOssConfig defaults where config.json is
    silent (head_dim 64, eps 1e-5, 131072 positions, biased attention, YaRN RoPE)."""

    architecture: str
    num_experts: int
    experts_per_token: int
    sliding_window: int
    layer_types: tuple[str, ...]
    swiglu_limit: float
    tie_word_embeddings: bool
    mxfp4: bool                             # experts stored as MXFP4 (quantization_config.quant_method)

    @classmethod
    def from_hf(cls, cfg: dict) -> GptOssConfig:
        arch = architecture(cfg)
        if arch not in GPT_OSS_ARCHITECTURES:
            raise DFlashError("target architectures", f"{arch} is not a gpt-oss model", "use GptOssForCausalLM")
        quant = (cfg.get("quantization_config") or {}).get("quant_method")
        if quant not in (None, "mxfp4"):
            raise DFlashError("target quantization_config.quant_method", f"{quant!r} is not supported for gpt-oss "
                              "by the torch runtime", "use the published MXFP4 checkpoint or a bf16 one")
        shared = ModelConfig.shared_fields(cfg, "target", _TARGET_FIX, rope=gpt_oss_rope(cfg), head_dim=64,
                                           rms_norm_eps=1e-5, max_position_embeddings=131072, attention_bias=True,
                                           required=("vocab_size",))
        n = shared["num_layers"]
        types = tuple(cfg.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                                  for i in range(n)])
        if len(types) != n or set(types) - {"sliding_attention", "full_attention"}:
            raise DFlashError("target layer_types", f"expected {n} of sliding_attention/full_attention, got {types}",
                              "fix config.json (gpt-oss alternates sliding and full layers)")
        return cls(**shared, architecture=arch,
                   num_experts=cfg.get("num_local_experts") or cfg["num_experts"],
                   experts_per_token=cfg.get("num_experts_per_tok") or cfg["experts_per_token"],
                   sliding_window=cfg.get("sliding_window") or 128, layer_types=types,
                   swiglu_limit=float(cfg.get("swiglu_limit", 7.0)),
                   tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)), mxfp4=quant == "mxfp4")


_TARGET_CONFIGS: dict[str, type[ModelConfig]] = {**{a: LlamaConfig for a in LLAMA_ARCHITECTURES},
                                                 **{a: GptOssConfig for a in GPT_OSS_ARCHITECTURES}}


def target_config(cfg: dict) -> LlamaConfig | GptOssConfig:
    """The parsed config of a target's config.json (validates it, reads no weights); a DFlashError for
    architectures the torch runtime does not have."""
    arch = architecture(cfg)
    if arch not in _TARGET_CONFIGS:
        raise DFlashError("target architectures", f"{arch} is not supported by the torch runtime",
                          f"use one of {', '.join(TORCH_RUNTIME_ARCHITECTURES)}")
    return _TARGET_CONFIGS[arch].from_hf(cfg)


@dataclass(frozen=True, kw_only=True)
class DrafterConfig(ModelConfig):
    """A DFlash drafter in the z-lab layout: Qwen3-style layers plus where it reads the target and its block."""

    block_size: int
    mask_token_id: int
    target_layer_ids: tuple[int, ...]
    num_target_layers: int | None
    layer_causal: tuple[bool, ...]          # per layer: causal inside the block (sliding-window drafters)
    layer_window: tuple[int | None, ...]    # per layer: sliding window over positions, None = full

    @classmethod
    def from_hf(cls, cfg: dict) -> DrafterConfig:
        d = cfg.get("dflash_config") or {}

        def pick(name):
            return d.get(name, cfg.get(name))

        for name, neutral in _DRAFTER_UNSUPPORTED.items():
            if pick(name) not in (None, neutral):
                raise DFlashError(f"drafter dflash_config.{name}", f"= {pick(name)} is not supported",
                                  "use a drafter without it (z-lab DFlash v1 layout)")
        # gpt-oss drafters say model_type gpt_oss and give no rope_scaling: transformers' GptOssConfig (which
        # the reference and TensorRT-LLM load them with) fills the target's YaRN; layer_types stay as written.
        rope = gpt_oss_rope(cfg) if cfg.get("model_type") == "gpt_oss" else rope_parameters(cfg)
        shared = ModelConfig.shared_fields(cfg, "drafter", "re-export the drafter in the z-lab layout", rope=rope)
        block = pick("block_size")
        if block is None:
            raise DFlashError("drafter config.json block_size", "missing", "set block_size (16 for z-lab Qwen3 drafters)")
        mask = pick("mask_token_id")
        if mask is None:
            raise DFlashError("drafter dflash_config.mask_token_id", "missing", "set it to the id the drafter was trained with")
        n_layers = shared["num_layers"]
        ids = pick("target_layer_ids")
        if ids is None:
            if cfg.get("num_target_layers") is None:
                raise DFlashError("drafter dflash_config.target_layer_ids", "missing (and no num_target_layers)",
                                  "set target_layer_ids to the target layers the drafter was trained on")
            ids = build_target_layer_ids(cfg["num_target_layers"], n_layers)
        types = cfg.get("layer_types") or ["full_attention"] * n_layers
        causal_all = cfg.get("is_causal")
        return cls(
            **shared, block_size=int(block), mask_token_id=int(mask), target_layer_ids=tuple(int(i) for i in ids),
            num_target_layers=cfg.get("num_target_layers"),
            # Same rule as the reference: sliding layers are causal unless the config says otherwise.
            layer_causal=tuple(bool(causal_all) if causal_all is not None else t == "sliding_attention" for t in types),
            layer_window=tuple(cfg.get("sliding_window") if t == "sliding_attention" else None for t in types),
        )
