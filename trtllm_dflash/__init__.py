# SPDX-License-Identifier: Apache-2.0
"""trtllm-dflash: HF target + DFlash drafter -> served, measured, multi-GPU deployments."""
__version__ = "0.1.0"
