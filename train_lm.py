"""Train a language model with a memory core: `python train_lm.py task=collision`.

The loop reads top to bottom: check the config, load (or generate) the task, cut the
training stream into B parallel rows and walk them in blocks of K = memory.block_len
tokens. Each update reads one block, carries the memory (detached) to the next block, and
takes an Adam step with linear warm-up and cosine decay; every eval_interval updates a full
pass over the first valid_prefix tokens of the validation split, memory carried, gives valid_bpb
(byte tasks) or valid_accuracy / valid_error (answer tasks). `mode=eval checkpoint=PATH`
evaluates a checkpoint on a split instead; `init_from=RUN` starts from another run's weights
(fine-tuning, a curriculum of grids). Under `torchrun` every rank walks its own slice of the
B rows and gradients are all-reduced. A finished run scores its model on eval.split (the
test split) as `mode=eval` does, into RUN_DIR/eval.json, and draws its curves into
RUN_DIR/curves.png (eval.after_training).

Update u reads block u mod (row length // K) of every row, so a resumed run continues
from the same data; the checkpoint also holds the carried memory, so it continues exactly.
"""

from __future__ import annotations

from training.openmp import shorten_openmp_spinning

shorten_openmp_spinning()  # first: OpenMP reads its spin count once, when torch loads it

# ruff: noqa: E402  (the imports below follow that call on purpose)

import json
import logging
import math
import sys
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import hydra
import numpy as np
import torch
import torch.nn.functional as F
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel

from lm import (
    IGNORE,
    TASKS,
    Split,
    TaskData,
    TaskDataError,
    answer_accuracy,
    load_task,
    source_rows,
)
from lm.model import LanguageModel, trained_model
from memory import CoreOutput, MemoryState, kind_names
from training.checkpoint import (
    CHECKPOINT_FILE,
    check_checkpoint_kind,
    checkpoint_file,
    load_checkpoint,
    load_trained,
    save_checkpoint,
)
from training.config import (
    COMPILE_MODES,
    ConfigError,
    check_choice,
    check_positive,
    check_positive_int,
    check_range,
    exit_on_config_error,
    refuse_added_keys,
)
from training.distributed import (
    DistInfo,
    all_gather_object,
    all_reduce_mean,
    broadcast_object,
    resolve_device,
)
from training.divergence import DivergenceGuard, check_nonfinite_config, resume_remedy
from training.entry import checked_command_line, train_or_evaluate
from training.host import thread_count, use_host
from training.metrics import SpanStats, check_wandb_config, start_logging
from training.progress import progress_bar, set_metrics
from training.resume import given_keys
from training.run import gather_rank_states, start_run
from training.run_dir import EVAL_FILE, command_line_overrides
from training.schedule import lr_fraction
from training.schemas import memory_config, register_schemas
from training.seeding import rank_seed, restore_rng_state, seed_everything

PATH_OPTIONS = ("path", "data_dir", "cache_dir", "distractor_file")  # task options naming files
VOCAB_WEIGHTS = ("embedding.weight", "head.weight", "head.bias")  # one row per token
INTERVAL_KEYS = ("loss_sum", "scored", "aux_loss", "memory_size", "grad_norm", "steps", "skipped")
CONFIGS = Path(__file__).parent / "configs"
PRECISIONS = ("fp32", "bf16")  # bf16: the training step autocast to bfloat16, on CUDA
OPEN_KEYS = ("memory.options",)  # a memory kind's own options: `+KEY=VALUE` may add to them

log = logging.getLogger(__name__)


