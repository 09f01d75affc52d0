"""Train an actor-critic agent with a memory core: `python train_rl.py env=corridor`.

The loop reads top to bottom: check the config, build the environments and the agent, then
repeat: act for T steps in step mode, recompute the unroll in block mode from the memory
carried over from the previous unroll (BPTT over T), take an update (A2C) or a few (PPO),
log, checkpoint. A finished run evaluates its agent by its most likely actions and by sampled
ones (RUN_DIR/eval.json) and draws its learning curves (RUN_DIR/curves.png). `mode=eval
checkpoint=PATH` runs those episodes instead. Under `torchrun` every rank steps its own
environments and gradients are all-reduced.
"""

from __future__ import annotations

from training.openmp import shorten_openmp_spinning

shorten_openmp_spinning()  # first: OpenMP reads its spin count once, when torch loads it

# ruff: noqa: E402  (the imports below follow that call on purpose)

import json
import logging
import math
import sys
from contextlib import ExitStack
from pathlib import Path

import gymnasium as gym
import hydra
import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from agents import BASELINE_KINDS, ActorCritic
from agents.actor_critic import check_spaces
from agents.anchor import weights_copy
from agents.build import build_agent
from agents.compiled_step import refuse_unchecked_target
from agents.encoders import NORMALISE
from agents.episodes import EpisodeStats
from agents.evaluation import POLICIES, evaluate_policies, record_episode
from agents.losses import ADVANTAGE_SCALES
from agents.play import NonFiniteEnvOutput, Player
from agents.rollout import Unroll, collect_unroll
from agents.update import BEHAVIOUR_RATIO_ERROR, OPTIMIZERS, Learner
from envs.registry import (
    AGENT_INPUT_KEYS,
    NAMED_ENVS,
    env_spaces,
    make_vector_env,
    named_env,
    task_metric,
)
from memory import kind_names
from training.checkpoint import BEST_CHECKPOINT_FILE, load_trained, save_checkpoint
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
from training.distributed import DistInfo, all_reduce_max, all_reduce_mean, resolve_device
from training.divergence import DivergenceGuard, check_nonfinite_config, resume_remedy
from training.entry import checked_command_line, train_or_evaluate
from training.extras import EXTRAS, require
from training.host import thread_count, use_host
from training.metrics import SpanStats, UpdateMeans, check_wandb_config, start_logging
from training.progress import progress_bar, set_metrics
from training.resume import given_keys
from training.run import RunProgress, gather_rank_states, start_run
from training.run_dir import EVAL_FILE, command_line_overrides
from training.schedule import COEF_SCHEDULES, LR_SCHEDULES
from training.schemas import memory_config, register_schemas
from training.seeding import env_seeds, rank_seed, restore_rng_state, seed_everything

LEARNERS = ("a2c", "ppo")
PROGRESS_KEYS = ("return", "success", "rooms_reached", "mmer", "memory_size")
VECTORIZATIONS = ("auto", "sync", "async")
LIST_IDS = "python -c 'import gymnasium; gymnasium.pprint_registry()'"
RECORD_SUFFIXES = (".gif", ".mp4", ".txt")  # eval.record: frames, or an ansi trace
CONFIGS = Path(__file__).parent / "configs"
# Mappings whose keys are free, so `+KEY=VALUE` may add to them: a named env's keyword
# arguments (the env refuses one it does not take), a Gymnasium env's, a memory kind's options.
OPEN_KEYS = ("env", "env.kwargs", "memory.options")

log = logging.getLogger(__name__)


def check_config(cfg: DictConfig) -> None:
    """Reject impossible settings before anything is built. The env checks its id and its
    own keyword arguments as the run makes it, and the agent the env's spaces (`make_envs`):
    an arbitrary Gymnasium env's are known no other way."""
    refuse_added_keys(command_line_overrides(), cfg, CONFIGS, OPEN_KEYS)
    check_choice("mode", cfg.mode, ("train", "eval"))
    thread_count(cfg.torch_threads)  # auto, or a positive number
    for key in ("num_envs", "unroll_len", "total_steps", "log_interval", "checkpoint_interval"):
        check_positive_int(key, cfg[key])
    check_whole("checkpoint_keep", cfg.checkpoint_keep)
    check_whole("seed", cfg.seed)  # (env_seeds draws from NumPy's SeedSequence of it)
    check_wandb_config(cfg.wandb)
    check_nonfinite_config(cfg)
    check_learner(cfg)
    check_env(cfg.env)
    check_memory(cfg.memory)
    check_eval(cfg)


