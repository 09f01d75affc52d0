"""What an Expire-Span language model keeps: a passage shaded by each layer's expire-spans.

    python -m analysis.visualize CHECKPOINT (--text FILE | --split valid) --out DIR

As in the paper's figures 8 and 11: every token of the passage is shaded by the expire-span
e_i its memory gets at each layer (darker: kept longer; one row per layer). The model reads
the passage in blocks of K tokens with its memory carried, exactly as in training and
evaluation, so the spans are those it predicts in use. Writes DIR/spans.html (hover a token
for its span), DIR/spans.png and DIR/spans.json (tokens and spans, for your own plots).

CHECKPOINT is a checkpoint file or run directory of `train_lm.py memory=expire_span`.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.colors import Normalize, to_hex
from matplotlib.figure import Figure  # drawn with Agg, without pyplot's global state

from analysis.runs import LM, RunKindError, check_run_kind
from lm.data import BYTE_VOCAB, TaskDataError
from lm.instruction import NEWLINE, UNK, tokenize
from lm.model import LanguageModel, trained_model
from lm.tasks import load_task
from training.checkpoint import load_checkpoint
from training.config import exit_on_config_error

COLOURMAP = "Blues"  # darker: a longer span, as in the paper's figures
SHOWN_NEWLINE = "\u21b5"  # a newline token is drawn as this arrow, then the line breaks
SHOWN_OTHER_BYTE = "\u00b7"  # bytes outside printable ASCII
PNG_COLUMNS = 80  # character cells per line of a figure panel


class VisualizeError(Exception):
    """A checkpoint or passage the tool cannot show; the message says what was wrong."""


@dataclass
class Passage:
    """Token ids, what each token looks like on screen, and the spans of every layer."""

    ids: np.ndarray  # (N,)
    labels: list[str]  # shown text per token (a newline token is SHOWN_NEWLINE)
    spans: np.ndarray  # (num_layers, N): e_i of token i at each layer
    max_span: int  # L
    words: bool  # tokens are words: drawn with a space between them


def load_model(checkpoint_path: str | Path) -> tuple[LanguageModel, dict, list[str]]:
    """The trained Expire-Span model (eval mode), its run config and vocabulary; RunKindError
    for a checkpoint of train_rl.py."""
    checkpoint = load_checkpoint(checkpoint_path)
    if checkpoint is None:
        raise VisualizeError(f"{checkpoint_path}: no checkpoint file there")
    config = checkpoint.get("config", {})
    check_run_kind(checkpoint_path, config, LM)
    kind = config["memory"]["kind"]
    if kind != "expire_span":
        raise VisualizeError(
            f"{checkpoint_path} is a memory={kind} model; expire-spans exist only in models "
            "trained with memory=expire_span"
        )
    return trained_model(checkpoint), config, checkpoint["vocab"]


@torch.no_grad()
def predicted_spans(model: LanguageModel, ids: np.ndarray) -> np.ndarray:
    """e_i of every token at every layer, (num_layers, N), reading `ids` in blocks of K.

    The span predictor of each layer is called once per block on the block's new memories
    (with gradients off no stored memory is re-scored); a forward hook records its output.
    """
    model.eval()
    predictors = [layer.kind.predictor for layer in model.core.layers]
    blocks: list[list[torch.Tensor]] = [[] for _ in predictors]
    hooks = [
        predictor.register_forward_hook(
            lambda _module, _args, e, layer=layer: blocks[layer].append(e)
        )
        for layer, predictor in enumerate(predictors)
    ]
    try:
        state = model.initial_state(1)
        tokens = torch.as_tensor(np.asarray(ids, dtype=np.int64))[None]
        block_len = model.cfg.block_len
        for start in range(0, tokens.shape[1], block_len):
            _, out = model(tokens[:, start : start + block_len], state)
            state = out.state
    finally:
        for hook in hooks:
            hook.remove()
    spans = [torch.cat(calls, dim=1)[0] for calls in blocks]
    if any(s.shape[0] != len(ids) for s in spans):
        raise RuntimeError("the span predictors were not called once per token and layer")
    return torch.stack(spans).numpy()


def token_ids(text: bytes, vocab: list[str], byte_level: bool) -> np.ndarray:
    """The passage as the model's token ids: bytes, or words of the task's vocabulary."""
    if byte_level:
        return np.frombuffer(text, dtype=np.uint8).astype(np.int64)
    index = {word: i for i, word in enumerate(vocab)}
    decoded = text.decode("utf-8", errors="replace")
    if UNK in index:  # the instruction task: its tokenizer, rare words become <unk>
        words = [word for line in decoded.splitlines() for word in [*tokenize(line), NEWLINE]]
        return np.array([index.get(word, index[UNK]) for word in words], dtype=np.int64)
    words = decoded.split()
    unknown = sorted({w for w in words if w not in index})
    if unknown:
        raise VisualizeError(
            f"the text holds tokens outside the task's vocabulary: {', '.join(unknown[:10])}; "
            f"the vocabulary is: {' '.join(vocab[:40])}{' ...' if len(vocab) > 40 else ''}"
        )
    return np.array([index[w] for w in words], dtype=np.int64)


def token_labels(ids: np.ndarray, vocab: list[str], byte_level: bool) -> list[str]:
    if byte_level:
        return [
            SHOWN_NEWLINE if b == 10 else chr(b) if 32 <= b < 127 else SHOWN_OTHER_BYTE
            for b in ids.tolist()
        ]
    return [SHOWN_NEWLINE if vocab[i] == NEWLINE else vocab[i] for i in ids.tolist()]


def passage_from_split(config: dict, split: str, offset: int, length: int) -> np.ndarray:
    """Tokens [offset, offset + length) of a split of the task the model was trained on."""
    task = dict(config["task"])
    try:
        data = load_task(task.pop("name"), **task)
    except TaskDataError as error:
        raise VisualizeError(str(error)) from None
    inputs = data.split(split).inputs
    if offset >= len(inputs):
        raise VisualizeError(
            f"--offset {offset} is past the end of the {split} split ({len(inputs):,})"
        )
    return inputs[offset : offset + length].astype(np.int64)


def make_passage(
    model: LanguageModel, vocab: list[str], ids: np.ndarray, byte_level: bool
) -> Passage:
    if len(ids) == 0:
        raise VisualizeError("the passage is empty")
    return Passage(
        ids=ids,
        labels=token_labels(ids, vocab, byte_level),
        spans=predicted_spans(model, ids),
        max_span=model.cfg.max_span,
        words=not byte_level,
    )


SCALES = ("layer", "max_span")


def colour_scales(passage: Passage, scale: str) -> list[Normalize]:
    """Per layer, the span drawn darkest: the layer's longest span in the passage ("layer":
    layers keep things for very different times) or L ("max_span": one scale for all)."""
    if scale not in SCALES:
        raise ValueError(f"scale must be one of {SCALES}, got {scale!r}")
    tops = (
        passage.spans.max(axis=1) if scale == "layer" else [passage.max_span] * len(passage.spans)
    )
    return [Normalize(0, max(float(top), 1e-6)) for top in tops]


def render_html(passage: Passage, title: str, scale: str = "layer") -> str:
    """The passage once per layer, each token shaded by its span, the span in its tooltip."""
    sections = []
    norms = colour_scales(passage, scale)
    for layer, (spans, norm) in enumerate(zip(passage.spans, norms, strict=True)):
        pieces = []
        for label, span, rgba in zip(
            passage.labels, spans, colormaps[COLOURMAP](norm(spans)), strict=True
        ):
            ink = "#fff" if rgba[:3].mean() < 0.5 else "#000"
            text = html.escape(label) + ("<br>" if label == SHOWN_NEWLINE else "")
            pieces.append(
                f'<span style="background:{to_hex(rgba)};color:{ink}" '
                f'data-span="{span:.6g}" title="e={span:.1f}">{text}</span>'
            )
        joiner = " " if passage.words else ""
        sections.append(
            f'<section class="layer" data-layer="{layer + 1}"><h2>Layer {layer + 1} '
            f"(darkest: e = {norm.vmax:.1f})</h2>"
            f'<div class="text">{joiner.join(pieces)}</div></section>'
        )
    legend = (
        f"Expire-span e<sub>i</sub> of every token at every layer (maximum span L = "
        f"{passage.max_span}): darker is kept longer, from 0 (white) to the span given by each "
        "layer's heading (dark blue). Hover a token for its span."
    )
    return f"""<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; margin: 2em; }}
