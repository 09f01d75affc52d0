"""What train_rl.py and train_lm.py share: plain helpers a training loop calls.

A loop uses them in this order:

    @hydra.main(...)
    @exit_on_config_error                 # ConfigError -> one line on stderr, exit code 2
    def main(cfg):
        cfg, checkpoint = resumed_run(cfg)  # checkpoint None unless resume; then cfg is
                                          # the saved run's but for RESUMABLE fields given
        check_config(cfg)                 # the trainer's: check_choice / check_positive / ...
        with ExitStack() as resources:    # closes what is opened on every way out
            dist, run_dir = start_run(resources, cfg, checkpoint)  # processes, threads, heap,
                                          # run directory; a resumed run's process count
            seed_everything(rank_seed(cfg.seed, dist.rank))
            if checkpoint:                # ... and load the model and optimizer states
                restore_rng_state(checkpoint["rng"][dist.rank])
            logger = start_logging(resources, run_dir, cfg, dist.is_main, checkpoint)
            bar = resources.enter_context(progress_bar(total, initial=step, enabled=dist.is_main))
            ...  # each log interval: logger.log(all_reduce_mean(metrics, dist), step=step)
            ...  # each checkpoint interval, on every rank (a collective):
            ...  #     gathered = gather_rank_states(dist, model, memory=state.state_dict())
            ...  # then on the main rank only:
            ...  #     save_checkpoint(run_dir, {**gathered, "step": step, "model": ...})
"""

import os

# OpenMP threads waiting for work spin only briefly before they sleep (GNU libgomp's default is
# 300,000 spins): with two runs on the cores, a spinning thread burns the time slice that its
# partner thread needs, and each of two default runs fell to a quarter of its speed alone;
# with 1,000 spins each keeps about half (docs/performance.md). Read once, when torch loads
# OpenMP: set here, before this package imports torch, and the entry scripts import it first.
os.environ.setdefault("GOMP_SPINCOUNT", "1000")

import training.schemas  # noqa: F401  (registers configs/memory/'s schema with Hydra)
from training.checkpoint import (
    BEST_CHECKPOINT_FILE,
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
    check_whole,
    check_writable,
    exit_on_config_error,
    refuse_added_keys,
)
from training.distributed import (
    DistInfo,
    all_gather_object,
    all_reduce_max,
    all_reduce_mean,
    broadcast_object,
    cleanup_distributed,
    gather_parameter_digests,
    resolve_device,
    setup_distributed,
)
from training.files import atomic_open
from training.host import thread_count, use_host
from training.metrics import (
    METRICS_FILE,
    MetricsLogger,
    SpanStats,
    UpdateMeans,
    check_wandb_config,
    read_metrics,
    start_logging,
    truncate_metrics,
)
from training.progress import progress_bar, set_metrics
from training.resume import (
    check_run_dir_argument,
    resume_checkpoint,
    resumed_config,
    resumed_run,
)
from training.run import RunProgress, gather_rank_states, save_report, start_run
from training.run_dir import (
    CONFIG_FILE,
    CURVES_FILE,
    EVAL_FILE,
    command_line_overrides,
    eval_writes_nothing,
    get_run_dir,
    save_resolved_config,
)
from training.seeding import (
    env_seeds,
    rank_seed,
    restore_rng_state,
    rng_state,
    seed_everything,
)

__all__ = [
    "COMPILE_MODES",
    "BEST_CHECKPOINT_FILE",
    "CHECKPOINT_FILE",
    "CONFIG_FILE",
    "CURVES_FILE",
    "EVAL_FILE",
    "METRICS_FILE",
    "ConfigError",
    "DistInfo",
    "MetricsLogger",
    "RunProgress",
    "SpanStats",
    "UpdateMeans",
    "all_gather_object",
    "all_reduce_max",
    "all_reduce_mean",
    "atomic_open",
    "broadcast_object",
    "check_checkpoint_kind",
    "load_trained",
    "check_choice",
    "check_positive",
    "check_positive_int",
    "check_run_dir_argument",
    "checkpoint_file",
    "check_range",
    "check_wandb_config",
    "check_whole",
    "check_writable",
    "cleanup_distributed",
    "command_line_overrides",
    "eval_writes_nothing",
    "env_seeds",
    "exit_on_config_error",
    "gather_parameter_digests",
    "gather_rank_states",
    "get_run_dir",
    "load_checkpoint",
    "progress_bar",
    "rank_seed",
    "read_metrics",
    "refuse_added_keys",
    "resolve_device",
    "restore_rng_state",
    "resume_checkpoint",
    "resumed_config",
    "resumed_run",
    "rng_state",
    "save_checkpoint",
    "save_resolved_config",
    "seed_everything",
    "set_metrics",
    "start_logging",
    "save_report",
    "start_run",
    "use_host",
    "setup_distributed",
    "thread_count",
    "truncate_metrics",
]