def check_learner(cfg: DictConfig) -> None:
    """The agent's settings, and the memory's that acting and learning must agree on."""
    check_choice("agent", cfg.agent.name, LEARNERS)
    check_choice("agent.optimizer", cfg.agent.optimizer, OPTIMIZERS)
    check_choice("agent.lr_schedule", cfg.agent.lr_schedule, LR_SCHEDULES)
    check_choice("agent.anchor_schedule", cfg.agent.anchor_schedule, COEF_SCHEDULES)
    check_choice("agent.entropy_schedule", cfg.agent.entropy_schedule, COEF_SCHEDULES)
    if cfg.agent.name == "ppo":
        check_choice("agent.advantage_scale", cfg.agent.advantage_scale, ADVANTAGE_SCALES)
    check_positive("agent.lr", cfg.agent.lr)
    if cfg.agent.cut_uniform_coef:  # (it acts once an anchor holds: never without one)
        check_positive("agent.cut_uniform_coef", cfg.agent.cut_uniform_coef)
    greedy_envs = cfg.agent.greedy_envs
    check_whole("agent.greedy_envs", greedy_envs)
    if greedy_envs:
        check_range("agent.greedy_envs", greedy_envs, 0, cfg.num_envs - 1)
        if not cfg.agent.cut_uniform_coef:
            raise ConfigError(
                f"agent.greedy_envs={greedy_envs} acts greedily for the pull out of loops "
                "alone, which is off: set agent.cut_uniform_coef > 0, or agent.greedy_envs=0"
            )
    held_alpha = cfg.agent.held_aux_loss_coef
    if held_alpha is not None:  # (once an anchor holds, for a memory with a span penalty:
        # the Corridor preset sets it for every memory, as it sets memory.attended_span_coef)
        check_range("agent.held_aux_loss_coef", held_alpha, 0)
    held_beta = cfg.agent.held_attended_span_coef
    if held_beta is not None:  # (... and with the attended pull: expire_span)
        check_range("agent.held_attended_span_coef", held_beta, 0)
    if cfg.agent.anchor_coef:
        check_positive("agent.anchor_coef", cfg.agent.anchor_coef)
        check_range("agent.anchor_until", cfg.agent.anchor_until, 0, 1, low_open=True)
        if cfg.agent.anchor_until < 1 and cfg.agent.anchor_schedule != "rate":
            raise ConfigError(
                f"agent.anchor_until={cfg.agent.anchor_until} lets the anchor go as the rate "
                "falls: it needs agent.anchor_schedule=rate"
            )
    for key, train_only in (("dropout", "dropout"), ("memory_shortening", "memory shortening")):
        if cfg.memory.get(key):
            raise ConfigError(
                f"memory.{key}={cfg.memory[key]}: {train_only} acts in training mode only, so "
                "the learner would not see the policy that acted; RL runs without it"
            )
    for key in ("epochs", "minibatches"):
        check_positive_int(f"agent.{key}", cfg.agent[key])
    if cfg.agent.minibatches > cfg.num_envs:
        raise ConfigError(
            f"agent.minibatches={cfg.agent.minibatches} is more than num_envs={cfg.num_envs}: a "
            "minibatch holds whole environment sequences, so use at most one per environment"
        )
    if cfg.compile_learner:
        check_choice("compile_learner", cfg.compile_learner, COMPILE_MODES)
    if cfg.compile_acting:
        try:
            refuse_unchecked_target(resolve_device(cfg.device))
        except RuntimeError as error:
            raise ConfigError(str(error)) from None


