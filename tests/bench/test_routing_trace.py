# SPDX-License-Identifier: Apache-2.0
"""Routing traces of the gpt-oss step benchmark: their statistics, and that the experts really get their ids."""
from __future__ import annotations

import pytest
import torch

from trtllm_dflash.bench.routing_trace import Routing, TraceRouter, distinct_experts

L, E, K = 6, 128, 4   # gpt-oss-120b's experts and top-k, fewer layers


def valid(ids: torch.Tensor, n: int, B: int) -> bool:
    return (ids.shape == (L, n * B, K) and ids.dtype == torch.int64 and bool(((ids >= 0) & (ids < E)).all())
            and all(len(set(t)) == K for t in ids.view(-1, K).tolist()))


@pytest.mark.parametrize("n, B", [(1, 10), (4, 10), (1, 8), (16, 1), (64, 1)])
def test_skewed_touches_fewer_experts_than_uniform_and_more_than_all_same(n, B):
    uniform = Routing("uniform", seed=3).trace(L, n, B, E, K)
    mild = Routing("skewed", zipf=0.5, reuse=0.2, seed=3).trace(L, n, B, E, K)
    heavy = Routing("skewed", zipf=2.0, reuse=0.9, seed=3).trace(L, n, B, E, K)
    assert valid(uniform, n, B) and valid(mild, n, B) and valid(heavy, n, B)
    all_same, worst = L * K, L * min(E, n * B * K)
    counts = [distinct_experts(t) for t in (heavy, mild, uniform)]
    assert all_same < counts[0] < counts[1] < counts[2] <= worst, counts
    # uniform draws are near the expectation E (1 - (1 - K/E) ** tokens) per layer, the worst case for random routing
    expected = L * E * (1 - (1 - K / E) ** (n * B))
    assert abs(counts[2] - expected) < 0.05 * expected


def test_extremes_are_reached():
    # reuse 1: every position of a block repeats the first one's experts -> the all-same count, any popularity
    for zipf in (0.0, 1.5):
        assert distinct_experts(Routing("skewed", zipf=zipf, reuse=1.0).trace(L, 1, 10, E, K)) == L * K
    # no skew at all is the uniform trace itself, draw for draw
    assert torch.equal(Routing("skewed", 0.0, 0.0, seed=5).trace(L, 4, 10, E, K),
                       Routing("uniform", seed=5).trace(L, 4, 10, E, K))
    # a single token touches exactly K experts per layer whatever the routing
    assert distinct_experts(Routing("skewed", 3.0, 0.9).trace(L, 1, 1, E, K)) == L * K


def test_deterministic_per_seed():
    r = Routing("skewed", zipf=1.0, reuse=0.5, seed=7)
    assert torch.equal(r.trace(L, 4, 10, E, K), Routing("skewed", 1.0, 0.5, seed=7).trace(L, 4, 10, E, K))
    assert not torch.equal(r.trace(L, 4, 10, E, K), Routing("skewed", 1.0, 0.5, seed=8).trace(L, 4, 10, E, K))
    # the hot experts of a layer are the same at every shape of a run (popularity depends on seed and layer only)
    top = [torch.bincount(Routing("skewed", 2.0, 0.0, seed=7).trace(L, n, 1, E, K)[0].flatten(), minlength=E).argmax()
           for n in (256, 512)]
    assert top[0] == top[1]


def test_reuse_and_zipf_mean_what_they_say():
    n = 4000
    ids = Routing("skewed", zipf=0.0, reuse=0.3, seed=1).trace(1, n, 2, E, K)[0].view(n, 2, K)
    same_slot = (ids[:, 1] == ids[:, 0]).double().mean().item()
    assert abs(same_slot - 0.3) < 0.03, same_slot        # a fresh draw lands on the same slot's expert ~1/E
    # top-1 with Zipf 1 over 8 experts: the most popular one gets 1 / H_8 of the tokens
    top1 = Routing("skewed", zipf=1.0, reuse=0.0, seed=1).trace(1, n, 1, 8, 1)[0].flatten()
    share = torch.bincount(top1, minlength=8).max().item() / n
    assert abs(share - 1 / sum(1 / r for r in range(1, 9))) < 0.03, share


