"""Tests of the memory package: the core's two modes, episode boundaries, the state."""

from __future__ import annotations

import io
import operator
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from memory import MemoryConfig, MemoryTransformer, kind_names
from memory.attention import Attend, PositionWindow, attend, log_mask
from memory.kind import ramp_log_mask, ramp_mask
from memory.linear import Linear
from memory.store import EMPTY, MIN_SPARE_SLOTS, Slots, SlotStore, compacted, padded_length

TOLERANCE = 1e-5  # step mode vs block mode, float32, max abs difference
# every kind with eq. 4's renormalisation, and the soft masks without it
KINDS = kind_names()


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def make_core(kind: str, **overrides) -> MemoryTransformer:
    """A small core whose memories expire, compress and trim within a few dozen steps."""
    fields = dict(
        kind=kind,
        num_layers=2,
        dim=16,
        num_heads=2,
        ffn_dim=32,
        max_span=12,
        block_len=5,
        ramp=3,
        compress_rate=3,
        compressed_span=3,
        init_span_fraction=0.3,
    )
    fields.update(overrides)
    torch.manual_seed(0)
    core = MemoryTransformer(MemoryConfig(**fields)).eval()
    with torch.no_grad():
        for layer in core.layers:
            if kind == "expire_span":  # a different span for every memory, not only the initial one
                layer.kind.predictor.linear.weight.normal_(0, 1.5)
            if kind == "adaptive_span":  # a different span for every head
                layer.kind.span_fraction.copy_(torch.linspace(0.15, 0.6, fields["num_heads"]))
    return core


def episode_starts(batch: int, length: int) -> torch.Tensor:
    """Random episode boundaries, including some in the middle of blocks."""
    starts = torch.rand(batch, length, generator=torch.Generator().manual_seed(1)) < 0.08
    starts[0, 10] = starts[1, 23] = starts[2, 3] = True
    return starts


def run_blocks(core, x, starts, block: int, state=None):
    state, outputs = state or core.initial_state(x.shape[0]), []
    for k in range(0, x.shape[1], block):
        out = core(x[:, k : k + block], state, starts[:, k : k + block])
        state = out.state
        outputs.append(out.hidden)
    return torch.cat(outputs, 1), state


def run_steps(core, x, starts, state=None):
    state = state or core.initial_state(x.shape[0])
    outputs = []
    for t in range(x.shape[1]):
        out = core.step(x[:, t], state, starts[:, t])
        state = out.state
        outputs.append(out.hidden)
    return torch.stack(outputs, 1), state


@pytest.mark.parametrize("kind", KINDS)
def test_step_mode_equals_block_mode(kind):
    core = make_core(kind)
    x = torch.randn(3, 40, 16)
    starts = episode_starts(3, 40)
    with torch.no_grad():
        stepped, _ = run_steps(core, x, starts)
    for block in (8, 5, 40):  # several blocks with the memory carried, and one long block
        blocked, _ = run_blocks(core, x, starts, block)
        assert (blocked - stepped).abs().max() < TOLERANCE, block


@pytest.mark.parametrize("kind", KINDS)
def test_gradients_do_not_change_outputs(kind):
    """With gradients, memory keys/values/spans are recomputed from the stored memories and
    step mode runs as a block of one; the outputs must not change."""
    core = make_core(kind)
    x = torch.randn(3, 24, 16)
    starts = episode_starts(3, 24)
    with torch.no_grad():
        expected, _ = run_steps(core, x, starts)
        blocked_without_grad, _ = run_blocks(core, x, starts, 8)
    blocked, _ = run_blocks(core, x, starts, 8)
    stepped, _ = run_steps(core, x[:, :10], starts[:, :10])
    assert (blocked_without_grad - expected).abs().max() < TOLERANCE
    assert (blocked - expected).abs().max() < TOLERANCE
    assert (stepped - expected[:, :10]).abs().max() < TOLERANCE


