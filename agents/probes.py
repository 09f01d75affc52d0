"""Probes of what an agent's memory holds on to, reported by `train_rl.py mode=eval`.

- Success by corridor length: where in the length range the agent fails (the Corridor
  reports each episode's `corridor_length`).
- Success by case: per cue colour and side of the good door. An agent that has lost one of
  the four cases of the Corridor's door choice succeeds in 3/4 of its episodes.
- Spans of marked memories: the expire-span e_i each layer gives the memories written while
  a word is in view (the Corridor's `cue`: the memories the task needs), beside the spans of
  all other memories.
- Spans by age: per layer and age bin (age = t - i), how many memories a query sees and
  their mean span: what the memory keeps, and for how long. For any env and memory kind.
- Marked memories kept (`keep_new_memories`): the same agent with the marked memories' spans
  set to L. Success that comes back is success lost to spans; what stays lost is the policy's.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from memory import CoreOutput, MemoryState, MemoryTransformer


def success_by_length(
    lengths: list[float], successes: list[float], low: int, high: int, bins: int
) -> list[dict[str, float]]:
    """Success rate of the episodes in each of ``bins`` equal bins of [low, high] (one bin per
    length when there are fewer lengths than bins)."""
    lengths, successes = np.asarray(lengths), np.asarray(successes)
    bins = min(bins, high - low + 1)
    edges = np.linspace(low, high + 1, bins + 1).round().astype(int)
    rows = []
    for start, stop in zip(edges[:-1], edges[1:], strict=True):
        chosen = (lengths >= start) & (lengths < stop)
        success = float(successes[chosen].mean()) if chosen.any() else None
        rows.append(
            {"lengths": f"{start}-{stop - 1}", "episodes": int(chosen.sum()), "success": success}
        )
    return rows


def success_by_case(
    cue_colors: list[float],
    good_door_north: list[float],
    successes: list[float],
    truncated: list[float],
    colors: tuple,
) -> list[dict]:
    """Success rate per (cue colour, side of the good door) of the Corridor's episodes, and
    the share of them cut by the step limit: a lost case is a wrong door where that share is
    0, an agent that never takes a door where it is 1."""
    cues, north = np.asarray(cue_colors), np.asarray(good_door_north).astype(bool)
    rows = []
    for index, color in enumerate(colors):
        for side, is_north in (("north", True), ("south", False)):
            chosen = (cues == index) & (north == is_north)
            rows.append(
                {
                    "cue": color,
                    "good_door": side,
                    "episodes": int(chosen.sum()),
                    "success": _mean(successes, chosen),
                    "truncated": _mean(truncated, chosen),
                }
            )
    return rows


def _mean(values: list[float], chosen: np.ndarray) -> float | None:
    return float(np.asarray(values)[chosen].mean()) if chosen.any() else None


def keep_new_memories(state: MemoryState, chosen: torch.Tensor, span: float) -> None:
    """Sets the span of the memories the last step wrote (the last slot of every layer) to
    ``span`` for the environments ``chosen`` (B,) bool. Step mode without gradients only."""
    for memory in state.layers:
        new_spans = memory["recent"].view().span[:, -1]
        new_spans.masked_fill_(chosen.to(new_spans.device), span)


class SpanProbe:
    """Collects, step by step, the spans a `MemoryTransformer` gives its memories."""

    def __init__(self, core: MemoryTransformer, age_bin: int) -> None:
        self.core = core
        self.age_bin = age_bin
        num_layers, num_bins = len(core.layers), math.ceil(core.cfg.max_span / age_bin) + 1
        self.marked: list[list[float]] = [[] for _ in range(num_layers)]
        self.unmarked = np.zeros((num_layers, 2))  # sum of spans, count
        self.alive = np.zeros((num_layers, num_bins))  # memories seen, summed over queries
        self.span_sum = np.zeros((num_layers, num_bins))
        self.queries = 0

    @torch.no_grad()
    def observe(self, out: CoreOutput, marked: torch.Tensor | None) -> None:
        """Records one step-mode call: ``out`` is the core's output, ``marked`` (B,) says which
        environments had the probe word in view (their new memories are the marked ones)."""
        state = out.state
        query_time = state.time - 1
        batch = len(state.episode_begin)
        chosen = torch.zeros(batch, dtype=torch.bool) if marked is None else marked.cpu()
        for layer_index, layer in enumerate(self.core.layers):
            if out.spans is not None:
                new = out.spans[layer_index][:, 0].cpu()
                self.marked[layer_index].extend(new[chosen].tolist())
                self.unmarked[layer_index] += (float(new[~chosen].sum()), int((~chosen).sum()))
            slots = state.layers[layer_index]["recent"].view()
            seen = layer.kind.alive(slots, query_time, state.episode_begin)
            age = query_time - slots.position
            seen &= age > 0  # the query itself is no memory
            bins = (age[seen] // self.age_bin).clamp_max(self.alive.shape[1] - 1).cpu().numpy()
            np.add.at(self.alive[layer_index], bins, 1)
            if slots.span is not None:
                np.add.at(self.span_sum[layer_index], bins, slots.span[seen].double().cpu().numpy())
        self.queries += batch

    def summary(self) -> dict:
        """Per layer: spans of marked memories (mean, min, max, count) against the other
        memories' mean span, and rows of (age range, memories seen per query, mean span)."""
        layers = []
        for index in range(len(self.core.layers)):
            row: dict = {"layer": index}
            marked = np.asarray(self.marked[index])
            if marked.size:
                row["marked_spans"] = {
                    "mean": float(marked.mean()),
                    "min": float(marked.min()),
                    "max": float(marked.max()),
                    "count": int(marked.size),
                }
            total, count = self.unmarked[index]
            if count:
                row["other_mean_span"] = float(total / count)
            by_age = []
            for b, seen in enumerate(self.alive[index]):
                if not seen:
                    continue
                age = f"{max(1, b * self.age_bin)}-{(b + 1) * self.age_bin - 1}"  # (no age 0)
                entry = {"age": age, "memories_per_query": float(seen / self.queries)}
                if self.span_sum[index, b]:
                    entry["mean_span"] = float(self.span_sum[index, b] / seen)
                by_age.append(entry)
            row["by_age"] = by_age
            layers.append(row)
        return {"layers": layers}