.text {{ font-family: monospace; white-space: pre-wrap; line-height: 1.7; }}
.layer h2 {{ font-size: 1em; margin: 1.2em 0 0.3em; }}
</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p>{legend}</p>
{chr(10).join(sections)}
</body>
</html>
"""


def layout(labels: Sequence[str], words: bool, columns: int) -> list[tuple[int, int, int]]:
    """(line, column, width) of every token in lines of `columns` cells; a newline token
    ends its line."""
    cells, line, column = [], 0, 0
    for label in labels:
        width = len(label) + (1 if words else 0)
        if column and column + width > columns:
            line, column = line + 1, 0
        cells.append((line, column, width))
        column += width
        if label == SHOWN_NEWLINE:
            line, column = line + 1, 0
    return cells


def render_png(
    passage: Passage, title: str, scale: str = "layer", columns: int = PNG_COLUMNS
) -> Figure:
    """One panel per layer: the passage on a grid of cells shaded by span."""
    cells = layout(passage.labels, passage.words, columns)
    lines = cells[-1][0] + 1
    layers = len(passage.spans)
    figure = Figure(
        figsize=(columns * 0.08 + 1.5, layers * (lines * 0.17 + 0.3) + 0.5), layout="constrained"
    )
    grids = figure.subplots(layers, 1, squeeze=False)[:, 0]
    norms = colour_scales(passage, scale)
    for layer, (axes, spans, norm) in enumerate(zip(grids, passage.spans, norms, strict=True)):
        grid = np.full((lines, columns), np.nan)
        for (line, column, width), span in zip(cells, spans, strict=True):
            grid[line, column : column + width] = span
        image = axes.imshow(grid, cmap=COLOURMAP, norm=norm, aspect="auto", interpolation="none")
        for (line, column, _), label, span in zip(cells, passage.labels, spans, strict=True):
            ink = "white" if norm(span) > 0.6 else "black"
            for k, character in enumerate(label):
                axes.text(
                    column + k,
                    line,
                    character,
                    ha="center",
                    va="center",
                    fontsize=7,
                    family="monospace",
                    color=ink,
                )
        axes.set_xticks([])
        axes.set_yticks([])
        axes.set_ylabel(f"layer {layer + 1}")
        figure.colorbar(image, ax=axes, label="$e_i$", fraction=0.02, pad=0.01)
    grids[0].set_title(title, fontsize=9)
    return figure


def write_visualization(
    passage: Passage, out_dir: Path, title: str, scale: str = "layer"
) -> list[Path]:
    """DIR/spans.html, spans.png and spans.json; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = [out_dir / "spans.html", out_dir / "spans.png", out_dir / "spans.json"]
    paths[0].write_text(render_html(passage, title, scale), encoding="utf-8")
    render_png(passage, title, scale).savefig(paths[1], dpi=150)
    record = {
        "max_span": passage.max_span,
        "tokens": passage.ids.tolist(),
        "labels": passage.labels,
        "spans": passage.spans.tolist(),  # [layer][token]
    }
    paths[2].write_text(json.dumps(record), encoding="utf-8")
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m analysis.visualize",
        description="Shade a passage by the expire-span each layer of a trained model gives it.",
    )
    parser.add_argument("checkpoint", help="checkpoint file or run directory (memory=expire_span)")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--text", type=Path, help="a file holding the passage")
    source.add_argument("--split", choices=("train", "valid", "test"), help="a split of the task")
    parser.add_argument("--out", required=True, type=Path, help="directory for the HTML, PNG, JSON")
    parser.add_argument("--offset", type=int, default=0, help="first token of the passage")
    parser.add_argument("--length", type=int, default=1000, help="tokens in the passage")
    parser.add_argument(
        "--scale",
        choices=SCALES,
        default="layer",
        help="darkest colour: each layer's longest span in the passage (default) or L",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    if args.offset < 0 or args.length < 1:
        parser.error("--offset must be >= 0 and --length >= 1")
    torch.set_num_threads(args.threads)
    try:
        model, config, vocab = load_model(args.checkpoint)
        byte_level = vocab == BYTE_VOCAB
        if args.text is not None:
            if not args.text.is_file():
                raise VisualizeError(f"--text {args.text}: no such file")
            ids = token_ids(args.text.read_bytes(), vocab, byte_level)
            ids = ids[args.offset : args.offset + args.length]
            source_name = args.text.name
        else:
            ids = passage_from_split(config, args.split, args.offset, args.length)
            source_name = f"{config['task']['name']} {args.split}"
        passage = make_passage(model, vocab, ids, byte_level)
    except (VisualizeError, RunKindError) as error:
        print(f"{parser.prog}: error: {error}", file=sys.stderr)
        return 2
    title = f"Expire-spans per layer: {source_name}, tokens {args.offset}..{args.offset + len(ids)}"
    for path in write_visualization(passage, args.out, title, args.scale):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(exit_on_config_error(main)())  # a damaged checkpoint: one line