def check_env(env_cfg: DictConfig) -> None:
    """The trainer's own env settings: which env, and how a Gymnasium env is batched, seen and
    limited."""
    check_choice("env", env_cfg.name, NAMED_ENVS)
    if named_env(env_cfg.name).any_gym_id:
        check_choice("env.vectorization", env_cfg.vectorization, VECTORIZATIONS)
        check_choice("env.normalise_observations", env_cfg.normalise_observations, NORMALISE)
        if env_cfg.max_episode_steps is not None:
            check_positive_int("env.max_episode_steps", env_cfg.max_episode_steps)


def check_memory(memory_cfg: DictConfig) -> None:
    """The core's settings, from the fields alone: a memory transformer's config checks its
    own (`memory_config`); a recurrent or feed-forward baseline takes a positive dim and
    num_layers."""
    check_choice("memory", memory_cfg.kind, (*kind_names(), *BASELINE_KINDS))
    if memory_cfg.kind in BASELINE_KINDS:
        for key in ("dim", "num_layers"):
            check_positive_int(f"memory.{key}", memory_cfg[key])
    else:
        memory_config(memory_cfg)


def make_envs(env_cfg: DictConfig, num_envs: int) -> gym.vector.VectorEnv:
    """The run's environments, made before the agent: the env checks its id and its own
    keyword arguments as it is made, and the agent its spaces (`check_spaces`); a bad one is a
    config error."""
    any_gym_id = named_env(env_cfg.name).any_gym_id
    try:
        vec_env = make_vector_env(env_cfg, num_envs)
    except (gym.error.UnregisteredEnv, ImportError) as error:
        if isinstance(error, ImportError) and error.name in EXTRAS:
            require(error.name)
        raise ConfigError(
            f"env.id={env_cfg.id} is not a registered Gymnasium id ({error}); list the ids with "
            f"{LIST_IDS}, or give a module that registers it as env.id=MODULE:ID"
        ) from None
    except ValueError as error:
        raise ConfigError(f"env={env_cfg.name}: {error}") from None
    except TypeError as error:  # a keyword argument the env does not take
        where = "env.kwargs" if any_gym_id else "the env.* settings but name and id"
        raise ConfigError(
            f"env={env_cfg.name}: {error}; {where} are the environment's keyword arguments"
        ) from None
    try:
        check_spaces(vec_env.single_observation_space, vec_env.single_action_space)
    except ValueError as error:
        vec_env.close()
        raise ConfigError(f"env.id={env_cfg.id}: {error}") from None
    return vec_env


def check_eval(cfg: DictConfig) -> None:
    """The evaluation settings, and mode=eval's checkpoint."""
    check_positive_int("eval.length_bins", cfg.eval.length_bins)
    check_choice("eval.policy", cfg.eval.policy, tuple(POLICIES))
    for key in ("episodes", "num_envs"):
        check_positive_int(f"eval.{key}", cfg.eval[key])
    if cfg.eval.record:
        check_writable("eval.record", cfg.eval.record)
    if cfg.eval.record and Path(cfg.eval.record).suffix.lower() not in RECORD_SUFFIXES:
        raise ConfigError(
            f"eval.record={cfg.eval.record}: use a .gif, .mp4 or .txt (ansi trace) file"
        )
    if cfg.eval.record and Path(cfg.eval.record).suffix.lower() == ".mp4":
        require("imageio_ffmpeg")
    if cfg.mode == "eval" and cfg.checkpoint is None:
        raise ConfigError("mode=eval needs checkpoint=PATH (a checkpoint file or a run directory)")