@pytest.mark.slow  # (finite differences of every input and weight)
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("memory", ["empty", "carried"])
def test_the_hand_written_backward_is_autograds(kind, memory):
    """`memory.attention.Attend`'s backward, checked by finite differences in float64
    (gradcheck) through a layer: episodes starting inside the block, an empty memory or one
    carried from earlier blocks with memories deleted, spans on their ramp; the inputs are the
    block and the weights of the layer's attention and memory kind."""
    core = make_core(kind, num_layers=1).double().train()
    x = torch.randn(3, 24, 16, dtype=torch.float64)
    starts = episode_starts(3, 24)  # one inside the block: [1, 23]
    state = core.initial_state(3)
    if memory == "carried":
        with torch.no_grad():
            _, state = run_blocks(core, x[:, :18], starts[:, :18], 6, state)
        assert max(state.stored_lengths()) < 18  # memories were deleted
    named = dict(core.named_parameters())
    names = [name for name in named if ".kind." in name or "qkv" in name or "position" in name]

    def call(block, *weights):
        out = torch.func.functional_call(
            core, dict(zip(names, weights, strict=True)), (block, state, starts[:, 18:])
        )
        return out.hidden, out.aux_loss

    inputs = [x[:, 18:].clone().requires_grad_()]
    inputs += [named[name].detach().clone().requires_grad_() for name in names]
    assert torch.autograd.gradcheck(call, inputs)


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_without_next_state_learns_alike_and_deletes_nothing(kind, monkeypatch):
    """A learner's minibatch discards the memory after its call: without ``next_state`` the
    call compacts no store, and its outputs, loss and gradients are those of the full call."""
    core = make_core(kind).train()
    x = torch.randn(3, 24, 16)
    starts = episode_starts(3, 24)
    with torch.no_grad():
        _, state = run_blocks(core, x[:, :16], starts[:, :16], 8)  # memories to delete from
    compactions = []
    monkeypatch.setattr(
        "memory.store.compacted", lambda *args: compactions.append(1) or compacted(*args)
    )
    results = []
    for next_state in (True, False):
        core.zero_grad()
        compactions.clear()
        out = core(x[:, 16:], state, starts[:, 16:], next_state=next_state)
        (out.hidden.square().sum() + out.aux_loss).backward()
        gradients = [p.grad.clone() for p in core.parameters() if p.grad is not None]
        results.append((out, gradients, len(compactions)))
    (full, full_grads, full_compactions), (learning, grads, compactions) = results
    assert learning.state is None and full.state is not None
    assert full_compactions > 0 and compactions == 0
    assert torch.equal(learning.hidden, full.hidden) and torch.equal(
        learning.aux_loss, full.aux_loss
    )
    assert len(grads) == len(full_grads) and all(map(torch.equal, grads, full_grads))


