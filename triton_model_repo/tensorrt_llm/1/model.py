# SPDX-License-Identifier: Apache-2.0
"""TensorRT-LLM's LLM-API Triton model (same inputs and outputs), serving a DFlash deployment with the
backend its manifest names: trtllm_dflash's torch runtime or tensorrt_llm.LLM. The logic lives in
trtllm_dflash.serving.triton_model; this file only connects it to Triton."""
import json
from pathlib import Path

import triton_python_backend_utils as pb_utils

from trtllm_dflash.serving import triton_model

HERE = Path(__file__).resolve().parent


class TritonPythonModel:

    @classmethod
    def auto_complete_config(cls, auto_complete_model_config):
        # As in TensorRT-LLM's model: max_batch_size and decoupled come from model.yaml.
        return triton_model.auto_complete(auto_complete_model_config, HERE / "model.yaml")

    def initialize(self, args):
        triton_model.tune_stub_interpreter()
        self.model = triton_model.DFlashModel(pb_utils, HERE, json.loads(args["model_config"]))

    def execute(self, requests):
        # Responses are sent from the runtime's threads; returning None keeps Triton from waiting.
        self.model.execute(requests)
        return None

    def finalize(self):
        self.model.finalize()