def check_config(cfg: DictConfig) -> None:
    """Reject impossible settings before any work is done."""
    refuse_added_keys(command_line_overrides(), cfg, CONFIGS, OPEN_KEYS)
    check_choice("mode", cfg.mode, ("train", "eval"))
    check_choice("task", cfg.task.name, TASKS)
    check_choice("precision", cfg.precision, PRECISIONS)
    if cfg.compile_step:
        check_choice("compile_step", cfg.compile_step, COMPILE_MODES)
    if cfg.precision == "bf16" and resolve_device(cfg.device).type != "cuda":
        raise ConfigError(
            "precision=bf16 autocasts the training step on CUDA only: on a CPU without bfloat16 "
            "instructions a step took 17x as long as in fp32 (docs/performance.md); use "
            "precision=fp32 or device=cuda"
        )
    thread_count(cfg.torch_threads)  # auto, or a positive number
    if cfg.task.name == "text" and not cfg.task.get("path"):
        raise ConfigError("task=text reads a file of your own: add task.path=/path/to/file")
    for key in (
        "batch_size",
        "total_steps",
        "eval_batch_size",
        "log_interval",
        "eval_interval",
        "checkpoint_interval",
    ):
        check_positive_int(key, cfg[key])
    if cfg.valid_prefix is not None:
        check_positive_int("valid_prefix", cfg.valid_prefix)
    if cfg.eval.tokens is not None:
        check_positive_int("eval.tokens", cfg.eval.tokens)
    check_choice("eval.split", cfg.eval.split, ("train", "valid", "test"))
    if cfg.warmup_steps != 0:
        check_positive_int("warmup_steps", cfg.warmup_steps)
    check_positive("lr", cfg.lr)
    check_range("min_lr_ratio", cfg.min_lr_ratio, 0, 1)
    if cfg.grad_clip is not None:
        check_positive("grad_clip", cfg.grad_clip)
    check_wandb_config(cfg.wandb)
    check_nonfinite_config(cfg)
    if cfg.mode == "eval" and cfg.checkpoint is None:
        raise ConfigError("mode=eval needs checkpoint=PATH (a checkpoint file or a run directory)")
    init_from = cfg.get("init_from")
    if init_from is not None and not checkpoint_file(init_from).is_file():
        raise ConfigError(
            f"init_from={init_from}: no checkpoint there; give a checkpoint file or the "
            "directory of a train_lm.py run"
        )
    check_choice("memory", cfg.memory.kind, kind_names())
    memory_config(cfg.memory)  # (it checks its own fields)


def started_in() -> Path:
    """Where the command was started: relative task paths are read from there."""
    return Path(hydra.utils.get_original_cwd()) if HydraConfig.initialized() else Path.cwd()


def load_options(task_cfg: DictConfig, base: Path) -> dict:
    """The task's options for `load_task`, its file and directory options made absolute from
    `base`. Only here: the saved config keeps the paths as given, so that a resume with the
    run's own command line matches it."""
    options = OmegaConf.to_container(task_cfg, resolve=True)
    del options["name"]
    for key in PATH_OPTIONS:
        if options.get(key):
            options[key] = str(base / Path(options[key]).expanduser())
    return options


def load_data(task_cfg: DictConfig, dist: DistInfo, base: Path | None = None) -> TaskData:
    """Load or generate the task, its relative paths read from `base` (default: where this
    command started); rank 0 first, so it alone writes the shared data cache."""
    options = load_options(task_cfg, started_in() if base is None else base)

    def load() -> TaskData | str:
        try:
            return load_task(task_cfg.name, **options)
        except TaskDataError as error:  # missing files and bad options: the message says why
            return str(error)

    data = load() if dist.is_main else None
    error = broadcast_object(data if isinstance(data, str) else None, dist)  # also a barrier
    if error is None and not dist.is_main:
        data = load()
        error = data if isinstance(data, str) else None
    if error is not None:
        raise ConfigError(f"task={task_cfg.name}: {error}")
    return data


def build_model(cfg: DictConfig, vocab_size: int) -> LanguageModel:
    return LanguageModel(vocab_size, memory_config(cfg.memory))