@pytest.mark.parametrize("kind", KINDS)
def test_a_minibatch_of_fixed_shapes_learns_as_the_compacted_one(kind):
    """``select(index, fixed_shapes=True)`` (a compiled learner's minibatch) pads every store
    in front to `padded_length` instead of compacting it, reads nothing back from the tensors
    to do so, and gives the outputs, aux loss and gradients of the compacted minibatch to
    float rounding."""
    core = make_core(kind).train()
    x = torch.randn(4, 24, 16)
    starts = episode_starts(4, 24)
    with torch.no_grad():
        _, state = run_blocks(core, x[:, :16], starts[:, :16], 8)
    index = torch.tensor([3, 1])
    results = []
    for fixed_shapes in (False, True):
        with HostReads() as host:
            minibatch = state.select(index, fixed_shapes)
        core.zero_grad()
        out = core(x[index, 16:], minibatch, starts[index, 16:], next_state=False)
        (out.hidden.square().sum() + out.aux_loss).backward()
        gradients = [p.grad.clone() for p in core.parameters() if p.grad is not None]
        results.append((out, gradients, minibatch, host.reads))
    (compact, compact_grads, compacted_state, _), (fixed, grads, fixed_state, reads) = results
    assert reads == [] and isinstance(fixed_state.time, torch.Tensor)
    for name, store in state.layers[0].parts.items():  # each part padded alike in all layers
        if not isinstance(store, SlotStore):
            continue
        longest = max(layer[name].length for layer in state.layers)
        shortened = [layer[name].length for layer in compacted_state.layers]
        padded = [layer[name].length for layer in fixed_state.layers]
        assert padded == [padded_length(longest)] * len(padded)
        assert all(map(operator.ge, padded, shortened)) and padded != shortened
    torch.testing.assert_close(fixed.hidden, compact.hidden, rtol=0, atol=TOLERANCE)
    torch.testing.assert_close(fixed.aux_loss, compact.aux_loss, rtol=1e-5, atol=1e-9)
    assert len(grads) == len(compact_grads)
    for grad, expected in zip(grads, compact_grads, strict=True):
        torch.testing.assert_close(grad, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_blocks_of_fixed_shapes_carry_the_memory_of_compacted_blocks(kind):
    """A language model's compiled step: from a state of fixed shapes the core keeps every
    slot and empties the dead ones, and `MemoryState.compacted` deletes them with one read of
    the device for all stores. Block after block, outputs, aux loss and gradients are those of
    the blocks that compact as they go, to float rounding, and the memory carried is theirs,
    padded in front to `padded_length`; saved in a checkpoint and loaded, it goes on alike."""
    core = make_core(kind).train()
    x = torch.randn(4, 45, 16)
    starts = episode_starts(4, 45)
    compact, fixed = core.initial_state(4), core.initial_state(4)
    for k in range(0, 40, 5):
        with HostReads() as host:
            fixed = fixed.compacted()
        assert host.reads == ["tolist"] and fixed.fixed_shapes
        check_padded(fixed, compact)
        results = []
        for state in (compact, fixed):
            core.zero_grad()
            with HostReads() as host:
                out = core(x[:, k : k + 5], state, starts[:, k : k + 5])
            (out.hidden.square().sum() + out.aux_loss).backward()
            grads = [p.grad.clone() for p in core.parameters() if p.grad is not None]
            results.append((out, grads, host.reads))
        (expected, expected_grads, _), (out, grads, reads) = results
        assert reads == []
        torch.testing.assert_close(out.hidden, expected.hidden, rtol=0, atol=TOLERANCE)
        torch.testing.assert_close(out.aux_loss, expected.aux_loss, rtol=1e-5, atol=1e-9)
        torch.testing.assert_close(out.memory_size, expected.memory_size)
        for grad, reference in zip(grads, expected_grads, strict=True):
            torch.testing.assert_close(grad, reference, rtol=1e-4, atol=1e-5)
        kept = [store.length for layer in out.state.layers for store in layer.stores()]
        assert kept == [store.length + 5 for layer in fixed.layers for store in layer.stores()]
        compact, fixed = expected.state, out.state
    assert int(fixed.time) == compact.time == 40
    loaded = core.load_state(torch.load(_saved(core.save_state(fixed)), weights_only=True))
    with torch.no_grad():
        expected = core(x[:, 40:], fixed.compacted(), starts[:, 40:]).hidden
        resumed = core(x[:, 40:], loaded.compacted(), starts[:, 40:]).hidden
    torch.testing.assert_close(resumed, expected, rtol=0, atol=TOLERANCE)


def check_padded(fixed, compact) -> None:
    """``fixed`` holds the memories of ``compact``, each store padded in front with empty
    slots to the `padded_length` of its part's longest store over the layers."""
    for name in compact.layers[0].parts:
        if not isinstance(compact.layers[0][name], SlotStore):
            continue
        length = padded_length(max(layer[name].length for layer in compact.layers))
        for padded, memory in zip(fixed.layers, compact.layers, strict=True):
            padded, slots = padded[name].view(), memory[name].view()
            assert padded.length == length
            front = length - slots.length
            assert (padded.position[:, :front] == EMPTY).all()
            assert torch.equal(padded.position[:, front:], slots.position)
            filled = slots.position != EMPTY
            torch.testing.assert_close(padded.hidden[:, front:][filled], slots.hidden[filled])


def test_padded_lengths_are_few_and_at_most_half_empty():
    lengths = [padded_length(n) for n in range(1, 20_000)]
    assert [padded_length(n) for n in (0, 8, 9, 16, 100, 129, 256)] == [8, 8, 16, 16, 128, 256, 256]
    assert all(
        n <= length and (n <= 8 or length - n < length / 2) for n, length in enumerate(lengths, 1)
    )
    assert len(set(lengths)) == 13  # 8, 16, ..., 32768


@pytest.mark.parametrize("kind", KINDS)
def test_episode_start_cuts_attention(kind):
    """After a boundary, an element's outputs are those of a fresh state: in block mode
    (boundary inside the second block) and in step mode."""
    core = make_core(kind)
    x = torch.randn(2, 40, 16)
    starts = torch.zeros(2, 40, dtype=torch.bool)
    starts[0, 13] = True
    fresh = torch.zeros(2, 27, dtype=torch.bool)
    with torch.no_grad():
        blocked, _ = run_blocks(core, x, starts, 10)
        stepped, _ = run_steps(core, x, starts.numpy())  # as vectorised environments give them
        alone, _ = run_blocks(core, x[:, 13:], fresh, 40)
    assert (blocked[0, 13:] - alone[0]).abs().max() < TOLERANCE
    assert (stepped[0, 13:] - alone[0]).abs().max() < TOLERANCE
    assert (blocked[1, 13:] - alone[1]).abs().max() > 1e-3  # element 1 still remembers


class HostReads(TorchFunctionMode):
    """Records every tensor value that Python reads (on a GPU, each a wait for it)."""

    READS = ("__bool__", "__float__", "__int__", "__index__", "item", "tolist")

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in self.READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", KINDS)
def test_acting_steps_read_nothing_back_until_a_buffer_fills(kind):
    """Step mode without gradients writes into spare slots and counts the memories seen on
    the device: steps that compact nothing read no tensor value, so on a GPU an unroll's
    steps queue without waiting for it (MIN_SPARE_SLOTS steps after each compaction)."""
    core = make_core(kind)
    x = torch.randn(3, MIN_SPARE_SLOTS + 1, 16)
    starts = episode_starts(3, MIN_SPARE_SLOTS + 1)
    with torch.no_grad():
        state = core.step(x[:, 0], core.initial_state(3), starts[:, 0]).state  # room made
        with HostReads() as reading:
            outputs = []
            for t in range(1, MIN_SPARE_SLOTS):
                out = core.step(x[:, t], state, starts[:, t])
                state = out.state
                outputs.append(out.memory_size)
        assert reading.reads == []
        assert all(size.shape == () and float(size) >= 0 for size in outputs)
        with HostReads() as reading:  # the buffers are full: their survivors are compacted
            core.step(x[:, -1], core.step(x[:, -2], state, starts[:, -2]).state, starts[:, -1])
        assert "__int__" in reading.reads


def test_kept_states_stay_valid_while_stepping_on():
    """Step mode appends in place; a state kept aside (a learner's start of unroll) and
    states branching from it must not see each other's writes."""
    core = make_core("transformer_xl")
    x = torch.randn(2, 30, 16)
    none = torch.zeros(2, 30, dtype=torch.bool)
    with torch.no_grad():
        _, kept = run_steps(core, x[:, :20], none)
        expected = core(x[:, 20:], kept).hidden
        run_steps(core, x[:, 20:], none, kept)  # act on from the kept state
        branch = core.step(x[:, 0], kept).state  # and branch off it
        run_steps(core, x[:, 21:], none, branch)
        assert (core(x[:, 20:], kept).hidden - expected).abs().max() == 0
        stepped, _ = run_steps(core, x[:, 20:], none, kept)
    assert (stepped - expected).abs().max() < TOLERANCE


def test_states_made_in_inference_mode_can_be_continued_and_trained_on():
    core = make_core("expire_span")
    x = torch.randn(2, 12, 16)
    none = torch.zeros(2, 12, dtype=torch.bool)
    with torch.no_grad():
        expected, _ = run_steps(core, x, none)
    with torch.inference_mode():  # how agents often act
        acted, state = run_steps(core, x[:, :6], none)
    with torch.no_grad():
        stepped, _ = run_steps(core, x[:, 6:], none, state)
    blocked = core(x[:, 6:], state).hidden  # the learner's recomputation, with gradients
    blocked.sum().backward()
    for outputs, start in ((acted, 0), (stepped, 6), (blocked, 6)):
        assert (outputs - expected[:, start : start + outputs.shape[1]]).abs().max() < TOLERANCE


@pytest.mark.parametrize("kind", KINDS)
def test_selected_and_saved_states_continue_as_the_full_batch(kind):
    """A minibatch of environments taken from the state continues as the state would; the
    state saved and loaded (a checkpoint's: its live memories' h_i, without the keys, values
    and spans) continues exactly as the state refreshed, whose caches the same weights
    recomputed."""
    core = make_core(kind)
    x = torch.randn(3, 30, 16)
    starts = episode_starts(3, 30)
    with torch.no_grad():
        _, state = run_steps(core, x[:, :20], starts[:, :20])
        full = core(x[:, 20:], state, starts[:, 20:]).hidden
        index = torch.tensor([2, 0])
        part = core(x[index, 20:], state.select(index), starts[index, 20:]).hidden
        refreshed = core(x[:, 20:], core.refresh(state), starts[:, 20:]).hidden
        saved = torch.load(_saved(core.save_state(state)), weights_only=True)
        loaded = core(x[:, 20:], core.load_state(saved), starts[:, 20:]).hidden
    assert (part - full[index]).abs().max() < TOLERANCE
    assert torch.equal(loaded, refreshed)
    assert (refreshed - full).abs().max() < TOLERANCE


@pytest.mark.parametrize("kind", KINDS)
def test_minibatches_are_selected_alike_with_one_read_of_the_device(kind):
    """A learner's minibatches of an epoch (`MemoryState.minibatches`): each one's memory is
    `select`'s, its stores cut to the slots its elements fill, and all their lengths are
    read from the device at once; from stepped buffers (dead slots kept, empty and spare ones
    around them) and from compacted blocks."""
    core = make_core(kind)
    x = torch.randn(4, 30, 16)
    starts = episode_starts(4, 30)
    indices = [torch.tensor([2, 0]), torch.tensor([3]), torch.tensor([1])]
    with torch.no_grad():
        for _, state in (run_steps(core, x, starts), run_blocks(core, x, starts, 6)):
            with HostReads() as host:
                minibatches = state.minibatches(indices)
            assert host.reads == ["tolist"]
            for index, minibatch in zip(indices, minibatches, strict=True):
                expected = state.select(index)
                assert minibatch.time == expected.time
                assert torch.equal(minibatch.episode_begin, expected.episode_begin)
                for layer, other in zip(minibatch.layers, expected.layers, strict=True):
                    for store, kept in zip(layer.stores(), other.stores(), strict=True):
                        assert store.length == kept.length
                        for field, expected_field in zip(store.view(), kept.view(), strict=True):
                            assert (field is None) == (expected_field is None)
                            assert field is None or torch.equal(field, expected_field)


@pytest.mark.parametrize("kind", ["transformer_xl", "expire_span"])
def test_a_saved_memory_holds_the_hidden_states_it_needs_only(kind):
    """A checkpoint keeps every slot's position and the h_i a memory needs: not the keys and
    values cached from them (two thirds of a store's bytes), nor, where no span is computed
    from them, the h_i of the dead memories that step mode leaves in its buffers. A memory
    saved whole, as checkpoints were before, loads as the same memory."""
    core = make_core(kind)
    with torch.no_grad():
        _, state = run_steps(core, torch.randn(3, 30, 16), episode_starts(3, 30))
    saved, refreshed = core.save_state(state), core.refresh(state)
    for layer, memory, module in zip(saved["layers"], refreshed.layers, core.layers, strict=True):
        slots = memory["recent"].view()
        alive = module.kind.alive(slots, state.time, state.episode_begin)
        filled = slots.position != EMPTY
        assert (~alive & filled).any()  # dead memories kept in place in the buffers
        assert set(layer["recent"]) == {"hidden", "kept", "position", "with_span"}
        assert torch.equal(layer["recent"]["position"], slots.position)
        assert layer["recent"]["with_span"] == (kind == "expire_span")
        kept = filled if kind == "expire_span" else alive
        assert torch.equal(layer["recent"]["kept"], kept)
        assert torch.equal(layer["recent"]["hidden"], slots.hidden[kept])
    with_caches = {
        **state.state_dict(),
        "layers": [{"recent": list(memory["recent"].view())} for memory in state.layers],
    }
    old = core.load_state(with_caches)
    for old_layer, new_layer in zip(old.layers, refreshed.layers, strict=True):
        for a, b in zip(old_layer["recent"].view(), new_layer["recent"].view(), strict=True):
            assert (a is None and b is None) or torch.equal(a, b)


def _saved(value) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    buffer.seek(0)
    return buffer


def test_a_kind_is_found_by_its_name_and_keeps_options_and_a_state_of_its_own(monkeypatch):
    """What docs/memory-kinds.md promises: a MemoryKind subclass with a ``name`` is a kind
    (a module of this package is imported by the registry; here the class is defined in
    place), it checks and reads options of its own, its memory may hold parts of its own,
    and step mode equals block mode for it."""
    import memory.kind
    from memory import LayerMemory, MemoryKind, kind_classes

    monkeypatch.setattr(memory.kind, "KIND_CLASSES", dict(memory.kind.KIND_CLASSES))

    class LastFew(MemoryKind):
        name = "last_few"

        @classmethod
        def check_options(cls, options) -> None:
            if set(options) != {"reach"} or options["reach"] < 1:
                raise ValueError(f"last_few needs memory.options.reach >= 1, got {options}")

        def initial_memory(self, batch, device, dtype) -> LayerMemory:
            calls = torch.zeros(batch, dtype=torch.long, device=device)
            return super().initial_memory(batch, device, dtype).replace(calls=calls)

        def mask(self, relative, span, offsets):
            reach = self.cfg.options["reach"]
            if offsets is None:
                return (relative >= -reach)[:, None, :]
            return relative[:, None, :] >= (offsets - reach)[:, None]

        def read(self, attention, memory, new, call):
            read = super().read(attention, memory, new, call)
            return read._replace(memory=read.memory.replace(calls=memory["calls"] + 1))

    assert kind_classes()["last_few"] is LastFew
    with pytest.raises(ValueError, match="last_few"):
        MemoryConfig(kind="last_three")
    with pytest.raises(ValueError, match="reach >= 1"):
        MemoryConfig(kind="last_few", options={"reach": 0})
    with pytest.raises(ValueError, match="takes no memory.options"):
        MemoryConfig(kind="transformer_xl", options={"reach": 2})
    core = make_core("last_few", options={"reach": 2})
    x, starts = torch.randn(3, 20, 16), torch.zeros(3, 20, dtype=torch.bool)
    with torch.no_grad():
        stepped, state = run_steps(core, x, starts)
        blocked, blocked_state = run_blocks(core, x, starts, 5)
        out = core(x[:, :4], core.initial_state(3), starts[:, :4])
    assert (stepped - blocked).abs().max() < TOLERANCE
    assert state.layers[0]["calls"].tolist() == [20] * 3
    assert blocked_state.select(torch.tensor([1])).layers[1]["calls"].tolist() == [4]
    assert blocked_state.stored_lengths() == [2, 2]  # what the next query t sees: t - 2, t - 1
    assert out.memory_size == (0 + 1 + 2 + 2) / 4  # a query seeing itself is no memory


@pytest.mark.parametrize("kind", KINDS)
def test_every_call_reports_aux_loss_and_memory_size(kind):
    core = make_core(kind).train()
    state = core.initial_state(2)
    out = core(torch.randn(2, 6, 16), state)
    assert out.aux_loss.shape == ()
    assert out.aux_loss.requires_grad == (kind in ("expire_span", "adaptive_span"))
    assert out.memory_size.shape == () and out.memory_size.dtype == torch.float64
    if kind in ("transformer_xl", "compressive"):  # query t sees its t predecessors
        assert out.memory_size == 2.5
    else:  # some spans are shorter than 5
        assert 0 < out.memory_size < 2.5
    with torch.no_grad():
        out = core.step(torch.randn(2, 16), out.state)
    assert out.aux_loss.shape == () and out.memory_size > 0
    assert not any(t.requires_grad for t in out.state.layers[0]["recent"].view() if t is not None)


def test_transformer_xl_keeps_exactly_the_last_span():
    core = make_core("transformer_xl")
    starts = torch.zeros(2, 30, dtype=torch.bool)
    starts[0, 25] = True
    with torch.no_grad():
        out = core(torch.randn(2, 30, 16), core.initial_state(2), starts)
        full = core(torch.randn(2, 12, 16), out.state)
    positions = out.state.layers[0]["recent"].view().position
    assert positions[1].tolist() == list(range(18, 30))  # the last L = 12
    assert positions[0][positions[0] >= 0].tolist() == list(range(25, 30))  # its episode only
    # |C_t| = L once the memory is full; element 0 sees t - 25 memories until then
    element_0 = sum(min(t - 25, 12) for t in range(30, 42))
    assert full.memory_size == pytest.approx((element_0 + 12 * 12) / 24)


@pytest.mark.parametrize("spare", [0, 3])
def test_compaction_keeps_each_elements_survivors_in_order_right_aligned(spare):
    """Deleting memories (4.2): each element keeps its surviving slots in their order, at the
    end of a buffer as long as the most any element kept, empty slots (position EMPTY) in
    front; ``spare`` empty slots (zeros, position EMPTY) follow in the same buffer. Rows: some
    dead, all dead, all alive, alternating; the buffer is a view of a larger one."""
    torch.manual_seed(0)
    batch, n, dim, heads = 4, 7, 4, 2
    whole = Slots(
        torch.randn(batch, n + 2, dim),
        torch.randn(batch, heads, dim // heads, n + 2),
        torch.randn(batch, heads, n + 2, dim // heads),
        torch.arange(n + 2).repeat(batch, 1),
        torch.rand(batch, n + 2),
    )
    slots = whole.narrow(0, n)
    alive = torch.tensor(
        [[0, 1, 1, 0, 1, 0, 0], [0] * 7, [1] * 7, [1, 0, 1, 0, 1, 0, 1]], dtype=torch.bool
    )
    kept, length = compacted(slots, alive, lambda most: spare)
    assert length == 7 and kept.length == 7 + spare
    for b in range(batch):
        survivors = alive[b].nonzero().flatten()
        front = length - len(survivors)
        where = torch.arange(front, length)
        assert (kept.position[b, :front] == EMPTY).all()
        assert torch.equal(kept.position[b, where], slots.position[b, survivors])
        assert torch.equal(kept.hidden[b, where], slots.hidden[b, survivors])
        assert torch.equal(kept.keys[b, ..., where], slots.keys[b, ..., survivors])
        assert torch.equal(kept.values[b, :, where], slots.values[b, :, survivors])
        assert torch.equal(kept.span[b, where], slots.span[b, survivors])
    tail = kept.narrow(length, spare)
    assert (tail.position == EMPTY).all() and not any(
        t.any() for t in tail if t is not tail.position
    )
    suffix = torch.zeros(batch, n, dtype=torch.bool)
    suffix[:, 4:] = True
    assert slots.survivors(suffix).hidden.data_ptr() == slots.hidden[:, 4].data_ptr()  # a slice


def test_stored_memory_follows_the_spans_not_the_maximum_span():
    """Expire-Span with short spans keeps a small memory over thousands of steps while
    Transformer-XL's grows to L and stays there; in block mode (exact deletion) and in step
    mode (deletion at compaction, within the spare capacity)."""
    fields = dict(max_span=200, ramp=16, block_len=20, init_span_fraction=0.0125)  # e_i = 2.5
    expire = make_core("expire_span", **fields)
    for layer in expire.layers:
        torch.nn.init.zeros_(layer.kind.predictor.linear.weight)
    fixed = make_core("transformer_xl", **fields)
    with torch.no_grad():
        expire_state, fixed_state = expire.initial_state(2), fixed.initial_state(2)
        for k in range(100):  # 2000 steps in blocks of 20
            x = torch.randn(2, 20, 16)
            expire_out = expire(x, expire_state)
            expire_state, fixed_state = expire_out.state, fixed(x, fixed_state).state
            assert expire_state.stored_lengths() == [18, 18]  # m > 0 for t - i < e + R = 18.5
            assert fixed_state.stored_lengths() == [min(200, 20 * (k + 1))] * 2
        assert expire_out.memory_size == 18.0
        for _ in range(500):
            x = torch.randn(2, 16)
            expire_state = expire.step(x, expire_state).state
            fixed_state = fixed.step(x, fixed_state).state
            assert max(expire_state.stored_lengths()) <= 18 + 32
            assert 200 <= min(fixed_state.stored_lengths()) <= 300 + 1


@pytest.mark.parametrize(("queries", "width"), [(4, 8), (4, 5), (3, 3), (6, 10), (1, 5)])
def test_position_term_covers_only_distances_below_block_len(queries, width):
    """q_t . p_{t-i} for t - i < block_len, nothing for older keys (A.1); the skewed,
    gathered (holes in the window) and step-mode computations all agree with it."""
    attention = make_core("transformer_xl").layers[0].attention  # block_len 5, 2 heads
    q = torch.randn(3, 2, queries, 8)
    distance = torch.arange(width - queries, -queries, -1).expand(3, -1)  # first query - i
    expected = torch.zeros(3, 2, queries, width)
    for t in range(queries):
        for column in range(width):
            d = t + int(distance[0, column])
            if 0 <= d < 5:
                expected[:, :, t, column] = (q[:, :, t] * attention.position[:, d]).sum(-1)
    gathered = attention.position_term(q, width, distance)
    assert torch.allclose(gathered, expected, atol=1e-6)
    if queries > 1:  # the same values: a GPU looks them up where a CPU takes the slice
        assert torch.equal(attention.position_term(q, width, None), gathered)


@pytest.mark.parametrize("window", ["consecutive", "by_distance"])
@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_attend_differentiates_as_autograd_through_its_operations(window, dropout):
    """`Attend`'s backward gives the gradients autograd takes through `attend`'s operations,
    in float64 to rounding, for a mask per key or per head, either position lookup and
    attention dropout (the same noise drawn for both)."""
    generator = torch.Generator().manual_seed(3)
    batch, heads, queries, keys, head_dim, reach = 2, 3, 5, 9, 4, 4
    shapes = [
        (batch, heads, queries, head_dim),
        (batch, heads, head_dim, keys),
        (batch, heads, keys, head_dim),
        (heads, reach, head_dim),
    ]
    q, k, v, position = (torch.randn(*shape, generator=generator).double() for shape in shapes)
    for mask_heads in (1, heads):
        m = torch.rand(batch, mask_heads, queries, keys, generator=generator).double()
        m[m < 0.2] = 0
        inputs = [t.clone().requires_grad_() for t in (q, k, v, log_mask(m, m.dtype), position)]
        width = 7
        distance = None if window == "consecutive" else torch.randint(-3, 6, (batch, width))
        lookup = PositionWindow(width, distance, queries, reach)
        gradients = []
        for function in (Attend.apply, lambda *args: attend(*args)[:2]):
            with torch.random.fork_rng():
                torch.manual_seed(0)
                out, _ = function(*inputs, lookup, dropout)
            grad = torch.autograd.grad(out.sin().sum(), inputs)
            gradients.append(grad)
        for ours, autograds in zip(*gradients, strict=True):
            torch.testing.assert_close(ours, autograds, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("heads", [None, 3])
def test_ramp_log_mask_differentiates_as_its_operations(heads):
    """`memory.kind.ramp_log_mask`, one node, gives the log of `ramp_mask` times visibility
    and the gradient autograd takes through the clamp, the product and `log_mask` (spans
    clamped at 0 and 1, exactly 1 included, and on the ramp), per memory and per head."""
    generator = torch.Generator().manual_seed(4)
    shape = (2, 7) if heads is None else (2, heads, 7)
    start = (3 * torch.rand(*shape, generator=generator) - 1).double()
    start.view(-1)[:3] = torch.tensor([1.0, 0.0, 0.5])  # (no offset for the first query)
    offsets = torch.arange(4.0, dtype=torch.float64)
    visible = torch.rand(2, 4, 7, generator=generator) < 0.8
    inputs = [start.clone().requires_grad_() for _ in range(2)]
    ours, m = ramp_log_mask(inputs[0], offsets, 2.0, visible)
    expected_m = ramp_mask(inputs[1], offsets, 2.0) * (
        visible if heads is None else visible[:, None]
    )
    expected = log_mask(expected_m, torch.float64)
    assert torch.equal(m, expected_m.detach()) and torch.equal(ours, expected)
    weights = torch.randn(ours.shape, generator=generator).double()
    (gradient,) = torch.autograd.grad(
        ours.exp().mul(weights).sum() + ours.clamp_min(-5).sum(), inputs[0]
    )
    (autograds,) = torch.autograd.grad(
        expected.exp().mul(weights).sum() + expected.clamp_min(-5).sum(), inputs[1]
    )
    torch.testing.assert_close(gradient, autograds, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("shape", [(7, 5), (3, 4, 5)])
def test_linear_differentiates_as_nn_linear(shape):
    """`memory.linear.Linear`'s three-operation backward gives nn.Linear's gradients."""
    torch.manual_seed(0)
    layer = Linear(5, 6).double()
    x = torch.randn(*shape, dtype=torch.float64, requires_grad=True)
    inputs = (x, layer.weight, layer.bias)
    ours = torch.autograd.grad(layer(x).sin().sum(), inputs)
    autograds = torch.autograd.grad(F.linear(x, layer.weight, layer.bias).sin().sum(), inputs)
    for gradient, expected in zip(ours, autograds, strict=True):
        torch.testing.assert_close(gradient, expected, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(layer, (x,))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(kind="lstm"), "transformer_xl"),
        (dict(max_span=0), "max_span"),
        (dict(dim=30, num_heads=4), "divisible"),
        (dict(ramp=0.5), "ramp"),
        (dict(dropout=1.0), "dropout"),
        (dict(init_span_fraction=0.0), "init_span_fraction"),
        (dict(kind="compressive", compress_rate=300), "compress_rate"),
        (dict(compressed_span=0), "compressed_span"),
        (dict(num_layers=2.5), "num_layers"),
    ],
)
def test_config_errors_say_what_is_wrong(fields, message):
    with pytest.raises(ValueError, match=message):
        MemoryConfig(**fields)


def test_input_errors_say_what_is_wrong():
    core = make_core("expire_span")
    state = core.initial_state(2)
    with pytest.raises(ValueError, match="initial_state"):
        core(torch.randn(3, 4, 16), state)
    with pytest.raises(ValueError, match=r"\(B, K, 16\)"):
        core(torch.randn(2, 16), state)
    with pytest.raises(ValueError, match="episode_start"):
        core(torch.randn(2, 4, 16), state, torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="episode_start"):
        core.step(torch.randn(2, 16), state, torch.zeros(2, 1, dtype=torch.bool))


@pytest.mark.parametrize("kind", KINDS)
def test_hydra_config_files_hold_the_corridor_values(kind):
    """memory=KIND composes the file over its schema, memory.MemoryConfig: the paper's
    Corridor agent (A.3.1)."""
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    configs = Path(__file__).parents[1] / "configs"
    with initialize_config_dir(config_dir=str(configs), version_base=None):
        composed = compose("rl", overrides=[f"memory={kind}", "preset=paper"]).memory
    cfg = MemoryConfig(**OmegaConf.to_container(composed))
    assert cfg.kind == kind
    assert (cfg.num_layers, cfg.dim, cfg.max_span, cfg.ramp) == (2, 64, 200, 16)
    assert cfg.aux_loss_coef == 5e-6


def test_compress_rate_only_constrains_the_compressive_memory():
    """compress_rate = 4 > max_span = 2: no group could ever leave the compressive FIFO."""
    with pytest.raises(ValueError, match="compress_rate"):
        MemoryConfig(kind="compressive", max_span=2, compress_rate=4)
    core = make_core("transformer_xl", max_span=2, compress_rate=4)
    with torch.no_grad():
        out = core(torch.randn(1, 6, 16), core.initial_state(1))
    assert out.memory_size == (0 + 1 + 2 + 2 + 2 + 2) / 6


def test_the_memory_package_needs_no_hydra():
    """memory/ is PyTorch (and NumPy) only: it imports, builds and runs with Hydra unimportable."""
    code = (
        "import sys; sys.modules['hydra'] = None; sys.modules['omegaconf'] = None\n"
        "import torch\n"
        "from memory import MemoryConfig, MemoryTransformer\n"
        "core = MemoryTransformer(MemoryConfig(dim=16, num_heads=2, ffn_dim=32, max_span=8))\n"
        "print(core(torch.zeros(2, 3, 16), core.initial_state(2)).hidden.shape)\n"
    )
    root = Path(__file__).resolve().parents[1]
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root)
    assert result.returncode == 0, result.stderr
    assert "torch.Size([2, 3, 16])" in result.stdout
