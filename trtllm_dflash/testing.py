# SPDX-License-Identifier: Apache-2.0
"""Stand-ins for the tests and the benchmarks that run without real models: tiny random checkpoints in real
Hugging Face layouts (written with transformers itself), the fixed requests of the tiny gpt-oss tensor-parallel
check, and a scripted engine that batches like the real one (what the serving layers are measured against)."""
from __future__ import annotations

import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from types import SimpleNamespace
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from trtllm_dflash.checkpoints.drafter_init import write_random_drafter
from trtllm_dflash.config import RequestStats, SamplingParams

VOCAB = 96
GPT_OSS_WINDOW = 8  # tiny gpt-oss sliding window: prompts of 30 tokens cross it


def write_tiny_target(out: Path, arch: str = "llama", *, seed: int = 0, tie: bool = False, rope=None,
                      num_layers: int = 4, heads: int = 4, kv_heads: int = 2, hidden: int = 64,
                      vocab: int = VOCAB) -> Path:
    """A small random target saved by transformers' own save_pretrained (safetensors)."""
    import transformers

    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=num_layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                  tie_word_embeddings=tie, eos_token_id=vocab - 2, bos_token_id=1, pad_token_id=0)
    if rope is not None:
        common["rope_parameters"] = rope
    if arch == "llama":
        cfg, cls = transformers.LlamaConfig(**common), transformers.LlamaForCausalLM
    elif arch == "qwen3":
        cfg, cls = transformers.Qwen3Config(head_dim=hidden // heads * 2, **common), transformers.Qwen3ForCausalLM
    else:
        raise ValueError(arch)
    torch.manual_seed(seed)
    model = cls(cfg).float()
    with torch.no_grad():  # larger weights than HF's init so logits are peaked and tokens vary
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.2 if p.shape[0] != vocab else 0.5)
    model.config.architectures = [cls.__name__]
    model.save_pretrained(out)
    return out


def write_tiny_pair(root: Path, arch: str = "llama", *, block_size: int = 8, drafter_layers: int = 2,
                    target_layer_ids=(0, 2, 3), seed: int = 0, **kw) -> tuple[Path, Path]:
    target = write_tiny_target(root / "target", arch, seed=seed, **kw)
    drafter = write_random_drafter(target, root / "drafter", num_layers=drafter_layers, block_size=block_size,
                                   target_layer_ids=list(target_layer_ids), mask_token_id=kw.get("vocab", VOCAB) - 1,
                                   seed=seed + 1)
    return target, drafter


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "generation_config.json")


def write_tiny_pair_with_tokenizer(root: Path, tokenizer_dir: Path) -> tuple[Path, Path]:
    """(target, drafter): a 2-layer random Llama with the vocabulary and tokenizer of ``tokenizer_dir`` (SmolLM2's:
    text works and a server takes seconds), plus an untrained 1-layer drafter (greedy output = the target's)."""
    import shutil

    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    target = write_tiny_target(root / "target", num_layers=2, vocab=vocab)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, target / name)
    drafter = write_random_drafter(target, root / "drafter", num_layers=1, block_size=8, target_layer_ids=[0, 1],
                                   mask_token_id=vocab - 1, seed=1)
    return target, drafter


