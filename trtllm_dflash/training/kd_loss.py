# SPDX-License-Identifier: Apache-2.0
"""ModelOpt 0.47's self-logit distillation loss, computed in row chunks so no [rows, vocab] tensor of the whole
batch ever exists.

ModelOpt's DFlash forward applies the target's lm_head to every draft query (batch x anchors x block_size rows),
gathers the target's logits for each row, and takes softmax, log_softmax, their product and an argmax over the
full vocabulary: several [rows, vocab] float32 tensors (SmolLM2 at batch 64: 131k x 49k), kept for backward. Here
each chunk of rows goes through lm_head and a logsumexp and is dropped again; the teacher side is folded into one
expected embedding per distinct target position (see ``_FusedLinearKD``), and the gradient w.r.t. the draft's
hidden states (``(w_i / norm) * (softmax(z_i) W - p_i W)``) is computed in the same pass, so backward only scales
it. Rows of weight 0 (each block's anchor, masked blocks and tokens) add nothing to the loss, its gradient or the
accuracy, so they are skipped.

Numerics follow ModelOpt's path where it matters: lm_head runs in the autocast dtype when autocast is on (bfloat16
on CUDA) and in the inputs' dtype otherwise; the softmaxes and the logsumexp run in float32 under CUDA autocast
(its float32 list), in the logits' dtype otherwise; the argmax is taken on lm_head's output. The products with
W that make the teacher's expected embeddings and the gradient, and the cross term, run in float32 (TF32 on CUDA).

``install(model)`` puts it into a converted ModelOpt model without editing ModelOpt: the model's class becomes a
subclass whose training forward hands the draft's hidden states (not logits) to ``_compute_loss``, which builds
ModelOpt 0.47's weights and runs the chunked loss. ``python -m trtllm_dflash.training.kd_loss --bench`` times one
forward + backward of both ways on the current device.
"""
from __future__ import annotations

import argparse
import contextlib
import time

import torch

from ..errors import DFlashError

# Rows per chunk: at SmolLM2's 49,152-token vocabulary one float32 [rows, vocab] temporary is 0.8 GB.
CHUNK_ROWS = 4096
_DEFER = "_dflash_kd_defer_head"     # set while a training forward runs: lm_head passes hidden states through
_CHUNK = "_dflash_kd_chunk_rows"
_CLASSES: dict[type, type] = {}


def _autocast_dtype(device: torch.device) -> torch.dtype | None:
    return torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) else None


