# SPDX-License-Identifier: Apache-2.0
"""The llm_api_options.yaml fields we emit, pinned against TensorRT-LLM's documented schema.

Sources (TensorRT-LLM cannot be installed here; these were read, not imported):
- ``tensorrt_llm/llmapi/llm_args.py`` at NVIDIA/TensorRT-LLM@fcd3f31682808ae56118ae43c1d7864a3a945e6f:
  ``BaseLlmArgs`` (pydantic, ``extra: forbid``) declares ``tensor_parallel_size: int``,
  ``moe_expert_parallel_size: Optional[int]``, ``trust_remote_code: bool``, ``dtype: str``,
  ``enable_attention_dp: bool``, ``max_batch_size / max_num_tokens / max_seq_len: Optional[int]``,
  ``kv_cache_config: KvCacheConfig`` (``free_gpu_memory_fraction: Optional[float]``, ``enable_block_reuse: bool``),
  ``speculative_config``; ``TorchLlmArgs.attn_backend: str = 'TRTLLM'``. That revision predates DFlash,
  ``cuda_graph_config`` and ``moe_config``, so those are pinned from the API reference of 1.3.0rc27 / 1.4.0rc1
  (nvidia.github.io/TensorRT-LLM/<ver>/llm-api/reference/): ``DFlashDecodingConfig`` (decoding_type
  Literal['DFlash'], speculative_model str|Path, max_draft_len NonNegInt, target_layer_ids List[int],
  mask_token_id int, attention_backend Literal['VANILLA','TRTLLM','FA4']), ``MoeConfig.backend`` (Literal incl.
  CUTLASS, TRTLLM, TRITON) and the decode ``CudaGraphConfig`` (enable_padding bool, max_batch_size NonNegInt).
"""
from __future__ import annotations

import pytest
import yaml

from trtllm_dflash.backends import trtllm
from trtllm_dflash.errors import DFlashError

MOE_BACKENDS = ("AUTO", "CUTLASS", "CUTEDSL", "TRTLLM", "DEEPGEMM", "DENSEGEMM", "VANILLA", "TRITON", "MARLIN")
# field -> type, or a tuple of allowed literal values, or a nested schema
DFLASH_DECODING_CONFIG = {
    "decoding_type": ("DFlash",),
    "speculative_model": str,
    "max_draft_len": int,
    "target_layer_ids": list,
    "mask_token_id": int,
    "attention_backend": ("VANILLA", "TRTLLM", "FA4"),
}
TORCH_LLM_ARGS = {
    "tensor_parallel_size": int,
    "moe_expert_parallel_size": int,
    "dtype": ("auto", "bfloat16", "float16", "float32"),
    "enable_attention_dp": bool,
    "max_batch_size": int,
    "max_num_tokens": int,
    "max_seq_len": int,
    "trust_remote_code": bool,
    "attn_backend": ("TRTLLM",),    # FlashInfer/VANILLA target attention is refused for one-model DFlash
    "kv_cache_config": {"free_gpu_memory_fraction": float, "enable_block_reuse": bool},
    "cuda_graph_config": {"enable_padding": bool, "max_batch_size": int},
    "moe_config": {"backend": MOE_BACKENDS},
    "speculative_config": DFLASH_DECODING_CONFIG,
}
REQUIRED = ("tensor_parallel_size", "max_batch_size", "max_seq_len", "attn_backend", "speculative_config")


def check_schema(options: dict, schema: dict = TORCH_LLM_ARGS, where: str = "") -> None:
    """Raise AssertionError on any field or type that the pinned TensorRT-LLM schema does not have."""
    for key, value in options.items():
        assert key in schema, f"{where}{key} is not a pinned TorchLlmArgs field"
        kind = schema[key]
        if isinstance(kind, dict):
            assert isinstance(value, dict), f"{where}{key} must be a mapping"
            check_schema(value, kind, f"{where}{key}.")
        elif isinstance(kind, tuple):
            assert value in kind, f"{where}{key}={value!r} not in {kind}"
        elif kind is int:
            assert isinstance(value, int) and not isinstance(value, bool) and value >= 0, f"{where}{key}={value!r}"
        elif kind is list:
            assert isinstance(value, list) and all(isinstance(v, int) for v in value), f"{where}{key}={value!r}"
        else:
            assert isinstance(value, kind), f"{where}{key}={value!r} is not {kind.__name__}"
    if schema is TORCH_LLM_ARGS:
        for key in REQUIRED:
            assert key in options, f"{key} missing"
        assert set(options["speculative_config"]) == set(DFLASH_DECODING_CONFIG)
        assert 0.0 < options["kv_cache_config"]["free_gpu_memory_fraction"] < 1.0


