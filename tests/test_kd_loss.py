# SPDX-License-Identifier: Apache-2.0
"""The fused KD loss (training/kd_loss.py) against ModelOpt 0.47's own, in float64 on a tiny Llama target: the
same loss, accuracy and draft gradients, in chunks that do and do not divide the rows; and its refusals."""
from __future__ import annotations

import pytest
import torch

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.training import kd_loss
from trtllm_dflash.training.settings import TrainConfig
from tests.test_train import needs_modelopt

pytestmark = [needs_modelopt, pytest.mark.usefixtures("one_torch_thread")]
BLOCK, SEQ, MASK = 8, 48, 95


def _config(tmp_path, target, **kw) -> TrainConfig:
    return TrainConfig(target=str(target), data="unused", out=str(tmp_path / "run"), block_size=BLOCK, num_layers=2,
                       target_layer_ids=(0, 2), num_anchors=5, max_seq_len=SEQ, **kw)


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    from trtllm_dflash.testing import write_tiny_target
    return write_tiny_target(tmp_path_factory.mktemp("kd") / "target")


def _modelopt(tmp_path, target):
    """A model with ModelOpt's own loss (kd_impl modelopt)."""
    from trtllm_dflash.training import modelopt_model
    torch.manual_seed(0)
    m, _ = modelopt_model.build(_config(tmp_path, target, kd_impl="modelopt"), target, MASK, torch.device("cpu"))
    with torch.no_grad():   # only the batch's tokens 2..7 score, so the random draft's argmax hits some labels
        m.lm_head.weight[:2] = 0
        m.lm_head.weight[8:] = 0
    return m.train()


@pytest.fixture(scope="module")
def model(target, tmp_path_factory):
    """In float64, draft and target."""
    return _modelopt(tmp_path_factory.mktemp("run"), target).double()


def _batch() -> dict:
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(2, 8, (3, SEQ), generator=g)
    attention = torch.ones(3, SEQ, dtype=torch.long)
    attention[2, 30:] = 0                       # a padded row: its blocks past 30 are masked
    labels = ids.clone()
    labels[:, :6] = -100                        # the prompt: never a label nor an anchor
    labels[1, 20:26] = -100                     # a hole inside a response
    return {"input_ids": ids, "attention_mask": attention, "labels": labels}


def _run(model) -> tuple[float, float, dict]:
    torch.manual_seed(7)                        # ModelOpt draws the anchors from the global RNG
    model.zero_grad(set_to_none=True)
    out = model(**_batch())
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.dflash_module.named_parameters() if p.requires_grad}
    return out.loss.item(), float(out.train_acc[0][0]), grads


def test_fused_equals_modelopt_loss_accuracy_and_gradients(model):
    loss, acc, grads = _run(model)
    assert loss > 0 and 0 < acc < 1 and len(grads) > 5
    rows = 3 * 5 * BLOCK
    try:
        for chunk in (rows, 16, 7):             # one chunk; chunks dividing the rows; a ragged last chunk
            kd_loss.install(model, chunk_rows=chunk)
            f_loss, f_acc, f_grads = _run(model)
            assert f_loss == pytest.approx(loss, rel=1e-12, abs=0)
            assert f_acc == acc
            for name, g in grads.items():
                assert torch.allclose(f_grads[name], g, rtol=1e-10, atol=1e-12 * g.abs().max()), name
    finally:
        model.__class__ = type(model).__mro__[1]   # back to ModelOpt's class for the other tests


def test_fused_never_runs_more_than_chunk_rows_through_lm_head(model, monkeypatch):
    seen = []
    real = torch.Tensor.__matmul__

    def spy(a, b):
        seen.append(a.shape[0])
        return real(a, b)
    try:
        kd_loss.install(model, chunk_rows=16)
        monkeypatch.setattr(torch.Tensor, "__matmul__", spy)
        _run(model)
    finally:
        monkeypatch.undo()
        model.__class__ = type(model).__mro__[1]
    assert seen and max(seen) <= 16


def test_build_installs_the_fused_loss_for_kd_only(target, tmp_path):
    from trtllm_dflash.training import modelopt_model
    fused, _ = modelopt_model.build(_config(tmp_path, target), target, MASK, torch.device("cpu"))
    ce, _ = modelopt_model.build(_config(tmp_path, target, loss="ce"), target, MASK, torch.device("cpu"))
    assert type(fused) in kd_loss._CLASSES.values() and type(ce) not in kd_loss._CLASSES.values()
    # outside a training forward lm_head is the target's own module (generation, export)
    assert isinstance(fused._base_model_lm_head, torch.nn.Linear)


def test_refusals(model, tmp_path, target):
    model.dflash_loss_objective = "dpace"
    try:
        with pytest.raises(DFlashError, match="dflash_loss_objective.*modelopt"):
            kd_loss.install(model)
    finally:
        model.dflash_loss_objective = "decay"
    w = torch.nn.Parameter(torch.randn(10, 4, dtype=torch.float64))
    h = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    one = torch.ones(6, dtype=torch.float64)
    with pytest.raises(DFlashError, match="lm_head weight requires grad"):
        kd_loss.fused_kd(h, w, torch.randn(3, 10, dtype=torch.float64), torch.zeros(6, dtype=torch.long), one,
                         one.sum(), torch.zeros(6, dtype=torch.long), one > 0)
    with pytest.raises(DFlashError, match="--kd_impl"):
        _config(tmp_path, target, kd_impl="liger")


def test_cli_flag_and_resume_safe():
    from trtllm_dflash import train
    from trtllm_dflash.training.settings import RESUME_SAFE
    cfg = train.config_from_args(["--target", "t", "--data", "d", "--out", "o", "--kd_impl", "modelopt"])
    assert cfg.kd_impl == "modelopt" and "kd_impl" in RESUME_SAFE
    assert train.config_from_args(["--target", "t", "--data", "d", "--out", "o"]).kd_impl == "fused"


def test_mixed_precision_under_autocast_follows_modelopt(target, tmp_path):
    """The training setup's dtypes (bfloat16 target and lm_head, float32 draft, bf16 autocast), on CPU: CPU
    autocast keeps softmax in bfloat16 and the two ways sum in other orders, so they agree to rounding only."""
    m = _modelopt(tmp_path, target)
    m.to(torch.bfloat16).dflash_module.float()

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return _run(m)
    loss, acc, grads = run()
    try:
        kd_loss.install(m, chunk_rows=16)
        f_loss, f_acc, f_grads = run()
    finally:
        m.__class__ = type(m).__mro__[1]
    assert f_loss == pytest.approx(loss, rel=1e-4) and f_acc == acc > 0
    for name, g in grads.items():
        assert f_grads[name].dtype == g.dtype == torch.float32
        cos = torch.nn.functional.cosine_similarity(f_grads[name].flatten(), g.flatten(), dim=0)
        assert cos > 0.9999, (name, float(cos))