class _FusedLinearKD(torch.autograd.Function):
    """sum_i w_i * -(softmax(t_i) . log_softmax(h_i W^T)) / norm, and how many argmax(h_i W^T) == target_i
    among the rows of ``counted``.

    Since a teacher distribution p sums to 1, -(p . log_softmax(z)) = logsumexp(z) - p . z, and p . (h W^T) =
    h . (p W). So each distinct teacher row is softmaxed once, into its expected embedding e = p W ([H], not
    [V]; ~7 draft rows share one at block 16), and a draft row needs only its logsumexp and h . e; its gradient
    is (softmax(z) W - e) scaled by its weight. The two products with W and the cross term run in float32 (TF32
    on CUDA: the difference softmax(z) W - e must not lose the small gradient of a well-fitted row to bfloat16
    rounding)."""

    @staticmethod
    def forward(ctx, hidden, weight, teacher, teacher_index, row_weight, norm, targets, counted, chunk_rows):
        amp = _autocast_dtype(hidden.device)
        mm_dtype = amp if amp is not None else hidden.dtype
        if amp is None and weight.dtype != hidden.dtype:
            raise DFlashError("fused KD loss", f"hidden states are {hidden.dtype} but lm_head is {weight.dtype} "
                              "outside autocast", "run the forward under torch.autocast, as dflash-train does")
        # CUDA autocast runs softmax and log_softmax in float32; CPU autocast leaves them in its own dtype
        upcast = amp is not None and hidden.device.type == "cuda"
        soft_dtype = torch.float32 if upcast else mm_dtype          # the draft's softmax
        teacher_dtype = torch.float32 if upcast else teacher.dtype  # the target's
        out_dtype = torch.promote_types(torch.promote_types(soft_dtype, teacher_dtype), row_weight.dtype)
        acc = torch.float64 if mm_dtype == torch.float64 else torch.float32
        # the loss's dtype, as autograd scales ModelOpt's rows (1 / norm, then times the row's weight)
        scale = row_weight.to(out_dtype) * (1 / norm.to(out_dtype))
        w_mm, w_acc = weight.to(mm_dtype), weight.to(acc)
        loss = torch.zeros((), dtype=torch.float64, device=hidden.device)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        grad = torch.zeros_like(hidden)
        distinct, which = torch.unique(teacher_index, return_inverse=True)
        kernels = _kernels(hidden.device, soft_dtype)
        with torch.autocast(hidden.device.type, enabled=False), _tf32(hidden.device):
            e = torch.empty(len(distinct), weight.shape[1], dtype=acc, device=hidden.device)   # [T, H]
            for start in range(0, len(distinct), chunk_rows):
                t = slice(start, start + chunk_rows)
                e[t] = torch.softmax(teacher[distinct[t]].to(teacher_dtype), dim=-1).to(acc) @ w_acc
            for start in range(0, hidden.shape[0], chunk_rows):
                rows = slice(start, start + chunk_rows)
                h = hidden[rows].to(mm_dtype)                                  # [n, H]
                z = h @ w_mm.T                                                 # [n, V]
                if kernels is not None:   # one read of z for logsumexp + argmax, one more for the softmax
                    lse, top = kernels.row_stats(z)                            # [n], [n]
                    q = kernels.softmax(z, lse)                                # [n, V] float32
                else:
                    top = z.argmax(dim=-1)
                    z = z.to(soft_dtype)
                    lse = torch.logsumexp(z, dim=-1)
                    q = z.sub_(lse.unsqueeze(-1)).exp_().to(acc)               # softmax(z), in z's memory
                del z
                correct += ((top == targets[rows]) & counted[rows]).sum()
                e_rows = e[which[rows]]                                        # [n, H]
                kd = lse.to(acc) - (h.to(acc) * e_rows).sum(dim=-1)
                loss += (kd * row_weight[rows]).sum().double()
                grad[rows] = ((q @ w_acc).sub_(e_rows).mul_(scale[rows].unsqueeze(-1))).to(hidden.dtype)
                del q
        ctx.save_for_backward(grad)
        ctx.mark_non_differentiable(correct)
        return (loss / norm.double()).to(out_dtype), correct

    @staticmethod
    def backward(ctx, grad_loss, grad_correct):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss.to(grad.dtype), None, None, None, None, None, None, None, None


def _kernels(device: torch.device, soft_dtype: torch.dtype):
    """kd_kernels (Triton) for the passes over each chunk's logits on CUDA with a float32 softmax (autocast);
    None: the torch ops (the CPU, float64)."""
    if device.type == "cuda" and soft_dtype == torch.float32:
        from . import kd_kernels
        return kd_kernels
    return None


