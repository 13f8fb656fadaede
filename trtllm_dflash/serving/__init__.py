# SPDX-License-Identifier: Apache-2.0
"""Serving a deployment directory with NVIDIA Triton, as TensorRT-LLM's LLM-API Triton model does.

repo.py          fill triton_model_repo/ for one deployment (dflash-build calls fill_triton)
protocol.py      the tensorrt_llm model's inputs and outputs: validation, response tensors
detokenize.py    token chunks -> text pieces (incomplete characters and stop strings held back)
backends.py      torch runtime (scheduler thread, continuous batching) and tensorrt_llm.LLM, one interface
launch.py        tensor parallelism of the torch runtime: mpiexec command for ranks 1..N-1
triton_model.py  what 1/model.py does: requests in, streamed responses out, cancellation, dflash_* metrics
triton_env.py    which tritonserver (NGC on PATH, or the nvidia-pytriton wheel's) and its environment
server.py        dflash-serve: start tritonserver, wait for readiness, stop on SIGTERM/Ctrl-C
client.py        dflash-client: HTTP generate / gRPC stream, prints text as it comes and the DFlash stats
"""