def write_tiny_gpt_oss(out: Path, *, heads=4, kv_heads=2, intermediate=64, hidden=64, mxfp4=False, seed=0) -> Path:
    """A random 4-layer GptOssForCausalLM (sliding window 8 / full alternating, 4 experts top-2, YaRN) saved by
    transformers. mxfp4=True stores the experts as MXFP4 blocks/scales instead, with the HF reference weights
    being transformers' own dequantisation of them (so the MXFP4 layout is checked against transformers).
    ``hidden``: 64 by default; the triton_kernels experts need their outputs' tiles full (hidden 256)."""
    import transformers
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    cfg = transformers.GptOssConfig(
        vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=4, num_attention_heads=heads,
        num_key_value_heads=kv_heads, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
        sliding_window=GPT_OSS_WINDOW, max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=VOCAB - 2, pad_token_id=0,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 64})
    torch.manual_seed(seed)
    model = transformers.GptOssForCausalLM(cfg).float()
    g = torch.Generator().manual_seed(seed)
    blocks = {}
    with torch.no_grad():  # larger than HF's init: peaked logits, varied routing, sinks that matter
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.copy_(torch.randn(p.shape, generator=g) * (0.5 if p.dim() < 2 or "router" in name else 0.2))
        if mxfp4:
            for i, layer in enumerate(model.model.layers):
                for proj, rows, cols in (("gate_up_proj", 2 * intermediate, hidden), ("down_proj", hidden, intermediate)):
                    b = torch.randint(0, 256, (4, rows, cols // 32, 16), dtype=torch.uint8, generator=g)
                    s = torch.randint(121, 124, (4, rows, cols // 32), dtype=torch.uint8, generator=g)
                    getattr(layer.mlp.experts, proj).copy_(convert_moe_packed_tensors(b, s, dtype=torch.float32))
                    blocks[f"model.layers.{i}.mlp.experts.{proj}"] = (b, s)
    model.config.architectures = ["GptOssForCausalLM"]
    model.save_pretrained(out / "hf")
    if not mxfp4:
        return out / "hf"
    q = out / "mxfp4"  # the published layout: experts as *_blocks + *_scales, quantization_config mxfp4
    q.mkdir()
    sd = load_file(str(out / "hf" / "model.safetensors"))
    for name, (b, s) in blocks.items():
        del sd[name]
        sd[name + "_blocks"], sd[name + "_scales"] = b, s
    save_file(sd, str(q / "model.safetensors"))
    c = json.loads((out / "hf" / "config.json").read_text())
    c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn",
                                "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (q / "config.json").write_text(json.dumps(c))
    return q


def write_gpt_oss_drafter(target: Path, out: Path, *, block_size=8, seed=1) -> Path:
    """A random drafter shaped like z-lab's gpt-oss ones: model_type gpt_oss, attention_bias (q/k/v/o biases),
    no rope_scaling in config.json (so the gpt-oss YaRN default applies)."""
    d = write_random_drafter(target, out, num_layers=2, block_size=block_size, target_layer_ids=[0, 2, 3],
                             mask_token_id=VOCAB - 1, seed=seed)
    c = json.loads((d / "config.json").read_text())
    c.pop("rope_parameters", None)
    c.update(model_type="gpt_oss", attention_bias=True, rope_theta=150000)
    (d / "config.json").write_text(json.dumps(c))
    sd = load_file(str(d / "model.safetensors"))
    g = torch.Generator().manual_seed(seed)
    for i in range(2):
        for p in "qkvo":
            w = sd[f"layers.{i}.self_attn.{p}_proj.weight"]
            sd[f"layers.{i}.self_attn.{p}_proj.bias"] = torch.randn(w.shape[0], generator=g) * 0.1
    save_file(sd, str(d / "model.safetensors"))
    return d


# The tiny gpt-oss TP check's requests: prompts shorter and longer than the sliding window, greedy and sampled
# (tests/runtime/gpt_oss_tp_run.py and trtllm_dflash.bench.gpt_oss_tp compare TP N with TP 1 on exactly these).
GPT_OSS_TP_PROMPTS = [[5, 9, 13], [7, 3] * 12, list(range(40, 70))]
GPT_OSS_TP_PARAMS = [SamplingParams(max_new_tokens=20, ignore_eos=True),
                     SamplingParams(max_new_tokens=20, ignore_eos=True, temperature=1.0, seed=3),
                     SamplingParams(max_new_tokens=20, ignore_eos=True)]


class CharTokenizer:
    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


@dataclass(eq=False)
class FakeRequestState:
    prompt_ids: list
    params: object
    on_tokens: object
    request_id: int
    output_ids: list = field(default_factory=list)
    stats: RequestStats = field(default_factory=RequestStats)
    finish_reason: str | None = None
    slot: int = -1                # >= 0 once admitted into the batch, as the real Request


class FakeEngine:
    """Continuous batching with the real Engine's threading contract: each step admits waiting requests
    and commits 2 tokens (1 accepted draft of 3) to every active one. Output = the prompt, repeated."""

    def __init__(self, max_batch_size=4, max_seq_len=256, step_s=0.002, fail_at_step=None, poison_seed=None):
        self.tokenizer = CharTokenizer()
        self.cfg = SimpleNamespace(max_batch_size=max_batch_size, max_seq_len=max_seq_len)
        # fail_at_step: every step from that one on raises (a broken device); poison_seed: a step raises
        # while a request with that seed is in the batch (as the real engine did for seeds >= 2**63)
        self.block_size, self.step_s, self.fail_at_step, self.poison_seed = 4, step_s, fail_at_step, poison_seed
        self.waiting, self.active, self.cancels = deque(), [], set()
        self.lock, self.ids = threading.Lock(), iter(range(10**9))
        self.counters = {"steps": 0, "max_active_batch": 0}
        self.shut = False

    def add_request(self, prompt_ids, params, on_tokens=None, client=""):
        req = FakeRequestState(list(prompt_ids), params, on_tokens, next(self.ids))
        with self.lock:
            self.waiting.append(req)
        return req

    def cancel(self, request_id):
        with self.lock:
            self.cancels.add(request_id)

    def has_work(self):
        return bool(self.waiting or self.active)

    def metrics(self):
        return {**self.counters, "active": len(self.active), "waiting": len(self.waiting)}

    def shutdown(self):
        self.shut = True

    def step(self):
        if self.counters["steps"] == self.fail_at_step:
            raise RuntimeError("device lost")
        finished = []
        with self.lock:
            for req in [r for r in self.active + list(self.waiting) if r.request_id in self.cancels]:
                (self.active if req in self.active else self.waiting).remove(req)
                req.finish_reason = "cancelled"
                finished.append(req)
            self.cancels.clear()
            while self.waiting and len(self.active) < self.cfg.max_batch_size:
                self.active.append(self.waiting.popleft())
                self.active[-1].slot = len(self.active) - 1
        if self.poison_seed is not None and any(r.params.seed == self.poison_seed for r in self.active):
            raise OverflowError("Overflow when unpacking long long")
        time.sleep(self.step_s)
        self.counters["steps"] += 1
        self.counters["max_active_batch"] = max(self.counters["max_active_batch"], len(self.active))
        for req in list(self.active):
            n = len(req.output_ids)
            toks = [req.prompt_ids[(n + j) % len(req.prompt_ids)] for j in range(2)][: req.params.max_new_tokens - n]
            req.output_ids += toks
            req.stats.num_draft_tokens += 3
            req.stats.num_accepted_draft_tokens += 1
            req.on_tokens(req, toks)
            if len(req.output_ids) >= req.params.max_new_tokens:
                req.finish_reason = "length"
                self.active.remove(req)
                finished.append(req)
        return finished