@contextlib.contextmanager
def _tf32(device: torch.device):
    """float32 matmuls as TF32 on CUDA for the duration (fp32 accumulation and output, tensor-core speed)."""
    if device.type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def fused_kd(hidden: torch.Tensor, weight: torch.Tensor, teacher: torch.Tensor, teacher_index: torch.Tensor,
             row_weight: torch.Tensor, norm: torch.Tensor, targets: torch.Tensor, counted: torch.Tensor,
             chunk_rows: int = CHUNK_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, correct count) of rows ``hidden`` [N, H] under the frozen ``weight`` [V, H]; row i's teacher logits
    are ``teacher[teacher_index[i]]``. Rows with neither weight nor ``counted`` are dropped before the chunks."""
    if weight.requires_grad:
        raise DFlashError("fused KD loss", "lm_head weight requires grad (the fused loss gives it none)",
                          "keep the target frozen (dflash_freeze_base_model) or pass --kd_impl modelopt")
    if chunk_rows <= 0:
        raise DFlashError("fused KD chunk_rows", f"must be > 0, got {chunk_rows}", "use 4096")
    keep = ((row_weight != 0) | counted).nonzero().squeeze(-1)
    return _FusedLinearKD.apply(hidden[keep], weight.detach(), teacher.detach(), teacher_index[keep],
                                row_weight[keep], norm, targets[keep], counted[keep], chunk_rows)


def loss_weights(model, input_ids, anchor_positions, block_keep_mask, loss_mask):
    """ModelOpt 0.47's ``_compute_loss`` bookkeeping (decay objective): (target ids [B, n, bs], label positions
    [B, n, bs] clamped into the sequence, eval mask before the decay, weights after it)."""
    seq_len = input_ids.shape[1]
    bs = model.dflash_block_size
    n_blocks = anchor_positions.shape[1]
    k = torch.arange(bs, device=input_ids.device).view(1, 1, -1)
    label = anchor_positions.unsqueeze(-1) + k
    safe = label.clamp(max=seq_len - 1)
    targets = torch.gather(input_ids.unsqueeze(1).expand(-1, n_blocks, -1), 2, safe)
    mask = block_keep_mask.unsqueeze(-1).expand(-1, -1, bs).float() * (label < seq_len).float()
    mask = mask * (k > 0).float()
    mask = mask * torch.gather(loss_mask.unsqueeze(1).expand(-1, n_blocks, -1), 2, safe)
    weights = mask
    if model.dflash_loss_decay_factor > 0:
        weights = mask * torch.exp(-(k - 1).clamp(min=0).float() / model.dflash_loss_decay_factor)
    return targets, safe, mask, weights


def _check(model) -> None:
    from ..versions import installed
    from .modelopt_model import MODELOPT_TESTED

    got = installed("nvidia-modelopt")["nvidia-modelopt"]
    if got != MODELOPT_TESTED:
        raise DFlashError("--kd_impl fused", f"reproduces ModelOpt {MODELOPT_TESTED}'s loss, found {got}",
                          f"install nvidia-modelopt=={MODELOPT_TESTED} or pass --kd_impl modelopt")
    for name in ("_compute_loss", "_base_model_lm_head", "dflash_block_size", "dflash_loss_decay_factor"):
        if not hasattr(type(model), name) and not hasattr(model, name):
            raise DFlashError("--kd_impl fused", f"the ModelOpt model has no {name}", "pass --kd_impl modelopt")
    objective = getattr(model, "dflash_loss_objective", "decay")
    if objective != "decay":
        raise DFlashError("dflash_loss_objective", f"is {objective!r}; the fused KD loss reproduces only 'decay'",
                          "use the decay objective or pass --kd_impl modelopt")
    if getattr(model, "dflash_offline", False):
        raise DFlashError("dflash_offline", "is on; the fused KD loss covers online training only",
                          "pass --kd_impl modelopt")


def install(model, chunk_rows: int = CHUNK_ROWS) -> None:
    """Compute the KD loss of a converted ModelOpt DFlash model with ``fused_kd``, in place (before
    ``anchors.install``, which wraps this model's ``_compute_loss``)."""
    _check(model)
    base = type(model)
    if base in _CLASSES.values():       # installed already: a new chunk size only
        model.__dict__[_CHUNK] = chunk_rows
        return
    if base not in _CLASSES:
        _CLASSES[base] = type(base.__name__, (base,), {
            "__module__": base.__module__, "forward": _forward(base), "_compute_loss": _compute_loss(base),
            "_base_model_lm_head": property(_head(base))})
    model.__class__ = _CLASSES[base]
    model.__dict__[_CHUNK] = chunk_rows
    model.__dict__[_DEFER] = False


def _forward(base):
    def forward(self, *args, **kwargs):
        self.__dict__[_DEFER] = self.training
        try:
            return base.forward(self, *args, **kwargs)
        finally:
            self.__dict__[_DEFER] = False
    return forward


def _head(base):
    real = base._base_model_lm_head.fget

    def head(self):
        return (lambda hidden: hidden) if self.__dict__.get(_DEFER) else real(self)
    return head


def _compute_loss(base):
    real_head = base._base_model_lm_head.fget

    def compute_loss(self, logits, input_ids, anchor_positions, block_keep_mask, loss_mask, base_logits=None):
        if not self.__dict__.get(_DEFER):   # called with real logits, outside a training forward
            return base._compute_loss(self, logits, input_ids, anchor_positions, block_keep_mask, loss_mask,
                                      base_logits)
        hidden, head = logits, real_head(self)
        if base_logits is None:             # cross-entropy: ModelOpt's own, on materialised logits
            return base._compute_loss(self, head(hidden), input_ids, anchor_positions, block_keep_mask,
                                      loss_mask, None)
        if self.dflash_loss_objective != "decay":
            raise DFlashError("dflash_loss_objective", f"is {self.dflash_loss_objective!r}; the fused KD loss "
                              "reproduces only 'decay'", "pass --kd_impl modelopt")
        bsz, seq_len = input_ids.shape
        targets, safe, mask, weights = loss_weights(self, input_ids, anchor_positions, block_keep_mask, loss_mask)
        valid_count = weights.sum() + 1e-6
        if not valid_count > 1.0:
            return hidden.sum() * 0.0, 0.0
        rows = torch.arange(bsz, device=input_ids.device).view(-1, 1, 1) * seq_len
        teacher_index = (rows + (safe - 1).clamp(min=0)).reshape(-1)
        loss, correct = fused_kd(hidden.reshape(-1, hidden.shape[-1]), head.weight,
                                 base_logits.reshape(-1, base_logits.shape[-1]), teacher_index, weights.reshape(-1),
                                 valid_count, targets.reshape(-1), mask.reshape(-1) > 0.5, self.__dict__[_CHUNK])
        accuracy = (correct.float() / (mask.sum() + 1e-6)).item()
        return loss, accuracy
    return compute_loss


# ---- micro-benchmark ---------------------------------------------------------------------------------------
def _materialised(hidden, weight, teacher, teacher_index, row_weight, norm):
    """The loss as ModelOpt computes it: whole [N, V] logits, teacher softmax, draft log_softmax."""
    logits = torch.nn.functional.linear(hidden, weight)
    p = torch.softmax(teacher[teacher_index], dim=-1)
    kd = -(p * torch.log_softmax(logits, dim=-1)).sum(dim=-1)
    logits.argmax(dim=-1)
    return (kd * row_weight).sum() / norm


def bench(rows: int, vocab: int, hidden_size: int, teacher_rows: int, chunk_rows: int, device: str) -> dict:
    dev = torch.device(device)
    amp = dev.type == "cuda"
    wdtype = torch.bfloat16 if amp else torch.float32
    g = torch.Generator(device="cpu").manual_seed(0)
    weight = (torch.randn(vocab, hidden_size, generator=g) * 0.05).to(dev, wdtype)
    teacher = (torch.randn(teacher_rows, vocab, generator=g) * 3).to(dev, wdtype)
    index = torch.randint(0, teacher_rows, (rows,), generator=g).to(dev)
    row_weight = torch.rand(rows, generator=g).to(dev)
    targets = torch.randint(0, vocab, (rows,), generator=g).to(dev)
    norm = row_weight.sum() + 1e-6
    out = {}
    for name in ("modelopt", "fused"):
        h = torch.randn(rows, hidden_size, generator=g).to(dev).requires_grad_()
        times = []
        try:
            for _ in range(3):
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.reset_peak_memory_stats()
                t0 = time.perf_counter()
                with torch.autocast("cuda", dtype=torch.bfloat16) if amp else contextlib.nullcontext():
                    if name == "fused":
                        loss, _ = fused_kd(h, weight, teacher, index, row_weight, norm, targets, row_weight > 0,
                                           chunk_rows)
                    else:
                        loss = _materialised(h, weight, teacher, index, row_weight, norm)
                loss.backward()
                del loss
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                h.grad = None
        except torch.cuda.OutOfMemoryError:
            out[name] = "out of memory"
            continue
        finally:
            del h
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        out[name] = {"ms": round(min(times[1:]) * 1e3, 2),
                     "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev.type == "cuda" else None}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trtllm_dflash.training.kd_loss",
                                description="time one forward + backward of the KD loss, ModelOpt's way and fused")
    p.add_argument("--bench", action="store_true", required=True)
    p.add_argument("--rows", type=int, default=64 * 128 * 16, help="draft query rows (batch x anchors x block)")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--teacher_rows", type=int, default=64 * 2048, help="target positions (batch x seq)")
    p.add_argument("--chunk_rows", type=int, default=CHUNK_ROWS)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = p.parse_args(argv)
    print(bench(a.rows, a.vocab, a.hidden, a.teacher_rows, a.chunk_rows, a.device))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
