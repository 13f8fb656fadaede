# SPDX-License-Identifier: Apache-2.0
"""bench/gemm.py's shapes: the targets' decoder GEMMs and lm_head, a drafter's fc and layer GEMMs."""
from __future__ import annotations

import pytest

from trtllm_dflash.bench.gemm import gemms, model_shapes


def test_a_drafter_times_its_fc_and_layer_not_a_head():
    """gpt-oss-120b's DFlash drafter (z-lab/gpt-oss-120b-DFlash: 5 target layers of 2880, MLP 7680): the fc over the
    target's hidden states and its layer GEMMs; the target keeps its lm_head."""
    shapes = model_shapes("gpt-oss-120b:drafter,gpt-oss-120b")
    drafter = {name: (K, N) for name, K, N, _ in gemms(shapes["gpt-oss-120b:drafter"])}
    assert drafter == {"fc": (5 * 2880, 2880), "qkv_proj": (2880, (64 + 2 * 8) * 64), "o_proj": (64 * 64, 2880),
                       "gate_up_proj": (2880, 7680), "down_proj": (7680, 2880)}
    assert [name for name, *_ in gemms(shapes["gpt-oss-120b"])][-1] == "lm_head"
    with pytest.raises(SystemExit, match="NAME:drafter"):
        model_shapes("gpt-oss-120b:head")
