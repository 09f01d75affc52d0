"""Acting compiled (``compile_acting=true``): the agent's encoder and its memory transformer's
layers for one step, compiled once. On the CPU, exported (`torch.export`) and compiled by
AOTInductor into a library that a C++ runner calls, without torch.compile's per-call guards
and Python; on CUDA, where loading such a library crashed, compiled by torch.compile into
Triton kernels, fewer and larger than the eager step's hundreds of launches.

The step writes each layer's memory into its store's buffer and attends over the whole buffer,
whose spare slots hold an empty memory (position -1, masked), so its inputs change shape only
when a buffer is compacted: each layer's buffer length is a dynamic dimension of the export.
The weights are inputs of the compiled step, not constants compiled into it, so an update
(in place) is what the next step reads. The policy and value heads and sampling are compiled
too; the random numbers a sample is drawn from are drawn eagerly, before the call
(`agents.distributions.sampling_noise`), so acting samples from the same numbers as without it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._pytree import (
    tree_leaves,
    tree_map,
    tree_structure,
    tree_unflatten,
    treespec_loads,
)

from agents.distributions import Noise, sample
from memory import CoreOutput, MemoryState
from memory.kind import Call
from memory.store import SLOT_AXES, Slots
from memory.transformer import BufferStep, layers_in_buffers

if TYPE_CHECKING:
    from agents.actor_critic import ActorCritic, Previous


CHECKED_VECTOR_UNITS = ("avx512", "avx2")  # as torch's inductor names them
LOAD = "import sys, torch; torch._inductor.aoti_load_package(sys.argv[1])"  # (load_apart's)


class _EncodeAndStep(nn.Module):
    """What is compiled: the agent's encoder, the core's layers writing into and reading the
    whole of their buffers, then its heads; returns the action drawn from ``noise``, its
    log-probability, the value, the core's hidden state (B, dim), the count of keys seen and
    the new memories' spans."""

    def __init__(self, agent: ActorCritic) -> None:
        super().__init__()
        self.agent = agent

    def forward(
        self, obs, episode_start, previous, noise, buffers, slots, positions, query_begin, begin
    ):
        agent = self.agent
        x = agent.encode(obs, episode_start, previous)
        call = Call(
            start=positions,
            positions=positions,
            query_begin=query_begin,
            memory_begin=begin,
            in_place=True,
            recompute=False,
            next_state=True,
            fixed_shapes=False,
            dtype=x.dtype,
            offsets=None,
        )
        hidden, count, spans = layers_in_buffers(
            agent.core, x, [Slots(*b) for b in buffers], list(slots), call
        )
        action, log_prob = sample(agent.policy(hidden), noise)
        return action, log_prob, agent.value(hidden).squeeze(-1), hidden, count, spans


class _WeightsAsInputs(nn.Module):
    """``step`` with its parameters and buffers passed in (`torch.func.functional_call`), so
    that the export reads them as inputs rather than compiling their values in."""

    def __init__(self, step: nn.Module) -> None:
        super().__init__()
        self.step = step

    def forward(self, weights: dict[str, torch.Tensor], inputs: tuple) -> Any:
        return torch.func.functional_call(self.step, weights, inputs)


