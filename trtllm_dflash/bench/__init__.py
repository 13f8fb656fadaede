# SPDX-License-Identifier: Apache-2.0
"""Sweeps: throughput (tok/s/gpu) vs interactivity (tok/s/user) over concurrency levels, and their plots.

metrics.py    pure functions: per-request timestamps -> one level's metrics (the definitions live here)
workload.py   prompts (HumanEval / MT-Bench / ShareGPT with the chat template, or random ids); tokens per chunk
drivers.py    closed loops of C requests in flight: the in-process engine, or C client threads
endpoints.py  clients of running servers: Triton's tensorrt_llm model (gRPC stream), OpenAI /v1/completions
sweep.py      dflash-sweep: levels -> JSONL rows (settings, versions, command, metrics)
results.py    JSONL rows, trtllm-bench reports and benchmark_serving results -> plot points
plot.py       dflash-plot: Pareto PNG, iso-interactivity throughput ratio PNG + markdown table

The measurement tools, each ``dflash-bench NAME`` (cli.py) or ``python -m trtllm_dflash.bench.NAME``:
engine       step (decode-step cost vs the HBM roofline), load (closed loop in-process), tp, tp_allreduce, gpt_oss_step,
             gpt_oss_tp
kernels      gemm, fp8_gemm, sample, mxfp4, gpt_oss_kernels, layer_op_counts
quality      acceptance (tau), quant_report, cuda_check (+ divergence.py, the bf16 policy), cpu_generate_parity
serving      soak (a fault-injection soak of a running server), serving_overhead, guard_overhead, aiperf_openai
reports      gpu_tests, gpu_test_report, e2e_summary, sweep2_summary, bit_exact_summary, draft_policy_tables
"""
