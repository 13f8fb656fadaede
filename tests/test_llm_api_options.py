# SPDX-License-Identifier: Apache-2.0
"""The llm_api_options.yaml fields we emit, pinned against TensorRT-LLM's documented schema.

TensorRT-LLM cannot be installed here, so the schema was read, not imported. :data:`PINNED` below is written
from the sources named beside each field; trtllm.py's ``TORCH_LLM_ARGS`` (what dflash-build and the
serving path check against) must equal it field for field.

Sources (NVIDIA/TensorRT-LLM):
- [src] ``tensorrt_llm/llmapi/llm_args.py`` at fcd3f31682808ae56118ae43c1d7864a3a945e6f: ``BaseLlmArgs`` (pydantic,
  ``extra: forbid``), ``TorchLlmArgs.attn_backend: str = 'TRTLLM'``, ``KvCacheConfig``.
- [sched] how ``draft_len_schedule`` is read since PR #10860 (merged 2026-03-13; DFlash got dynamic draft length
  with PR #12262, so in every release where DFlash has the field): ``tensorrt_llm/_torch/speculative/utils.py:
  get_draft_len_for_batch_size`` = the value of the first key >= the batch size (bisect_left), 0 above the largest
  key; ``DecodingBaseConfig.validate_draft_len_schedule_and_sort``: keys >= 1, lengths 0..max_draft_len, the
  smallest key mapped to max_draft_len; ``draft_len_schedule`` and ``max_concurrency`` mutually exclusive (the
  latter becomes {max_concurrency: max_draft_len}). The field's own example: {4: 4, 8: 2, 32: 1} = batch sizes
  1-4 draft 4, 5-8 draft 2, 9-32 draft 1, 33+ draft 0. (PR #8194's first version read keys as lower bounds.)
- [zero] DFlash at draft length 0: ``py_executor.py`` turns speculation off for an iteration whose
  ``get_draft_len_for_batch_size`` is 0 (``use_spec_decode = False``), so ``speculative/dflash.py: DFlashWorker``, which
  appends each step's accepted tokens to the request's stored drafting context, does not run; the context misses
  those tokens and acceptance collapses. Reported by PR #16888 (open: floors one-model modes at 1 with
  ``min_runtime_draft_len``). dflash-build therefore never emits a schedule that drafts 0 up to max_batch_size.
- [1.4.0rc1] API reference nvidia.github.io/TensorRT-LLM/1.4.0rc1/llm-api/reference/DFlashDecodingConfig.html
  (and TorchLlmArgs.html, MoeConfig.html, CudaGraphConfig.html of the same release).
- [1.3.0rc27] the same page for 1.3.0rc27: draft_len_schedule, max_concurrency, use_rejection_sampling and FA4
  are there already; moe_backend, spec_dec_variant and context_recompute_tail are not.
- [docs] docs/source/features/speculative-decoding.md (DFlash section): ``attn_backend: TRTLLM`` with DFlash,
  an explicit ``max_seq_len``, ``max_draft_len <= block_size - 1`` (PR #17935).
"""
from __future__ import annotations

import pytest
import yaml

from trtllm_dflash import trtllm
from trtllm_dflash.errors import DFlashError

MOE_LITERALS = ("AUTO", "CUTLASS", "CUTEDSL", "CUTEDSL_FC12", "TRTLLM", "DEEPGEMM", "DENSEGEMM", "VANILLA", "TRITON",
                "MARLIN", "MEGAMOE_DEEPGEMM", "MEGAMOE_CUTEDSL")          # [1.4.0rc1] DFlashDecodingConfig.moe_backend