@pytest.mark.parametrize("kwargs, flag", [
    ({"name": "skewed", "zipf": -1.0}, "--routing_zipf"), ({"name": "skewed", "zipf": float("nan")}, "--routing_zipf"),
    ({"name": "skewed", "reuse": 1.5}, "--routing_reuse"), ({"name": "skewed", "reuse": -0.1}, "--routing_reuse"),
    ({"name": "zipf"}, "--routing"), ({"name": "uniform", "zipf": 1.0}, "--routing")])
def test_bad_skew_is_a_one_line_error_naming_the_flag(kwargs, flag):
    with pytest.raises(ValueError) as err:
        Routing(**kwargs)
    assert str(err.value).startswith(flag + " ") and "\n" not in str(err.value)


def test_bad_skew_stops_the_benchmark_before_it_builds():
    from trtllm_dflash.bench import gpt_oss_step
    with pytest.raises(SystemExit, match=r"--routing_reuse is a probability and must be in \[0, 1\], got 2.0"):
        gpt_oss_step.main(["--tiny", "--device", "cpu", "--routing", "uniform,skewed", "--routing_reuse", "2"])


def test_the_experts_get_the_trace_ids_in_a_real_step():
    """A DFlash step of the tiny gpt-oss target: every layer's experts module is called with the trace's ids
    (request-major, [n * B, k]), not the router's, and the benchmark's distinct-expert count is the trace's."""
    from trtllm_dflash.bench import gpt_oss_step
    target, drafter = gpt_oss_step.build("gpt-oss-20b", True, torch.device("cpu"), torch.float32, 64, "dequant")
    steps = gpt_oss_step.Steps(target, drafter, 2, 16, torch.device("cpu"), torch.float32)
    c = target.config
    routing = Routing("skewed", zipf=1.0, reuse=0.5, seed=2)
    got = []
    steps.router = TraceRouter(routing, target, torch.device("cpu")).attach()
    # registered after the router's hook, so it sees what the experts receive
    hooks = [layer.mlp.experts.register_forward_pre_hook(lambda m, args: got.append(args[1].clone()))
             for layer in target.layers]
    try:
        steps.run(2, 8)
    finally:
        for h in hooks:
            h.remove()
    trace = routing.trace(len(target.layers), 2, 8, c.num_experts, c.experts_per_token)
    assert torch.equal(torch.stack(got), trace)
    assert gpt_oss_step.distinct_experts(steps, 2, 8) == distinct_experts(trace)
    # without the trace the router decides, and its ids differ from the trace's
    steps.router.detach()
    steps.router = None
    got.clear()
    hooks = [layer.mlp.experts.register_forward_pre_hook(lambda m, args: got.append(args[1].clone()))
             for layer in target.layers]
    steps.run(2, 8)
    for h in hooks:
        h.remove()
    assert not torch.equal(torch.stack(got), trace)


def test_trace_of_another_shape_is_refused():
    from trtllm_dflash.bench import gpt_oss_step
    target, drafter = gpt_oss_step.build("gpt-oss-20b", True, torch.device("cpu"), torch.float32, 64, "dequant")
    steps = gpt_oss_step.Steps(target, drafter, 2, 16, torch.device("cpu"), torch.float32)
    router = TraceRouter(Routing("uniform"), target, torch.device("cpu")).attach()
    router.use(1, 8)
    with pytest.raises(RuntimeError, match=r"routing trace for n, B = \(1, 8\) has ids \(8, 2\).*got \(16, 2\)"):
        with torch.inference_mode():
            steps.target(torch.zeros(2, 8, dtype=torch.long), torch.arange(16, 24).expand(2, 8), steps.cache,
                         slice(0, 2), 24)
    router.detach()
