# SPDX-License-Identifier: Apache-2.0
"""Sweeps: throughput (tok/s/gpu) vs interactivity (tok/s/user) over concurrency levels, and their plots.

metrics.py    pure functions: per-request timestamps -> one level's metrics (the definitions live here)
workload.py   prompts (HumanEval / MT-Bench / ShareGPT with the chat template, or random ids); tokens per chunk
drivers.py    closed loops of C requests in flight: the in-process engine, or C client threads
endpoints.py  clients of running servers: Triton's tensorrt_llm model (gRPC stream), OpenAI /v1/completions
sweep.py      dflash-sweep: levels -> JSONL rows (settings, versions, command, metrics)
results.py    JSONL rows, trtllm-bench reports and benchmark_serving results -> plot points
plot.py       dflash-plot: Pareto PNG, iso-interactivity throughput ratio PNG + markdown table
"""