def train(cfg: DictConfig, checkpoint: dict | None) -> None:
    """Trains from scratch, or continues the run of ``checkpoint`` (``resumed_run``)."""
    with ExitStack() as resources:  # closed on every way out, exceptions included
        dist, run_dir = start_run(resources, cfg, checkpoint, cfg.num_envs)
        seed_everything(rank_seed(cfg.seed, dist.rank))
        steps_per_update = cfg.num_envs * cfg.unroll_len * dist.world_size
        num_updates = math.ceil(cfg.total_steps / steps_per_update)
        # The paper's tasks end an episode at their step limit; elsewhere a truncated
        # episode's last step bootstraps from the value of its final observation.
        bootstrap_truncated = not named_env(cfg.env.name).step_limit_ends_episode
        gym_path = named_env(cfg.env.name).any_gym_id

        vec_env = make_envs(cfg.env, cfg.num_envs)
        resources.callback(vec_env.close)
        if cfg.agent.cut_uniform_coef and isinstance(vec_env.single_action_space, gym.spaces.Box):
            raise ConfigError(
                f"agent.cut_uniform_coef={cfg.agent.cut_uniform_coef} pulls towards the uniform "
                f"policy, which the Box actions of env.id={cfg.env.id} do not have: set it to 0"
            )
        agent = build_agent(cfg, vec_env.single_observation_space, vec_env.single_action_space)
        agent.to(dist.device)
        learner = Learner(agent, cfg.agent, num_updates, dist, cfg.compile_learner or None)
        player = Player(vec_env, agent, EpisodeStats(cfg.num_envs, cfg.env.name))
        player.reset(env_seeds(cfg.seed, dist.rank, cfg.num_envs, "train", stream_step(checkpoint)))
        unroll = Unroll(player, cfg.unroll_len)
        span_stats = SpanStats()
        skipping = cfg.nonfinite == "skip"
        interval = UpdateMeans(maxima=[BEHAVIOUR_RATIO_ERROR], count_skipped=skipping)
        progress = RunProgress()
        if checkpoint is not None:
            progress = restore(checkpoint, dist.rank, learner, player, span_stats, interval)
        player.played = progress.update * cfg.unroll_len  # (an unroll plays unroll_len steps)
        lower = "agent.lr=... agent.max_grad_norm=..."
        remedy = resume_remedy("train_rl.py", run_dir, cfg, checkpoint, lower)
        guard = DivergenceGuard(cfg, agent, learner.optimizer, dist, run_dir, remedy)
        if learner.anchored:
            learner.anchor.start(player.state)
        # The weights this logging interval began with: their policy played it, so they are
        # what its success measured (best.pt and the anchor), not the weights after its updates.
        interval_start = (checkpoint or {}).get("interval_start") or weights_copy(agent)
        logger = start_logging(resources, run_dir, cfg, dist.is_main, checkpoint)
        bar = resources.enter_context(
            progress_bar(
                num_updates * steps_per_update,
                initial=progress.update * steps_per_update,
                enabled=dist.is_main,
            )
        )

        for update in range(progress.update, num_updates):
            try:
                greedy = learner.greedy_envs(cfg.num_envs)
                collect_unroll(agent, player, unroll, span_stats, bootstrap_truncated, greedy)
            except NonFiniteEnvOutput as error:
                step = error.played * cfg.num_envs * dist.world_size
                raise error.at_step(cfg.env.id, step) from None
            guard.begin()
            means = learner.update(unroll, update)
            progress.update, progress.step = update + 1, (update + 1) * steps_per_update
            means["memory_size"] = unroll.memory_size
            if guard.end(means, progress.update, progress.step):  # skipped: undone
                interval.skip(means, steps_per_update)
            else:
                interval.add(means, steps_per_update)
            bar.update(steps_per_update)
            last = update + 1 == num_updates
            if progress.update % cfg.log_interval == 0 or last:
                metrics = interval_metrics(
                    interval, span_stats, player.stats, learner, progress.update, dist
                )
                if gym_path:  # POPGym's MMER: the best interval mean return so far
                    progress.mmer = float(np.fmax(progress.mmer, metrics["return"]))  # NaN: none
                    metrics["mmer"] = progress.mmer
                logger.log(metrics, step=progress.step)
                set_metrics(bar, {k: metrics[k] for k in PROGRESS_KEYS if k in metrics})
                keep_best(cfg, metrics, interval_start, learner, player, progress, run_dir, dist)
                interval_start = weights_copy(agent)
            if progress.update % cfg.checkpoint_interval == 0 or last:
                save_training(
                    cfg,
                    learner,
                    player,
                    span_stats,
                    interval,
                    interval_start,
                    progress,
                    run_dir,
                    dist,
                )
        bar.close()
        if cfg.eval.after_training and dist.is_main:
            report_trained_agent(agent, cfg, run_dir)