class CompiledStep:
    """The agent's step in step mode without gradients (`ActorCritic.act` with
    ``compile_acting``), compiled at its first call for that call's batch size and kinds of
    input and action (sampled or greedy), by the runner of its device (`RUNNERS`); another
    step (a few environments' final values, a greedy evaluation) runs eagerly.
    A copy of the agent (`copy.deepcopy`) starts uncompiled."""

    def __init__(self) -> None:
        self.runner: LibraryRunner | TorchCompileRunner | None = None
        self.signature: tuple | None = None  # (batch size, previous given, greedy) compiled for

    def __deepcopy__(self, memo: dict) -> CompiledStep:
        return CompiledStep()

    def handles(self, batch: int, previous: Previous | None, greedy: bool) -> bool:
        """Whether a step of ``batch`` environments runs compiled (the first one compiles)."""
        return self.signature in (None, (batch, previous is not None, greedy))

    def __call__(
        self,
        agent: ActorCritic,
        obs: Any,
        state: MemoryState,
        episode_start: torch.Tensor,
        previous: Previous | None,
        noise: Noise,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, CoreOutput]:
        """`ActorCritic.act`'s action, log-probability, value and core output for one step,
        the action drawn from ``noise``."""
        plan, inputs = self.plan(agent, obs, state, episode_start, previous, noise)
        if self.runner is None:
            device = episode_start.device
            refuse_unchecked_target(device)
            self.runner = RUNNERS[device.type](_EncodeAndStep(agent), inputs)
            self.signature = (episode_start.shape[0], previous is not None, noise is None)
        action, log_prob, value, hidden, count, spans = self.run(tree_leaves(inputs))
        return action, log_prob, value, agent.core.planned_output(plan, hidden, count, spans)

    def plan(
        self,
        agent: ActorCritic,
        obs: Any,
        state: MemoryState,
        episode_start: torch.Tensor,
        previous: Previous | None,
        noise: Noise,
    ) -> tuple[BufferStep, tuple]:
        """The core's plan of the step (`MemoryTransformer.plan_step`: its stores' room,
        compactions included) and the compiled step's inputs for it."""
        batch, dtype = episode_start.shape[0], agent.value.weight.dtype
        plan = agent.core.plan_step(state, batch, episode_start, dtype)
        slots = tuple(torch.tensor(slot, device=state.device) for slot in plan.slots)
        call = plan.call
        inputs = (
            obs,
            episode_start,
            previous,
            noise,
            tuple(tuple(buffer) for buffer in plan.buffers),  # (plain tuples: export's inputs)
            slots,
            call.positions,
            call.query_begin,
            call.memory_begin,
        )
        return plan, inputs

    def run(self, tensors: list[torch.Tensor | None]) -> tuple:
        """The compiled step's outputs for its inputs' leaves (`tree_leaves` of `plan`'s):
        action, log-probability, value, the core's hidden state, the count of keys seen and
        the new memories' spans."""
        return self.runner(tensors)


class LibraryRunner:
    """The step compiled ahead of time for the CPU: exported with its weights as inputs and
    each layer's buffer length dynamic, compiled by AOTInductor, loaded in a process of its own
    first (`load_apart`), then called through its C++ runner."""

    def __init__(self, step: _EncodeAndStep, inputs: tuple) -> None:
        weights = {**dict(step.named_parameters()), **dict(step.named_buffers())}
        buffers = tuple(
            tuple(
                None if part is None else {axis: torch.export.Dim(f"slots_{layer}", min=2)}
                for part, axis in zip(buffer, SLOT_AXES, strict=True)
            )
            for layer, buffer in enumerate(inputs[4])
        )
        static = [tree_map(lambda _: None, part) for part in inputs]
        dynamic = (*static[:4], buffers, *static[5:])
        try:
            with warnings.catch_warnings(), tempfile.TemporaryDirectory() as folder:
                warnings.simplefilter("ignore", (FutureWarning, DeprecationWarning))  # torch's
                exported = torch.export.export(
                    _WeightsAsInputs(step),
                    (weights, inputs),
                    dynamic_shapes=(dict.fromkeys(weights), dynamic),
                    strict=False,
                )
                add_biases_apart(exported.graph_module)
                path = torch._inductor.aoti_compile_and_package(
                    exported, package_path=str(Path(folder) / "step.pt2")
                )
                load_apart(path)
                self.loader = torch._inductor.aoti_load_package(path).loader
        except LoadFailed as error:
            raise RuntimeError(
                f"compile_acting: {error} on this machine; act without it "
                "(train_rl.py: compile_acting=false)"
            ) from None
        except Exception as error:  # the compiler's errors are many and long
            raise RuntimeError(
                "compile_acting could not compile the agent's step on this machine "
                f"({type(error).__name__}); act without it (train_rl.py: compile_acting=false)"
            ) from error
        self.weights = tree_leaves(weights)  # (in the order the library takes them)
        self.outputs = treespec_loads(self.loader.get_call_spec()[1])

    def __call__(self, tensors: list[torch.Tensor | None]) -> tuple:
        # (the runner's own call reads its input and output layouts from JSON every time)
        present = (tensor for tensor in tensors if tensor is not None)  # (an absent input)
        outputs = self.loader.boxed_run([*self.weights, *present])  # (it empties its list)
        return tree_unflatten(outputs, self.outputs)