def options(**kw):
    base = dict(tp_size=8, ep_size=8, dtype="auto", max_batch_size=64, max_num_tokens=16384, max_seq_len=32768,
                free_gpu_memory_fraction=0.8, trust_remote_code=False, moe_backend="TRITON",
                speculative_model="/models/deploy/drafter", max_draft_len=7, target_layer_ids=[1, 9, 17, 25, 33],
                mask_token_id=200000, attention_backend="VANILLA")
    return trtllm.llm_api_options(**{**base, **kw})


@pytest.mark.parametrize("kw", [
    {},                                                                     # gpt-oss on Hopper
    {"moe_backend": "TRTLLM", "attention_backend": "TRTLLM", "ep_size": 4},  # gpt-oss on Blackwell
    {"moe_backend": None, "ep_size": None, "tp_size": 1},                    # dense Qwen3 / Llama
    {"attention_backend": "FA4", "dtype": "bfloat16", "trust_remote_code": True},
])
def test_emitted_fields_match_the_pinned_schema(kw):
    opts = options(**kw)
    check_schema(opts)
    assert ("moe_config" in opts) == (kw.get("moe_backend", "TRITON") is not None)
    assert ("moe_expert_parallel_size" in opts) == (kw.get("ep_size", 8) is not None)


def test_yaml_round_trips_with_the_same_types():
    opts = options()
    text = trtllm.dump_options(opts)
    assert text.startswith("# TorchLlmArgs for TensorRT-LLM >= 1.3.0rc15")
    back = yaml.safe_load(text)
    assert back == opts
    check_schema(back)
    assert back["speculative_config"]["decoding_type"] == "DFlash"
    assert back["tensor_parallel_size"] == 8


def test_schema_check_catches_a_wrong_field():
    opts = options()
    opts["speculative_config"]["num_speculative_tokens"] = 7          # vLLM's name, not TensorRT-LLM's
    with pytest.raises(AssertionError, match="num_speculative_tokens"):
        check_schema(opts)
    opts = options()
    opts["kv_cache_config"]["free_gpu_memory_fraction"] = "0.8"
    with pytest.raises(AssertionError):
        check_schema(opts)


def test_read_options_points_at_the_current_directory(tmp_path):
    (tmp_path / trtllm.OPTIONS_FILE).write_text(trtllm.dump_options(options()))
    got = trtllm.read_options(tmp_path)
    assert got["speculative_config"]["speculative_model"] == str(tmp_path.resolve() / "drafter")
    with pytest.raises(DFlashError, match="llm_api_options.yaml"):
        trtllm.read_options(tmp_path / "elsewhere")


def test_serve_and_bench_lines(tmp_path):
    serve = trtllm.shell_line(trtllm.serve_command(tmp_path))
    assert serve.startswith(f"trtllm-serve {tmp_path.resolve()}/target --backend pytorch")
    assert f"--extra_llm_api_options {tmp_path.resolve()}/llm_api_options.yaml" in serve
    prep, bench = trtllm.bench_commands(tmp_path, {"target": {"source": "openai/gpt-oss-120b"}, "tp_size": 8,
                                                   "ep_size": 4})
    assert prep[:3] == ["trtllm-bench", "--model", "openai/gpt-oss-120b"] and "prepare-dataset" in prep
    assert "throughput" in bench and bench[bench.index("--tp") + 1] == "8" and bench[bench.index("--ep") + 1] == "4"
    assert bench[bench.index("--dataset") + 1] == prep[prep.index("--output") + 1]