def stream_step(checkpoint: dict | None) -> int:
    """The step whose streams the training environments start on: 0, unless the run resumes
    at a step its environments saved no state for (a Gymnasium vector env, POPGym's); then
    new streams, so that it replays no episode, though it is not bit for bit the unbroken run."""
    if checkpoint is None or all(acting["envs"] is not None for acting in checkpoint["acting"]):
        return 0
    log.warning(
        "the environments saved no state: they continue on new streams drawn for step %d",
        checkpoint["step"],
    )
    return checkpoint["step"]


def restore(
    checkpoint: dict,
    rank: int,
    learner: Learner,
    player: Player,
    span_stats: SpanStats,
    interval: UpdateMeans,
) -> RunProgress:
    """Loads ``checkpoint`` into the objects a fresh run built; returns its progress."""
    learner.load_state_dict(checkpoint)
    restore_rng_state(checkpoint["rng"][rank])
    acting = checkpoint["acting"][rank]
    progress = RunProgress(checkpoint["update"], checkpoint["step"], acting["mmer"])
    progress.best = checkpoint["best"]
    if acting["envs"] is None:  # (environments without a state_dict: `train` reseeds them)
        return progress
    player.load_state_dict(acting, learner.agent.core)
    if learner.anchored:
        learner.anchor.load_memory(acting["anchor_memory"], player.device)
    span_stats.load_state_dict(acting["spans"])
    interval.load_state_dict(acting["interval"])
    return progress


def interval_metrics(
    interval: UpdateMeans,
    span_stats: SpanStats,
    episodes: EpisodeStats,
    learner: Learner,
    update: int,
    dist: DistInfo,
) -> dict[str, float]:
    """The logging interval's line: means over its updates and its episodes, averaged over
    ranks (a collective: every rank calls it)."""
    metrics = interval.summary()
    metrics[BEHAVIOUR_RATIO_ERROR] = all_reduce_max(metrics[BEHAVIOUR_RATIO_ERROR], dist)
    metrics.update(episodes.summary())
    metrics.update(span_stats.summary())
    metrics.update(update=update, lr=learner.optimizer.param_groups[0]["lr"])
    return all_reduce_mean(metrics, dist)


def keep_best(
    cfg: DictConfig,
    metrics: dict[str, float],
    played: dict[str, torch.Tensor],
    learner: Learner,
    player: Player,
    progress: RunProgress,
    run_dir: Path,
    dist: DistInfo,
) -> None:
    """At a new best interval (of the task metric), keeps the agent that played it, its weights
    ``played`` at the interval's start, beside the last one (RUN_DIR/best.pt; the same on every
    rank: the metrics are averaged over ranks), and the KL anchor at it; with
    agent.anchor_follows, the anchor at every interval that holds (`PolicyAnchor.see`)."""
    best = progress.best
    metric = best["metric"] if best else task_metric(cfg.env.name, [metrics])
    value = metrics[metric]
    if math.isnan(value):
        return
    new_best = best is None or value > best["value"]
    if learner.anchor is not None:
        learner.anchor.see(value, played, player.state, new_best)
    if not new_best:
        return
    progress.best = {"metric": metric, "value": value, "step": progress.step}
    if dist.is_main:
        model = {"agent": played, "step": progress.step}
        model.update(best=progress.best, config=OmegaConf.to_container(cfg, resolve=True))
        save_checkpoint(run_dir, model, filename=BEST_CHECKPOINT_FILE)


def save_training(
    cfg: DictConfig,
    learner: Learner,
    player: Player,
    span_stats: SpanStats,
    interval: UpdateMeans,
    interval_start: dict[str, torch.Tensor],
    progress: RunProgress,
    run_dir: Path,
    dist: DistInfo,
) -> None:
    """RUN_DIR/checkpoint.pt: the learner, the progress, the weights the logging interval began
    with and what each rank's acting carries to the next update (a collective: every rank takes
    part), which `restore` loads."""
    anchor_memory = learner.anchor.memory_state_dict() if learner.anchored else None
    acting = {
        **player.state_dict(learner.agent.core),
        "anchor_memory": anchor_memory,
        "mmer": progress.mmer,
        "spans": span_stats.state_dict(),
        "interval": interval.state_dict(),
    }
    gathered = gather_rank_states(dist, learner.agent, acting=acting)
    if dist.is_main:
        state = {**gathered, **learner.state_dict(), "update": progress.update}
        state.update(step=progress.step, best=progress.best, interval_start=interval_start)
        state["config"] = OmegaConf.to_container(cfg, resolve=True)
        save_checkpoint(run_dir, state, keep_last=cfg.checkpoint_keep)


