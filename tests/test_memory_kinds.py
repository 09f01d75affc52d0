"""Tests of the memory kinds against their definitions (Expire-Span eq. 3-8, Adaptive-Span,
mean-pool Compressive memory)."""

from __future__ import annotations

import math

import pytest
import torch

from memory import MemoryConfig, MemoryTransformer
from memory.attention import MemoryAttention, Segment, log_mask
from memory.compressive import mean_pool
from memory.expire_span import (
    SpanPredictor,
    attended_span_loss,
    expire_mask,
    expire_span_loss,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def small_core(kind: str, **fields) -> MemoryTransformer:
    defaults = dict(kind=kind, num_layers=2, dim=16, num_heads=2, ffn_dim=32, block_len=5)
    torch.manual_seed(0)
    return MemoryTransformer(MemoryConfig(**{**defaults, **fields})).eval()


def run(core, x, state=None, starts=None, block=None):
    state = state or core.initial_state(x.shape[0])
    block = block or x.shape[1]
    outputs = []
    for k in range(0, x.shape[1], block):
        out = core(x[:, k : k + block], state, None if starts is None else starts[:, k : k + block])
        state = out.state
        outputs.append(out.hidden)
    return torch.cat(outputs, 1), out


# --- Expire-Span --------------------------------------------------------------------------


def test_expire_mask_is_eq_5():
    relative = torch.tensor([[-1.0, -5.0, -10.0, 0.0]])  # memories 1, 5, 10, 0 steps back
    span = torch.tensor([[4.0, 4.0, 4.0, 0.0]])
    # m = clamp(1 + (e - (t - i)) / R, 0, 1) with R = 2
    assert expire_mask(relative, span, None, 2.0).tolist() == [[[1.0, 0.5, 0.0, 1.0]]]
    later = expire_mask(relative, span, torch.tensor([0.0, 1.0, 2.0]), 2.0)
    assert later[0, :, 1].tolist() == [0.5, 0.0, 0.0]  # the same memory, one and two steps on
    assert later[0, :, 0].tolist() == [1.0, 1.0, 1.0]  # t - i = 1..3 < e


def test_expire_span_loss_counts_memories_on_the_ramp():
    mask = torch.tensor([[[1.0, 0.5, 0.0], [0.25, 0.0, 1.0]]])  # B = 1, T = 2 queries
    span = torch.tensor([[2.0, 4.0, 6.0]])
    # on the ramp: (t0, memory 1) with e = 4 and (t1, memory 0) with e = 2
    assert expire_span_loss(mask, span, ramp=2.0, coef=0.1).item() == pytest.approx(
        0.1 / (2 * 2 * 1) * (4 + 2)
    )


def test_span_predictor_is_eq_3_and_eq_8():
    h = torch.randn(3, 5, 8)
    for scaled, divisor in ((False, 1.0), (True, 16.0)):
        cfg = MemoryConfig(dim=8, num_heads=2, max_span=200, ramp=16, scaled_span=scaled)
        predictor = SpanPredictor(cfg)
        assert torch.allclose(predictor(h), torch.full((3, 5), 20.0))  # A.1: 0.1 L at init
        torch.nn.init.normal_(predictor.linear.weight)
        w, b = predictor.linear.weight[0], predictor.linear.bias
        assert torch.allclose(predictor(h), 200 * torch.sigmoid((h @ w + b) / divisor))


def uniform_span_core(max_span: int, fraction: float, ramp: float) -> MemoryTransformer:
    """w = 0: every memory of every layer has the span e = fraction * L."""
    return small_core(
        "expire_span", max_span=max_span, init_span_fraction=fraction, ramp=ramp, aux_loss_coef=0.01
    )


def test_expire_span_aux_loss_and_memory_size_follow_the_equations():
    core = uniform_span_core(max_span=12, fraction=0.3, ramp=3)  # e = 3.6
    e, ramp, length = 3.6, 3.0, 10
    m = [min(1.0, max(0.0, 1 + (e - d) / ramp)) for d in range(length)]  # eq. 5 by distance
    pairs = [(t, d) for t in range(length) for d in range(t + 1)]
    on_ramp = sum(1 for _, d in pairs if 0 < m[d] < 1)  # distances 4, 5, 6
    seen = sum(1 for _, d in pairs if d > 0 and m[d] > 0)
    out = core(torch.randn(1, length, 16), core.initial_state(1))
    # eq. 7 taken on the ramp (4.2): alpha / (R T) per pair, two layers with the same spans
    assert out.aux_loss.item() == pytest.approx(2 * 0.01 * on_ramp * e / (ramp * length))
    assert out.memory_size == pytest.approx(seen / length)
    steady = core(torch.randn(1, length, 16), out.state)
    assert steady.memory_size == math.ceil(e + ramp) - 1  # memories with m > 0


def span_gradient(core, blocks: list[torch.Tensor]) -> torch.Tensor:
    """Gradient of the task loss (not the aux loss) with respect to all w and b."""
    core.zero_grad()
    state = core.initial_state(1)
    with torch.no_grad():
        for x in blocks[:-1]:
            state = core(x, state).state
    core(blocks[-1], state).hidden.square().sum().backward()
    predictors = [p for layer in core.layers for p in layer.kind.predictor.parameters()]
    return torch.cat(
        [torch.zeros(p.numel()) if p.grad is None else p.grad.flatten() for p in predictors]
    )


def test_task_gradient_reaches_spans_only_through_the_ramp():
    x = torch.randn(1, 20, 16)
    # e = 50: every memory of a 20-step sequence is fully inside its mask (m = 1)
    inside = uniform_span_core(max_span=100, fraction=0.5, ramp=3)
    assert span_gradient(inside, [x]).abs().max() == 0
    # e = 5: memories 6 and 7 steps back are on the ramp
    ramped = uniform_span_core(max_span=100, fraction=0.05, ramp=3)
    assert span_gradient(ramped, [x]).abs().max() > 1e-4
    # memories of an earlier block on the ramp: their spans are recomputed with the current
    # w, b (no in-block memory is on the ramp in a block of 2 steps)
    assert span_gradient(ramped, [x[:, :18], x[:, 18:]]).abs().max() > 1e-7


def test_mask_gradient_is_zero_off_the_ramp_and_finite_through_the_log():
    span = torch.tensor([[2.0, 2.0, 2.0]], requires_grad=True)
    relative = torch.tensor([[-1.0, -3.5, -9.0]])  # m = 1, 0.25 (on the ramp), 0 (expired)
    m = expire_mask(relative, span, None, 2.0)
    scores = torch.tensor([0.3, -0.2, 5.0]) + log_mask(m, torch.float32)
    torch.softmax(scores, -1)[..., 0].sum().backward()  # the expired key scores highest
    assert m.tolist() == [[[1.0, 0.25, 0.0]]]
    assert span.grad[0, 0] == 0 and span.grad[0, 2] == 0 and span.grad[0, 1] != 0
    assert torch.isfinite(span.grad).all()


def attend(scores: torch.Tensor, m: torch.Tensor, values: torch.Tensor):
    """MemoryAttention's output before W_o for one query with scores q.k_i = ``scores`` (N,),
    mask m_i and values (N, dim), as a memory kind hands it its keys (``MemoryKind.read``),
    and the attention weights (N,)."""
    length, dim = values.shape
    attention = MemoryAttention(MemoryConfig(dim=dim, num_heads=1, block_len=2))
    with torch.no_grad():
        attention.out.weight.copy_(torch.eye(dim))
        attention.out.bias.zero_()
    q = torch.zeros(1, 1, 1, dim)
    q[..., 0] = dim**0.5  # undoes the 1/sqrt(head_dim) scale
    keys = torch.zeros(1, 1, dim, length)
    keys[0, 0, 0] = scores
    m = m.view(1, 1, 1, length)
    segment = Segment(keys, values[None, None], log_mask(m, torch.float32))
    far = torch.full((1, length), 2)  # beyond block_len: no position term
    out, weights = attention(q, [segment], length, far, keep_weights=True)
    return out.view(dim), weights.view(length)


def test_masked_attention_is_eq_4():
    scores = torch.tensor([2.0, 0.0, 0.5, -1.0])
    m = torch.tensor([0.25, 1.0, 0.0, 0.5])
    values = torch.randn(4, 8)
    expected = m[m > 0] * torch.softmax(scores[m > 0], -1)  # softmax over the kept memories
    expected = expected / expected.sum()  # eq. 4
    out, weights = attend(scores, m, values)
    assert torch.allclose(weights[m > 0], expected, atol=1e-6) and weights[m == 0].item() == 0
    assert torch.allclose(out, expected @ values[m > 0], atol=1e-6)


def test_a_memory_the_attention_saturates_on_gets_almost_no_mask_gradient():
    """d o / d m_cue for a memory with weight a_cue = 0.999: about 0 with eq. 4 (the output
    is the cue's value for any m above e^-(score gap)), against a_cue v_cue . v_cue for a mask
    that scaled the weights without renormalising them (m a)."""
    scores = torch.tensor([9.0, 0.0, 0.0, 0.0])
    values = torch.randn(4, 8)
    a_cue = torch.softmax(scores, -1)[0]
    m = torch.tensor([0.5, 1.0, 1.0, 1.0], requires_grad=True)
    (attend(scores, m, values)[0] @ values[0]).backward()
    assert abs(m.grad[0].item()) < 0.01 * (a_cue * values[0] @ values[0]).item()


def hold_span(attended_coef: float = 0.0, steps: int = 400, distance: int = 20) -> list[float]:
    """A query at age ``distance`` needs the cue's value and its attention saturates on the
    cue; the span's logit trains with Adam against the penalty alpha * e, as the learner's
    steps do, plus ``attended_coef`` times the attended-span loss. Returns m at the query
    after each step."""
    max_span, ramp, alpha = 32, 4.0, 0.05
    scores = torch.tensor([9.0, 0.0, 0.0, 0.0])
    values = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    logit = torch.tensor(1.5, requires_grad=True)  # e = 26.4: m = 1 at the query
    optimizer = torch.optim.Adam([logit], lr=0.03)
    history = []
    for _ in range(steps):
        span = max_span * torch.sigmoid(logit)
        m_cue = expire_mask(torch.tensor([[-float(distance)]]), span.view(1, 1), None, ramp)
        m = torch.cat([m_cue.view(1), torch.ones(3)])
        out, weights = attend(scores, m, values)
        task = (out - values[0]).pow(2).sum()
        cue = torch.zeros(1, 1, dtype=torch.long)
        query = torch.full((1, 1), distance)
        relied_on = attended_span_loss(
            weights[:1].view(1, 1, 1, 1), cue, span.view(1, 1), query, 0.5
        )
        optimizer.zero_grad()
        (task + alpha * span + attended_coef * relied_on).backward()
        optimizer.step()
        history.append(m_cue.item())
    return history


def test_the_penalty_alone_loses_the_span_a_saturated_attention_needs():
    """With eq. 4 the penalty takes the cue's span down to the cliff, where the output loses
    the cue: along the ramp the task gives the span almost no gradient (previous test)."""
    assert max(hold_span()[-100:]) < 0.1


@pytest.mark.parametrize("margin", [0.0, 0.5])
def test_attended_span_loss_is_the_shortfall_below_the_oldest_age_relied_on(margin):
    weights = torch.zeros(1, 2, 3, 2)  # (B, H, Q, N): queries at t = 10, 11, 12
    weights[0, 1, 1, 0] = 0.7  # head 1 of the query at 11 relies on memory 0 (t = 2): age 9
    weights[0, 0, 2, 0] = 0.4  # below the threshold: ignored
    weights[0, 0, 0, 1] = 0.9  # memory 1 (t = 8) at age 2, and its span is 5: no shortfall
    position = torch.tensor([[2, 8]])
    span = torch.tensor([[6.0, 5.0]], requires_grad=True)
    queries = torch.tensor([[10, 11, 12]])
    loss = attended_span_loss(weights, position, span, queries, 0.5, margin)
    loss.backward()
    assert loss.item() == pytest.approx((1 + margin) * 9 - 6)  # memory 1: (1 + margin) 2 < 5
    assert span.grad.tolist() == [[-1.0, 0.0]]


def test_attended_spans_hold_what_a_saturated_attention_relies_on():
    """With eq. 4 kept, the pull to the age at which the attention relies on the cue holds
    its span where the penalty alone loses it (previous test)."""
    kept = hold_span(attended_coef=0.2)
    assert min(kept[-100:]) > 0.9


def test_deleting_expired_memories_changes_no_output():
    core = small_core("expire_span", max_span=24, ramp=4)
    keeper = small_core("expire_span", max_span=24, ramp=4)
    with torch.no_grad():
        for a, b in zip(core.layers, keeper.layers, strict=True):
            a.kind.predictor.linear.weight.normal_(0, 2.0)  # spans from ~0 to ~L
            b.load_state_dict(a.state_dict())
            b.kind.alive = lambda slots, time, begin: slots.position >= 0  # never delete
    x = torch.randn(3, 60, 16)
    starts = torch.rand(3, 60, generator=torch.Generator().manual_seed(2)) < 0.05
    with torch.no_grad():
        deleted, deleted_out = run(core, x, starts=starts, block=10)
        kept, kept_out = run(keeper, x, starts=starts, block=10)
    assert (deleted - kept).abs().max() < 1e-5
    assert max(deleted_out.state.stored_lengths()) < min(kept_out.state.stored_lengths())
    assert deleted_out.memory_size == pytest.approx(kept_out.memory_size)


def test_random_memory_shortening_cuts_attention_but_keeps_the_memory(monkeypatch):
    core = small_core("expire_span", max_span=12, memory_shortening=True)
    x = torch.randn(2, 12, 16)
    with torch.no_grad():
        alone, _ = run(core, x, starts=torch.ones(2, 12, dtype=torch.bool))
        monkeypatch.setattr(torch, "rand", lambda *args, **kwargs: torch.zeros(()))  # l = 0
        shortened, out = run(core.train(), x)
        _, evaluated = run(core.eval(), x)
    assert (shortened - alone).abs().max() < 1e-5  # with l = 0 a query sees only itself
    assert out.state.stored_lengths() == evaluated.state.stored_lengths()


# --- Adaptive-Span ------------------------------------------------------------------------


def test_adaptive_mask_and_loss_follow_the_definition():
    core = small_core("adaptive_span", max_span=12, ramp=3, aux_loss_coef=0.01)
    adaptive = core.layers[0].kind
    with torch.no_grad():
        adaptive.span_fraction.copy_(torch.tensor([0.25, 0.5]))  # z = 3, 6
    relative = -torch.arange(11.0)[None]  # distances 0..10
    mask = adaptive.mask(relative, None, None)[0, :, 0]
    for head, z in enumerate((3.0, 6.0)):
        expected = [min(1.0, max(0.0, 1 + (z - d) / 3)) for d in range(11)]
        assert mask[head].tolist() == pytest.approx(expected)
    out = core(torch.randn(1, 4, 16), core.initial_state(1))
    # alpha * mean_h z_h per layer; the second layer still has z = 0.1 L for both heads
    assert out.aux_loss.item() == pytest.approx(0.01 * 4.5 + 0.01 * 1.2)


def test_adaptive_spans_stay_in_range_and_trim_the_memory():
    core = small_core("adaptive_span", max_span=12, ramp=3)
    with torch.no_grad():
        for layer in core.layers:
            layer.kind.span_fraction.copy_(torch.tensor([-0.5, 0.25]))  # after a bad update
    core.train()
    _, out = run(core, torch.randn(1, 30, 16))
    assert core.layers[0].kind.span_fraction.tolist() == [0.0, 0.25]  # projected to [0, 1]
    # the longest head span is z = 3: a memory lives while t - i < z + R = 6
    assert out.state.stored_lengths() == [5, 5]


# --- Compressive --------------------------------------------------------------------------


def test_compressed_memories_are_means_of_evicted_groups():
    L, c, kept = 6, 3, 2
    core = small_core("compressive", max_span=L, compress_rate=c, compressed_span=kept)
    memories = []  # the layer-normed inputs of layer 0: its memories
    core.layers[0].attention_norm.register_forward_hook(lambda m, i, out: memories.append(out))
    starts = torch.zeros(2, 31, dtype=torch.bool)
    starts[1, 11] = True  # element 1's groups are aligned to its episode begin
    with torch.no_grad():
        _, out = run(core, torch.randn(2, 31, 16), starts=starts, block=7)
    h = torch.cat(memories, 1)
    compressed = out.state.layers[0]["compressed"].view()
    for b, begin in ((0, 0), (1, 11)):
        firsts = compressed.position[b][compressed.position[b] >= 0].tolist()
        # the groups in [t - L - c*kept, t - L) for the next query t = 31, aligned to begin
        assert firsts == [f for f in range(begin, 31 - L, c) if 31 - f <= L + c * kept]
        for slot, first in enumerate(compressed.position[b].tolist()):
            if first >= 0:
                mean = h[b, first : first + c].mean(0)
                assert torch.allclose(compressed.hidden[b, slot], mean, atol=1e-6)
                keys, _ = core.layers[0].attention.key_value(mean[None, None])
                assert torch.allclose(compressed.keys[b, :, :, slot], keys[0, :, :, 0], atol=1e-5)
    recent = out.state.layers[0]["recent"].view()
    assert max(len(recent.position[b]) for b in range(2)) <= L  # the FIFO


def test_compressive_memory_size_is_fifo_plus_compressed():
    L, c, kept = 6, 3, 2
    core = small_core("compressive", max_span=L, compress_rate=c, compressed_span=kept)
    with torch.no_grad():
        _, out = run(core, torch.randn(1, 30, 16))
        out = core(torch.randn(1, 3 * c, 16), out.state)
    # over c consecutive queries the FIFO holds L, L - 1, ..., L - c + 1 memories
    assert out.memory_size == pytest.approx(L - (c - 1) / 2 + kept)


def test_mean_pool_averages_runs():
    h = torch.arange(12.0).view(1, 6, 2)
    assert mean_pool(h, 3)[0, :, 0].tolist() == [2.0, 4.0, 6.0, 8.0]