def transfer_weights(model: LanguageModel, path: str, vocab: list[str]) -> str:
    """Start `model` from another run's weights (init_from), for fine-tuning and curricula.

    The embedding and read-out rows follow the tokens (`lm.data.source_rows`: same name, or the
    coarse cell of a smaller grid); a token the other run lacks keeps its fresh row. Every
    other weight must have the same shape: the memory settings must be the other run's.
    Returns one line for the log: which file, its step, what was loaded and what was not.
    """
    checkpoint = load_checkpoint(path)
    check_checkpoint_kind(checkpoint, "model", f"init_from={path}", other="train_rl.py")
    rows = torch.from_numpy(source_rows(vocab, checkpoint["vocab"]))
    found = rows >= 0
    weights = model.state_dict()
    loaded = skipped = 0  # values (tensor elements)
    for name, value in checkpoint["model"].items():
        own = weights.get(name)
        per_token = name in VOCAB_WEIGHTS  # rows follow the tokens; only the rest must match
        if own is None or own.shape[per_token:] != value.shape[per_token:]:
            shape = "no such weight" if own is None else tuple(own.shape)
            raise ConfigError(
                f"init_from={path}: its {name} {tuple(value.shape)} does not fit this model "
                f"({shape}); use the memory settings of the run it comes from"
            )
        if per_token:
            own[found] = value[rows[found]]
            skipped += own[~found].numel()
        else:
            weights[name] = value
        loaded += own.numel()
    missing = set(weights) - set(checkpoint["model"])
    if missing:
        raise ConfigError(
            f"init_from={path} has no {', '.join(sorted(missing))}: it is another memory kind"
        )
    model.load_state_dict(weights)
    fresh = len(vocab) - int(found.sum())
    skipped_rows = (
        f"{skipped:,} values, the rows of the {fresh} of {len(vocab)} tokens it lacks (kept fresh)"
        if fresh
        else "none"
    )
    return (
        f"init_from: loaded {checkpoint_file(path)} (step {checkpoint['step']}): "
        f"{len(weights)} weights, {loaded - skipped:,} values; skipped {skipped_rows}"
    )


def rank_rows(rows: Split, dist: DistInfo) -> Split:
    """This rank's contiguous share of the rows of a batchified split."""
    per_rank = rows.inputs.shape[0] // dist.world_size
    mine = slice(dist.rank * per_rank, (dist.rank + 1) * per_rank)
    return Split(*(None if a is None else a[mine] for a in vars(rows).values()))


def block(rows: Split, start: int, length: int, device: torch.device) -> tuple[torch.Tensor, ...]:
    """Inputs and targets of positions [start, start + length) of every row, int64 tensors."""
    return tuple(
        torch.from_numpy(a[:, start : start + length].astype(np.int64)).to(device)
        for a in (rows.inputs, rows.targets)
    )


def learning_rate(cfg: DictConfig, step: int) -> float:
    """Linear warm-up over warmup_steps, then cosine decay to min_lr_ratio * lr at total_steps."""
    schedule = lr_fraction("cosine", step, cfg.total_steps, cfg.warmup_steps, cfg.min_lr_ratio)
    return cfg.lr * schedule


@torch.no_grad()
def evaluate(
    model: LanguageModel, rows: Split, metric: str, dist: DistInfo, prefix: str
) -> dict[str, float]:
    """One pass over `rows` (all ranks' rows; this rank runs its share) in blocks of K with the
    memory carried, in eval mode. Returns {prefix}_loss (nats per scored target), _memory_size,
    and _bpb for byte tasks or _accuracy and _error for answer tasks."""
    mine = rank_rows(rows, dist)
    batch, length = mine.inputs.shape
    block_len = model.cfg.block_len
    was_training = model.training
    model.eval()
    state = model.initial_state(batch, dist.device)
    loss_sum, scored, memory_size, predictions = 0.0, 0, 0.0, []
    for start in range(0, length, block_len):
        x, y = block(mine, start, block_len, dist.device)
        logits, out = model(x, state)
        state = out.state
        loss_sum += F.cross_entropy(
            logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum"
        ).item()
        scored += int((y != IGNORE).sum())
        memory_size += float(out.memory_size) * x.shape[1]
        if metric != "bpb":
            predictions.append(logits.argmax(-1).cpu().numpy())
    model.train(was_training)
    pred = np.concatenate(predictions, axis=1) if predictions else None
    shares = all_gather_object((loss_sum, scored, memory_size, pred), dist)
    loss = sum(s[0] for s in shares) / max(1, sum(s[1] for s in shares))
    results = {"loss": loss, "memory_size": sum(s[2] for s in shares) / (len(shares) * length)}
    if metric == "bpb":
        results["bpb"] = loss / math.log(2)
    else:
        accuracy = answer_accuracy(np.concatenate([s[3] for s in shares]), rows)
        results.update(accuracy=accuracy, error=1.0 - accuracy)
    return {f"{prefix}_{key}": value for key, value in results.items()}