PINNED = {
    "tensor_parallel_size": "int>0",                      # [src] BaseLlmArgs: int = 1
    "moe_expert_parallel_size": "int>0",                  # [src] Optional[int]
    "dtype": ("auto", "bfloat16", "float16", "float32"),  # [src] str = "auto" (the values we write)
    "enable_attention_dp": "bool",                        # [src] bool = False
    "max_batch_size": "int>0",                            # [src] Optional[int]
    "max_num_tokens": "int>0",                            # [src] Optional[int]
    "max_seq_len": "int>0",                               # [src] Optional[int]; [docs] set it explicitly for DFlash
    "trust_remote_code": "bool",                          # [src] bool = False
    "attn_backend": ("TRTLLM",),                          # [src] str = 'TRTLLM'; [docs] DFlash needs TRTLLM
    "kv_cache_config": {"free_gpu_memory_fraction": "fraction",   # [src] Optional[float]
                        "enable_block_reuse": "bool"},            # [src] bool = True (we write it always)
    "cuda_graph_config": {"enable_padding": "bool",               # [1.4.0rc1] CudaGraphConfig: bool = False
                          "max_batch_size": "int>=0"},            # [1.4.0rc1] NonNegativeInt
    "moe_config": {"backend": MOE_LITERALS},              # [1.4.0rc1] MoeConfig.backend Literal
    "speculative_config": {
        "decoding_type": ("DFlash",),                     # [1.4.0rc1] Literal['DFlash']
        "speculative_model": "str",                       # [1.4.0rc1] str | Path | None
        "max_draft_len": "int>=0",                        # [1.4.0rc1] Annotated[int, Ge(0)] | None
        "target_layer_ids": "list[int]",                  # [1.4.0rc1] List[int] | None
        "mask_token_id": "int>=0",                        # [1.4.0rc1] int | None
        "attention_backend": ("VANILLA", "TRTLLM", "FA4"),  # [1.4.0rc1] Literal; FA4 also [1.3.0rc27]
        "moe_backend": MOE_LITERALS,                      # [1.4.0rc1] the drafter's MoE backend
        "max_concurrency": "int>0",                       # [1.4.0rc1] Annotated[int, Gt(0)] | None
        "draft_len_schedule": "dict[int,int]",            # [1.4.0rc1] dict[int, int] | None
        "use_rejection_sampling": "bool",                 # [1.4.0rc1] bool = False
        "spec_dec_variant": "int>0",                      # [1.4.0rc1] Annotated[int, Gt(0)] | None
        "context_recompute_tail": "int>=0",               # [1.4.0rc1] int | None = 0
    },
}


def test_the_checked_schema_is_the_pinned_one():
    assert trtllm.TORCH_LLM_ARGS == PINNED
    assert trtllm.SCHEMA_VERSION == "1.4.0rc1"


def options(**kw):
    base = dict(tp_size=8, ep_size=8, dtype="auto", max_batch_size=64, max_num_tokens=16384, max_seq_len=32768,
                free_gpu_memory_fraction=0.8, trust_remote_code=False, moe_backend="TRITON",
                speculative_model="/models/deploy/drafter", max_draft_len=7, target_layer_ids=[1, 9, 17, 25, 33],
                mask_token_id=200000, attention_backend="FA4")
    return trtllm.llm_api_options(**{**base, **kw})


def check_schema(opts: dict) -> None:
    """For other tests: the options pass the pinned schema (an AssertionError names the field)."""
    try:
        trtllm.check_options(opts)
    except DFlashError as err:
        raise AssertionError(str(err)) from None


@pytest.mark.parametrize("kw, since", [
    ({}, "1.3.0rc27"),                                                                  # gpt-oss on Hopper (FA4)
    ({"moe_backend": "TRTLLM", "attention_backend": "TRTLLM", "ep_size": 4}, "1.3.0rc15"),  # gpt-oss on Blackwell
    ({"moe_backend": None, "ep_size": None, "tp_size": 1, "attention_backend": "VANILLA"}, "1.3.0rc15"),  # dense
    ({"draft_len_schedule": {1: 7, 16: 4, 64: 2}, "use_rejection_sampling": True}, "1.3.0rc27"),
    ({"max_concurrency": 48}, "1.3.0rc27"),
    ({"context_recompute_tail": 32}, "1.4.0rc1"),
])
def test_emitted_fields_match_the_pinned_schema(kw, since):
    opts = options(**kw)
    check_schema(opts)
    spec = opts["speculative_config"]
    assert ("moe_config" in opts) == (kw.get("moe_backend", "TRITON") is not None)
    assert ("moe_expert_parallel_size" in opts) == (kw.get("ep_size", 8) is not None)
    assert opts["kv_cache_config"]["enable_block_reuse"] == ("context_recompute_tail" in kw)
    for key in ("draft_len_schedule", "max_concurrency", "use_rejection_sampling", "context_recompute_tail"):
        assert (key in spec) == (key in kw), key
    assert "spec_dec_variant" not in spec and "moe_backend" not in spec     # DFlash 1, dense drafters
    assert trtllm.min_version(opts) == since
    assert trtllm.version_range(opts) == f">={since},<1.5"


def test_yaml_round_trips_with_the_same_types():
    opts = options(draft_len_schedule={1: 7, 32: 3})
    text = trtllm.dump_options(opts)
    assert text.startswith("# TorchLlmArgs for TensorRT-LLM >=1.3.0rc27,<1.5 (PyTorch backend; schema of 1.4.0rc1)")
    back = yaml.safe_load(text)
    assert back == opts and back["speculative_config"]["draft_len_schedule"] == {1: 7, 32: 3}   # int keys
    check_schema(back)


