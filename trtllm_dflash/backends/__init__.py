# SPDX-License-Identifier: Apache-2.0
"""Backends that run a dflash-build deployment directory (``Deployment.backend`` names one):

torch   our PyTorch DFlash runtime (``trtllm_dflash.runtime.engine.Engine.from_deployment``), CPU or GPU
trtllm  TensorRT-LLM >=1.3.0rc15,<1.5, PyTorch backend (``backends.trtllm.load_llm``; imported lazily)
"""