def cut_rows(split: Split, tokens: int | None, batch_size: int, what: str) -> Split:
    """The first `tokens` tokens of a split (None: all) as `batch_size` rows."""
    try:
        return (split.head(tokens) if tokens else split).batchify(batch_size)
    except TaskDataError as error:
        raise ConfigError(f"{what}: {error}") from None


def check_divisible(name: str, value: int, dist: DistInfo) -> None:
    if value % dist.world_size:
        raise ConfigError(
            f"{name}={value} must be divisible by the {dist.world_size} torchrun processes "
            "(each takes an equal share of the rows)"
        )


@dataclass
class LMProgress:
    """Where a run is: updates done, the memory its rows carry to the next block, and the
    sums of the logging interval so far."""

    step: int = 0
    state: MemoryState | None = None
    interval: dict[str, float] = field(default_factory=lambda: dict.fromkeys(INTERVAL_KEYS, 0.0))
    seconds: float = 0.0  # this process's training time over the interval's steps since it
    timed_steps: int = 0  # started or the run resumed (not in the checkpoint)


def train(cfg: DictConfig, checkpoint: dict | None) -> None:
    """Trains from scratch, or continues the run of ``checkpoint`` (``resumed_run``)."""
    with ExitStack() as resources:  # closed on every way out, exceptions included
        dist, run_dir = start_run(resources, cfg, checkpoint)
        data, train_rows, valid_rows = load_rows(cfg, dist)
        blocks_per_epoch = train_rows.inputs.shape[1] // cfg.memory.block_len
        seed_everything(rank_seed(cfg.seed, dist.rank))
        model = build_model(cfg, data.vocab_size)
        if checkpoint is None and cfg.get("init_from") is not None:
            loaded = transfer_weights(model, cfg.init_from, data.vocab)
            if dist.is_main:
                log.info(loaded)
        model = model.to(dist.device)
        ddp_model = (  # (the model itself in a single process)
            DistributedDataParallel(model, broadcast_buffers=False)
            if dist.is_distributed
            else model
        )
        if cfg.compile_step:  # static shapes: each padded length of the memory compiles once
            ddp_model = torch.compile(ddp_model, mode=cfg.compile_step, dynamic=False)
        optimizer = torch.optim.Adam(model.parameters(), lr=cfg.lr, fused=True)
        progress = LMProgress()
        if checkpoint is not None:
            progress = restore(checkpoint, dist, model, optimizer)
        remedy = resume_remedy("train_lm.py", run_dir, cfg, checkpoint, "lr=... grad_clip=...")
        guard = DivergenceGuard(cfg, model, optimizer, dist, run_dir, remedy)
        logger = start_logging(resources, run_dir, cfg, dist.is_main, checkpoint)
        bar = resources.enter_context(
            progress_bar(cfg.total_steps, initial=progress.step, enabled=dist.is_main)
        )
        task_metric = f"valid_{data.metric}"
        baselines = valid_baselines(data, cfg.valid_prefix)

        model.train()
        for step in range(progress.step, cfg.total_steps):
            out = train_step(cfg, model, ddp_model, optimizer, train_rows, progress, dist, guard)
            progress.step = done = step + 1
            bar.update(1)
            last = done == cfg.total_steps
            record = {}
            if done % cfg.log_interval == 0 or last:
                record.update(
                    interval_metrics(cfg, progress, out, data.metric, blocks_per_epoch, dist)
                )
            if done % cfg.eval_interval == 0 or last:
                record.update(evaluate(model, valid_rows, data.metric, dist, "valid"), **baselines)
            if record:
                logger.log(record, step=done)
                shown = ("train_loss", task_metric, "memory_size")
                set_metrics(bar, {k: record[k] for k in shown if k in record})
            if done % cfg.checkpoint_interval == 0 or last:
                save_training(cfg, model, optimizer, progress, data, run_dir, dist)
        bar.close()
        if cfg.eval.after_training:  # every rank scores its share of the rows
            step = max(progress.step, cfg.total_steps)  # the step of the model scored
            report_trained_model(model, data, cfg, run_dir, dist, step)