@pytest.mark.parametrize("edit, field", [
    (lambda o: o["speculative_config"].update(num_speculative_tokens=7), "speculative_config.num_speculative_tokens"),
    (lambda o: o["kv_cache_config"].update(free_gpu_memory_fraction="0.8"), "kv_cache_config.free_gpu_memory_fraction"),
    (lambda o: o.update(attn_backend="FLASHINFER"), "attn_backend"),
    (lambda o: o.update(max_batch_size=True), "max_batch_size"),
    (lambda o: o["speculative_config"].update(attention_backend="FA3"), "speculative_config.attention_backend"),
    (lambda o: o["speculative_config"].update(draft_len_schedule={"1": 7}), "speculative_config.draft_len_schedule"),
    (lambda o: o["speculative_config"].update(draft_len_schedule={1: 5, 8: 2}),
     "speculative_config.draft_len_schedule"),                       # batch 1 must draft max_draft_len
    (lambda o: o["speculative_config"].update(max_concurrency=0), "speculative_config.max_concurrency"),
    (lambda o: o["speculative_config"].update(max_concurrency=8, draft_len_schedule={1: 7, 8: 3}),
     "speculative_config.max_concurrency"),                          # [sched] mutually exclusive
    (lambda o: o["speculative_config"].update(spec_dec_variant=0), "speculative_config.spec_dec_variant"),
    (lambda o: o["speculative_config"].pop("mask_token_id"), "speculative_config.mask_token_id"),
    (lambda o: o.pop("max_seq_len"), "max_seq_len"),
    (lambda o: o.update(max_seq_length=4096), "max_seq_length"),
])
def test_the_check_names_a_wrong_field(edit, field):
    opts = options()
    edit(opts)
    with pytest.raises(DFlashError) as err:
        trtllm.check_options(opts)
    assert str(err.value).startswith(field)


@pytest.mark.parametrize("schedule, problem", [
    ({1: 7, 8: 9}, "out of range"), ({1: 7, 0: 3}, "out of range"), ({1: 3, 8: 5}, "batch size 1"),
    ({1: 7, 8: 2, 16: 4}, "must not grow"), ({1: 7, 128: 2}, "exceeds max_batch_size"),
])
def test_schedule_rules(schedule, problem):
    with pytest.raises(DFlashError, match=problem):
        trtllm.check_schedule(schedule, 7, max_batch_size=64)


def test_read_options_points_at_the_current_directory(tmp_path):
    (tmp_path / trtllm.OPTIONS_FILE).write_text(trtllm.dump_options(options()))
    got = trtllm.read_options(tmp_path)
    assert got["speculative_config"]["speculative_model"] == str(tmp_path.resolve() / "drafter")
    with pytest.raises(DFlashError, match="llm_api_options.yaml"):
        trtllm.read_options(tmp_path / "elsewhere")
    bad = options()
    bad["speculative_config"]["max_draft_len"] = "7"
    (tmp_path / trtllm.OPTIONS_FILE).write_text(yaml.safe_dump(bad))
    with pytest.raises(DFlashError, match="speculative_config.max_draft_len"):
        trtllm.read_options(tmp_path)


def test_serve_and_bench_lines(tmp_path):
    serve = trtllm.shell_line(trtllm.serve_command(tmp_path))
    assert serve.startswith(f"trtllm-serve {tmp_path.resolve()}/target --backend pytorch")
    assert f"--extra_llm_api_options {tmp_path.resolve()}/llm_api_options.yaml" in serve
    prep, bench = trtllm.bench_commands(tmp_path, {"target": {"source": "openai/gpt-oss-120b"}, "tp_size": 8,
                                                   "ep_size": 4})
    assert prep[:3] == ["trtllm-bench", "--model", "openai/gpt-oss-120b"] and "prepare-dataset" in prep
    assert "throughput" in bench and bench[bench.index("--tp") + 1] == "8" and bench[bench.index("--ep") + 1] == "4"
    assert bench[bench.index("--dataset") + 1] == prep[prep.index("--output") + 1]


# [sched] TensorRT-LLM's lookup, written out independently of trtllm.py: the first key >= batch size.
def trtllm_draft_len(schedule: dict[int, int], batch_size: int) -> int:
    keys = sorted(schedule)
    i = next((i for i, k in enumerate(keys) if k >= batch_size), len(keys))
    return schedule[keys[i]] if i < len(keys) else 0


