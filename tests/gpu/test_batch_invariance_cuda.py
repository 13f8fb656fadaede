# SPDX-License-Identifier: Apache-2.0
"""tests/runtime/test_batch_invariance.py's kernel tests on CUDA (``pytest -m gpu``): there they run in bfloat16 as
well, with rows anywhere in their tile and a verify's token at any place in its block (the interpreter on the CPU
keeps each row's place, since numpy's BLAS tl.dot gives a row other bits at another place)."""
from __future__ import annotations

import pytest

from tests.runtime.test_batch_invariance import (  # noqa: F401 (collected here, under the gpu mark)
    test_attention_rows_do_not_depend_on_the_block_the_batch_or_the_kv_length,
    test_attention_with_sinks_and_a_window_is_invariant_and_right, test_gemm_rows_do_not_depend_on_the_row_count,
    test_rms_norm_rows_do_not_depend_on_the_row_count,
    test_sampled_and_greedy_tokens_do_not_depend_on_the_batch_and_ties_go_to_the_lowest_id)

pytestmark = pytest.mark.gpu