def load_rows(cfg: DictConfig, dist: DistInfo) -> tuple[TaskData, Split, Split]:
    """The task, this rank's training rows (B rows of the training stream, this rank's share)
    and the validation prefix in eval_batch_size rows."""
    check_divisible("batch_size", cfg.batch_size, dist)
    check_divisible("eval_batch_size", cfg.eval_batch_size, dist)
    data = load_data(cfg.task, dist)
    K = cfg.memory.block_len
    train_rows = rank_rows(cut_rows(data.train, None, cfg.batch_size, "batch_size"), dist)
    if train_rows.inputs.shape[1] < K:
        raise ConfigError(
            f"the training split ({len(data.train):,} tokens) cut into batch_size="
            f"{cfg.batch_size} rows is shorter than one block (memory.block_len={K}); "
            "use more data, fewer rows or shorter blocks"
        )
    valid_rows = cut_rows(data.valid, cfg.valid_prefix, cfg.eval_batch_size, "eval_batch_size")
    return data, train_rows, valid_rows


def valid_baselines(data: TaskData, valid_prefix: int | None) -> dict[str, float]:
    """The errors of answers that learn nothing (collision), logged beside the validation
    metrics when the whole validation split is read."""
    whole_split = data.info.get("baselines", {}).get("valid", {}) if not valid_prefix else {}
    return {f"valid_{key}": value for key, value in whole_split.items()}


def restore(
    checkpoint: dict, dist: DistInfo, model: LanguageModel, optimizer: torch.optim.Optimizer
) -> LMProgress:
    """Loads ``checkpoint`` into the model and optimizer a fresh run built; returns where the
    run was, this rank's carried memory and interval sums included."""
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    restore_rng_state(checkpoint["rng"][dist.rank])
    state = model.core.load_state(checkpoint["memory_state"][dist.rank], dist.device)
    interval = {**dict.fromkeys(INTERVAL_KEYS, 0.0), **checkpoint["interval"][dist.rank]}
    return LMProgress(checkpoint["step"], state, interval)