class TorchCompileRunner:
    """The step compiled by torch.compile (Triton kernels on CUDA), which reads the agent's
    weights where they are; a buffer length that changes recompiles it once, dynamic after."""

    backend = "inductor"

    def __init__(self, step: _EncodeAndStep, inputs: tuple) -> None:
        self.inputs = tree_structure(inputs)
        self.step = torch.compile(step, backend=self.backend)

    def __call__(self, tensors: list[torch.Tensor | None]) -> tuple:
        return self.step(*tree_unflatten(tensors, self.inputs))


RUNNERS = {"cpu": LibraryRunner, "cuda": TorchCompileRunner}  # by device type


class LoadFailed(Exception):
    """Loading the compiled step in a process of its own failed."""


def load_apart(path: str) -> None:
    """Loads the compiled step at ``path`` in a Python process of its own first: on one
    machine loading any AOTInductor package crashed the process that loaded it
    (docs/performance.md, "On a GPU"), which would end a run without saying why."""
    code = subprocess.run([sys.executable, "-c", LOAD, path], capture_output=True).returncode
    if code:
        ended = signal.Signals(-code).name if code < 0 else f"exit status {code}"
        raise LoadFailed(f"loading the compiled step in a process of its own ended in {ended}")


def add_biases_apart(module: torch.fx.GraphModule) -> None:
    """Rewrites each ``linear(x, weight, bias)`` of ``module`` as ``linear(x, weight) + bias``.
    On the CPU the compiler calls a product with a bias as ``addmm``, which first copies the
    bias into every row of the output (two more calls through torch's dispatcher); apart, the
    addition joins the kernel that reads the product next. preset=paper's step has 13 of them:
    acting 3-6 ms per update faster (docs/performance.md)."""
    graph = module.graph
    for node in list(graph.nodes):
        if node.target is not torch.ops.aten.linear.default or len(node.args) < 3:
            continue
        x, weight, bias = node.args
        if bias is None:
            continue
        with graph.inserting_after(node):
            added = graph.call_function(torch.ops.aten.add.Tensor, (node, bias))
        node.replace_all_uses_with(added)  # (the addition's own input too: set again below)
        added.args, node.args = (node, bias), (x, weight)
    module.recompile()


def refuse_unchecked_target(device: torch.device) -> None:
    """A one-line error unless the step compiles for CUDA (torch.compile) or for x86's AVX-512
    or AVX2 (AOTInductor), the targets where it is checked against the eager step
    (tests/test_agent.py). Elsewhere it is refused: torch 2.13's torch.compile gave NaN for
    AVX2 at one thread, and loading an AOTInductor package crashed the process on one machine
    (an H100's, for CUDA and for its CPU)."""
    if device.type == "cuda":
        return
    if device.type != "cpu":
        raise RuntimeError(
            f"compile_acting compiles acting for the CPU and CUDA only, not {device.type}; act "
            "without it (train_rl.py: compile_acting=false)"
        )
    from torch._inductor import cpu_vec_isa  # (only where the step compiles)

    isa = str(cpu_vec_isa.pick_vec_isa())
    if not isa.startswith(CHECKED_VECTOR_UNITS):
        raise RuntimeError(
            f"compile_acting: the step vectorized for {isa or 'no vector unit'} was not "
            "checked against the eager step (only AVX-512 and AVX2 were); act without it "
            "(train_rl.py: compile_acting=false)"
        )