def report_trained_agent(agent: ActorCritic, cfg: DictConfig, run_dir: Path) -> None:
    """A finished run's report (`analysis.report`): RUN_DIR/eval.json, the trained agent's
    evaluation by each policy of eval.policy (`evaluate_policies`), and RUN_DIR/curves.png,
    its learning curves; then a line per policy."""
    result = evaluate_policies(agent, cfg.env, cfg.eval, cfg.seed)
    from analysis.report import report_rl_run  # (matplotlib: imported once a run ends)

    metric = report_rl_run(run_dir, cfg, result)
    for policy, outcome in result.items():
        log.info(
            "%s %s: %.3f over %d episodes (%s)",
            policy,
            metric,
            outcome.get(metric, math.nan),
            outcome["episodes"],
            run_dir / EVAL_FILE,
        )


def evaluated_config(trained: DictConfig, cfg: DictConfig) -> DictConfig:
    """The trained run's config with the env fields this command changes (mode=eval of an
    agent on, say, longer corridors or another step limit). A change to the agent (`memory.*`,
    `agent.*`) or to what it sees (the env's name, id, the agent's inputs, its spaces) is
    refused in one line."""
    evaluated = trained.copy()
    for key in given_keys(command_line_overrides(), "rl"):
        value, trained_value = OmegaConf.select(cfg, key), OmegaConf.select(trained, key)
        group, _, field = key.partition(".")
        if value == trained_value or group not in ("env", "memory", "agent"):
            continue
        if group != "env" or field.split(".")[0] in ("name", "id", *AGENT_INPUT_KEYS):
            raise ConfigError(
                f"mode=eval plays {cfg.checkpoint} as it was trained, but {key}={value} (the "
                f"agent has {trained_value}): drop it, or train an agent with it"
            )
        OmegaConf.update(evaluated, key, value, force_add=True)
    if evaluated.env != trained.env:
        played, seen = (env_spaces(env_cfg) for env_cfg in (evaluated.env, trained.env))
        if played != seen:
            raise ConfigError(
                f"mode=eval: the env fields given change what {cfg.checkpoint} sees or does "
                f"(observation and action spaces {played}; the agent's {seen}): drop them"
            )
    return evaluated


def evaluate(cfg: DictConfig) -> None:
    """Runs episodes with a trained agent and prints their outcome as one JSON line; with
    `eval.record=FILE` also writes one episode as a GIF/MP4 (rgb frames) or text (ansi)."""
    checkpoint = load_trained(cfg.checkpoint, "agent", other="train_lm.py")
    trained = evaluated_config(OmegaConf.create(checkpoint["config"]), cfg)
    if cfg.eval.keep_marked and trained.memory.kind != "expire_span":
        raise ConfigError(
            f"eval.keep_marked sets expire-spans, but {cfg.checkpoint} is a "
            f"memory={trained.memory.kind} agent; drop eval.keep_marked"
        )
    use_host(cfg.torch_threads)
    agent = build_agent(trained, *env_spaces(trained.env))
    agent.load_state_dict(checkpoint["agent"])
    result: dict = evaluate_policies(agent, trained.env, cfg.eval, cfg.seed)
    result["checkpoint"] = str(cfg.checkpoint)
    if cfg.eval.record:  # an episode of the first policy evaluated
        greedy = POLICIES[cfg.eval.policy][0] == "greedy"
        path = Path(cfg.eval.record)
        result["record"] = record_episode(agent, trained.env, path, cfg.seed, greedy)
    print(json.dumps(result))


@hydra.main(config_path="configs", config_name="rl", version_base=None)
@exit_on_config_error
def main(cfg: DictConfig) -> None:
    train_or_evaluate(cfg, check_config, train, evaluate)


if __name__ == "__main__":
    register_schemas()
    sys.argv[1:] = checked_command_line(sys.argv[1:], CONFIGS, "rl", check_config)
    main()