def train_step(
    cfg: DictConfig,
    model: LanguageModel,
    ddp_model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rows: Split,
    progress: LMProgress,
    dist: DistInfo,
    guard: DivergenceGuard | None = None,
) -> CoreOutput:
    """One update on block `progress.step` mod (row length // K) of every row, the memory
    carried from the block before (detached); adds to the interval sums. `ddp_model` is
    `model`, or its DistributedDataParallel wrapper under torchrun, compiled with
    ``compile_step``. ``guard`` judges the update (None: unjudged); a skipped one adds only
    to the count of skipped updates."""
    started = time.perf_counter()
    K = cfg.memory.block_len
    position = progress.step % (rows.inputs.shape[1] // K)
    if position == 0:  # each row starts over from its beginning: nothing to remember
        progress.state = model.initial_state(rows.inputs.shape[0], dist.device)
    x, y = block(rows, position * K, K, dist.device)
    if cfg.compile_step:  # the memory in few shapes, its dead slots deleted: one host read
        progress.state = progress.state.compacted()
    scored = int((y != IGNORE).sum())
    # The loss is the mean over every rank's scored targets, as in one process: DDP averages
    # the ranks' gradients, so each rank scales its sum by world_size / total.
    total_scored = all_reduce_mean({"scored": scored}, dist)["scored"] * dist.world_size
    with torch.autocast(dist.device.type, torch.bfloat16, enabled=cfg.precision == "bf16"):
        logits, out = ddp_model(x, progress.state)
        loss_sum = F.cross_entropy(
            logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE, reduction="sum"
        )
    progress.state = out.state
    loss = loss_sum * (dist.world_size / max(total_scored, 1.0)) + out.aux_loss
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(cfg, progress.step)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(
        model.parameters(), cfg.grad_clip if cfg.grad_clip else math.inf
    )
    if guard is not None:
        guard.begin()
    optimizer.step()
    values = {
        "loss_sum": loss_sum.item(),
        "scored": scored,
        "aux_loss": float(out.aux_loss.detach()),
        "memory_size": float(out.memory_size),
        "grad_norm": grad_norm.item(),
        "steps": 1,
    }
    losses = {"train_loss": values["loss_sum"], "aux_loss": values["aux_loss"]}
    if guard is not None and guard.end(losses, progress.step + 1, progress.step + 1):
        values = {"skipped": 1}  # (undone: its values are not the model's)
    for key, value in values.items():
        progress.interval[key] += value
    progress.seconds += time.perf_counter() - started
    progress.timed_steps += 1
    return out


def interval_metrics(
    cfg: DictConfig,
    progress: LMProgress,
    out: CoreOutput,
    metric: str,
    blocks_per_epoch: int,
    dist: DistInfo,
) -> dict[str, float]:
    """The logging interval's line, averaged over ranks (a collective: every rank calls it),
    with the spans of the last block's new memories; starts the next interval."""
    K = cfg.memory.block_len
    means = all_reduce_mean(progress.interval, dist)
    steps = progress.interval["steps"] or math.nan  # (none: every update was skipped)
    record = {
        "train_loss": means["loss_sum"] / means["scored"] if means["scored"] else math.nan,
        "aux_loss": means["aux_loss"] / steps,
        "memory_size": means["memory_size"] / steps,
        "grad_norm": means["grad_norm"] / steps,
        "lr": learning_rate(cfg, progress.step - 1),
        "tokens_per_s": progress.timed_steps * cfg.batch_size * K / progress.seconds,
        "epoch": progress.step / blocks_per_epoch,
    }
    if metric == "bpb":
        record["train_bpb"] = record["train_loss"] / math.log(2)
    if cfg.nonfinite == "skip":
        record["skipped_updates"] = int(means["skipped"])
    last_block = SpanStats()  # the spans of this block's new memories, per layer
    last_block.add(out.spans)
    record.update(all_reduce_mean(last_block.summary(), dist))
    progress.interval = dict.fromkeys(INTERVAL_KEYS, 0.0)
    progress.seconds, progress.timed_steps = 0.0, 0
    return record


def save_training(
    cfg: DictConfig,
    model: LanguageModel,
    optimizer: torch.optim.Optimizer,
    progress: LMProgress,
    data: TaskData,
    run_dir: Path,
    dist: DistInfo,
) -> None:
    """RUN_DIR/checkpoint.pt, which `restore` loads (a collective: every rank's memory and
    interval sums are gathered)."""
    memory_state = model.core.save_state(progress.state)
    gathered = gather_rank_states(
        dist, model, memory_state=memory_state, interval=dict(progress.interval)
    )
    if dist.is_main:
        state = {**gathered, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
        state.update(step=progress.step, vocab=list(data.vocab))
        state["config"] = OmegaConf.to_container(cfg, resolve=True)
        state["started_in"] = str(started_in())  # its relative task paths' base
        save_checkpoint(run_dir, state)


def report_trained_model(
    model: LanguageModel,
    data: TaskData,
    cfg: DictConfig,
    run_dir: Path,
    dist: DistInfo,
    step: int,
) -> None:
    """A finished run's report (`analysis.report`), as train_rl.py's: RUN_DIR/eval.json, the
    model scored on eval.split as `mode=eval checkpoint=RUN_DIR` scores it, and
    RUN_DIR/curves.png, its training and validation curves; then one summary line."""
    result = evaluate_split(model, data, cfg.eval.split, cfg.eval.tokens, cfg.eval_batch_size, dist)
    if not dist.is_main:
        return
    result.update(step=step, checkpoint=CHECKPOINT_FILE)  # beside eval.json: no host path
    from analysis.report import report_lm_run  # (matplotlib: imported once a run ends)

    report_lm_run(run_dir, cfg, result, data.metric)
    metric = f"{cfg.eval.split}_{data.metric}"
    log.info(
        "%s: %.4f over %s tokens of the %s split (%s)",
        metric,
        result[metric],
        f"{result['tokens']:,}",
        cfg.eval.split,
        run_dir / EVAL_FILE,
    )


def evaluate_split(
    model: LanguageModel,
    data: TaskData,
    split: str,
    tokens: int | None,
    batch_size: int,
    dist: DistInfo,
) -> dict[str, float]:
    """`evaluate` on the first `tokens` tokens of `split` (None: all) in `batch_size` rows, with
    the tokens read and the seconds taken: one code path for mode=eval and a finished run."""
    rows = cut_rows(data.split(split), tokens, batch_size, "eval.tokens")
    started = time.perf_counter()
    result = evaluate(model, rows, data.metric, dist, split)
    result.update(tokens=int(rows.inputs.size), seconds=time.perf_counter() - started)
    return result


def refuse_model_changes(trained: DictConfig, cfg: DictConfig, given: list[str]) -> None:
    """mode=eval scores a checkpoint's model on the task it was trained on: a command that
    changes either (`memory.*`, `task.*`) is refused in one line instead of ignored."""
    for key in given:
        value, trained_value = OmegaConf.select(cfg, key), OmegaConf.select(trained, key)
        if key.partition(".")[0] in ("memory", "task") and value != trained_value:
            raise ConfigError(
                f"mode=eval scores {cfg.checkpoint} as it was trained, but {key}={value} (the "
                f"model has {trained_value}): drop it, or train a model with it"
            )


def evaluate_checkpoint(cfg: DictConfig) -> None:
    """Evaluates a checkpoint on eval.split (its first eval.tokens tokens, or all) and prints
    the result as one JSON line."""
    checkpoint = load_trained(cfg.checkpoint, "model", other="train_rl.py")
    trained = OmegaConf.create(checkpoint["config"])
    given = given_keys(command_line_overrides(), "lm")
    refuse_model_changes(trained, cfg, given)
    use_host(cfg.torch_threads)
    dist = DistInfo()
    base = checkpoint.get("started_in")  # older checkpoints hold absolute paths
    data = load_data(trained.task, dist, None if base is None else Path(base))
    model = trained_model(checkpoint)
    rows = cfg.eval_batch_size if "eval_batch_size" in given else trained.eval_batch_size
    result = evaluate_split(model, data, cfg.eval.split, cfg.eval.tokens, rows, dist)
    result.update(step=checkpoint["step"], checkpoint=str(cfg.checkpoint))
    print(json.dumps(result))


@hydra.main(config_path="configs", config_name="lm", version_base=None)
@exit_on_config_error
def main(cfg: DictConfig) -> None:
    train_or_evaluate(cfg, check_config, train, evaluate_checkpoint)


if __name__ == "__main__":
    register_schemas()
    sys.argv[1:] = checked_command_line(sys.argv[1:], CONFIGS, "lm", check_config)
    main()