def test_schedule_lookup_is_tensorrt_llms():
    example = {4: 4, 8: 2, 32: 1}                   # the field's own example [sched]
    assert [trtllm.draft_len_for_batch(example, n, 4) for n in (1, 4, 5, 8, 9, 32, 33, 64)] == [4, 4, 2, 2, 1, 1, 0, 0]
    assert all(trtllm.draft_len_for_batch(example, n, 4) == trtllm_draft_len(example, n) for n in range(1, 70))
    assert trtllm.draft_len_for_batch(None, 17, 7) == 7


@pytest.mark.parametrize("lengths", [
    [7] * 8,                                   # one run: {1: 7, 8: 7}
    [7, 7, 5, 5, 5, 3, 0, 0],                  # shorter under load, off above 6
    [7, 3, 3, 3],
    [7, 0, 0, 0],                              # speculation at batch 1 only
    [3, 7, 7, 2],                              # batch 1 wants less than max: raised (TensorRT-LLM's rule)
])
def test_our_lengths_convert_to_a_schedule_tensorrt_llm_runs_exactly(lengths):
    sched, raised = trtllm.schedule_from_lengths(lengths, 7)
    want = [7, *lengths[1:]]
    assert [trtllm_draft_len(sched, n) for n in range(1, len(lengths) + 1)] == want
    assert raised == (lengths[0] != 7) and min(sched) == 1 and sched[1] == 7
    assert list(sched) == sorted(sched) and max(sched) <= len(lengths)
    if want == sorted(want, reverse=True):   # passes our rules and TensorRT-LLM's, in the options too
        trtllm.check_schedule(sched, 7, max_batch_size=len(lengths))
        check_schema(options(draft_len_schedule=sched))


# ---- [zero] never a draft length of 0 for DFlash ---------------------------------------------------------------
def test_derived_schedule_never_drafts_zero_up_to_max_batch_size():
    """At a low assumed acceptance our cost model would stop drafting at large batches (the unfloored lengths hold
    0s, so this test can fail); the schedule dflash-build writes drafts at least 1 at every batch size."""
    from trtllm_dflash import draft_schedule
    from trtllm_dflash.runtime.draft_policy import AcceptanceStats, AdaptivePolicy, best_block

    table, _ = draft_schedule.cost_table("h100", "Qwen/Qwen3-8B")
    stats = AcceptanceStats(8, prior_rate=0.1, prior_weight=1e9)
    raw = [best_block(AdaptivePolicy(8, table, stats=stats), n) - 1 for n in range(1, 257)]
    assert 0 in raw
    derived = draft_schedule.derive("h100", "Qwen/Qwen3-8B", max_draft_len=7, max_batch_size=256, acceptance_rate=0.1)
    trtllm.check_schedule(derived.schedule, 7, max_batch_size=256)
    assert draft_schedule.zero_draft_batch_sizes(derived.schedule, 256) == []
    assert max(derived.schedule) == 256 and min(derived.schedule.values()) >= draft_schedule.MIN_DRAFT_LEN
    # batch 1 is raised to max_draft_len (TensorRT-LLM's rule); every other size drafts what the model chose, >= 1
    assert all(trtllm.draft_len_for_batch(derived.schedule, n, 7) == max(1, raw[n - 1]) for n in range(2, 257))


@pytest.mark.parametrize("schedule, zeros", [({1: 7, 8: 3}, list(range(9, 17))),
                                             ({1: 7, 8: 0, 16: 1}, list(range(2, 9))),
                                             ({1: 7, 4: 3, 16: 0}, list(range(5, 17))), ({1: 7, 16: 1}, [])])
def test_zero_draft_batch_sizes_reads_the_schedule_as_tensorrt_llm_does(schedule, zeros):
    from trtllm_dflash import draft_schedule

    got = draft_schedule.zero_draft_batch_sizes(schedule, 16)
    assert got == zeros
    assert got == [n for n in range(1, 17) if trtllm.draft_len_for_batch(schedule, n, 7) == 0]


def test_a_given_schedule_that_drafts_zero_is_refused_with_the_reason(capsys):
    from trtllm_dflash import cli

    base = ["--target", "qwen3-8b", "--gpu", "h100", "--backend", "trtllm", "--dry_run", "--max_batch_size", "64",
            "--no_preset"]
    assert cli.build_main([*base, "--draft_len_schedule", "1:15,8:7"]) != 0
    err = capsys.readouterr().err
    assert "draft_len_schedule" in err and "9..64" in err and "#16888" in err and "64:1" in err
    assert cli.build_main([*base, "--draft_len_schedule", "1:15,8:7,64:1"]) == 0
    out = capsys.readouterr().out
    assert "draft_len_schedule: {1: 15, 8: 7, 64: 1}" in out
    assert cli.build_main(base) == 0
    assert "at least 1 draft at every batch size" in capsys.readouterr().out
