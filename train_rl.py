"""Train an actor-critic agent with a memory core: `python train_rl.py env=corridor`.

The loop reads top to bottom: check the config, build the environments and the agent, then
repeat: act for T steps in step mode, recompute the unroll in block mode from the memory
carried over from the previous unroll (BPTT over T), take an update (A2C) or a few (PPO),
log, checkpoint. A finished run evaluates its agent greedily (RUN_DIR/eval.json) and draws
its learning curves (RUN_DIR/curves.png). `mode=eval checkpoint=PATH` runs greedy episodes
instead. Under `torchrun` every rank steps its own environments and gradients are all-reduced.
"""

from __future__ import annotations

import gc
import json
import logging
import math
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import gymnasium as gym
import hydra
import numpy as np
import torch
from gymnasium.vector.utils import concatenate, create_empty_array
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel

from agents import RECURRENT_KINDS, ActorCritic, map_observation
from agents.build import build_agent, build_core
from agents.episodes import (
    EpisodeStats,
    after_step,
    episode_info,
    resets_next_step,
    to_device,
)
from agents.evaluation import evaluate_agent, record_episode
from agents.learners import (
    ADVANTAGE_SCALES,
    ALL,
    LR_SCHEDULES,
    LossTerms,
    PolicyAnchor,
    actor_critic_loss,
    behaviour_ratio_error,
    generalized_advantages,
    lr_fraction,
    make_optimizer,
    masked_mean,
    minibatches,
    normalised,
    policy_kl,
    ppo_loss,
)
from analysis.curves import plot_curves, run_label
from envs.registry import NAMED_ENVS, make_env, make_vector_env, named_env, task_metric
from memory import kind_names
from training import (
    BEST_CHECKPOINT_FILE,
    CURVES_FILE,
    EVAL_FILE,
    METRICS_FILE,
    ConfigError,
    SpanStats,
    all_reduce_max,
    all_reduce_mean,
    atomic_open,
    check_checkpoint_kind,
    check_choice,
    check_positive,
    check_positive_int,
    check_run_dir_argument,
    check_wandb_config,
    check_whole,
    check_writable,
    describe_preset,
    eval_writes_nothing,
    exit_on_config_error,
    gather_rank_states,
    load_checkpoint,
    progress_bar,
    rank_seed,
    read_metrics,
    restore_rng_state,
    resumed_run,
    save_checkpoint,
    seed_everything,
    set_metrics,
    start_logging,
    start_run,
    thread_count,
    use_host,
)

LEARNERS = ("a2c", "ppo")
PROGRESS_KEYS = ("return", "success", "rooms_reached", "mmer", "memory_size")
VECTORIZATIONS = ("auto", "sync", "async")
LIST_IDS = "python -c 'import gymnasium; gymnasium.pprint_registry()'"
RECORD_SUFFIXES = (".gif", ".mp4", ".txt")  # eval.record: frames, or an ansi trace
LOSS_KEYS = ("policy_loss", "value_loss", "entropy", "aux_loss", "anchor_kl")  # update means
# Logged as means over the interval's updates: the losses, the memory size, the KL of the last
# epoch (PPO: KL(acting || current policy); 0 for A2C) and the epochs run per unroll (fewer
# than agent.epochs when agent.target_kl stopped them).
INTERVAL_MEANS = ("memory_size", *LOSS_KEYS, "approx_kl", "epochs")
# The largest |pi_learner / pi_acting - 1| of any unroll's first minibatch, before its first
# update: 0 up to float error when the learner starts from the policy that acted.
BEHAVIOUR_RATIO_ERROR = "behaviour_ratio_error"
CONFIGS = Path(__file__).parent / "configs"

log = logging.getLogger(__name__)


def check_config(cfg: DictConfig) -> None:
    """Reject impossible settings before any work is done."""
    check_choice("mode", cfg.mode, ("train", "eval"))
    check_choice("env", cfg.env.name, NAMED_ENVS)
    env = named_env(cfg.env.name)
    thread_count(cfg.torch_threads)  # auto, or a positive number
    check_choice("agent", cfg.agent.name, LEARNERS)
    check_choice("agent.optimizer", cfg.agent.optimizer, ("rmsprop", "adam", "amsgrad"))
    check_choice("agent.lr_schedule", cfg.agent.get("lr_schedule", "constant"), LR_SCHEDULES)
    if cfg.agent.name == "ppo":
        check_choice("agent.advantage_scale", cfg.agent.advantage_scale, ADVANTAGE_SCALES)
    for key in ("num_envs", "unroll_len", "total_steps", "log_interval", "checkpoint_interval"):
        check_positive_int(key, cfg[key])
    check_whole("checkpoint_keep", cfg.checkpoint_keep)
    check_positive("agent.lr", cfg.agent.lr)
    check_positive("agent.span_lr_scale", cfg.agent.span_lr_scale)
    if cfg.agent.get("anchor_coef", 0):
        check_positive("agent.anchor_coef", cfg.agent.anchor_coef)
        if "success" not in env.outcomes or env.any_gym_id:
            raise ConfigError(
                f"agent.anchor_coef needs an env that reports success (its anchor_from is a "
                f"success rate), and env={cfg.env.name} does not; drop agent.anchor_coef"
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
    check_wandb_config(cfg.wandb)
    if env.any_gym_id:
        check_choice("env.vectorization", cfg.env.vectorization, VECTORIZATIONS)
        if cfg.env.max_episode_steps is not None:
            check_positive_int("env.max_episode_steps", cfg.env.max_episode_steps)
    try:  # the env checks its id and its own keyword arguments
        single = make_env(cfg.env)
        single.close()
    except (gym.error.UnregisteredEnv, ImportError) as error:
        raise ConfigError(
            f"env.id={cfg.env.id} is not a registered Gymnasium id ({error}); list the ids with "
            f"{LIST_IDS}, or give a module that registers it as env.id=MODULE:ID"
        ) from None
    except ValueError as error:
        raise ConfigError(f"env={cfg.env.name}: {error}") from None
    except TypeError as error:  # a keyword argument the env does not take
        where = "env.kwargs" if env.any_gym_id else "the env.* settings but name and id"
        raise ConfigError(
            f"env={cfg.env.name}: {error}; {where} are the environment's keyword arguments"
        ) from None
    check_positive_int("eval.length_bins", cfg.eval.length_bins)
    for key in ("episodes", "num_envs"):
        check_positive_int(f"eval.{key}", cfg.eval[key])
    if cfg.eval.record:
        check_writable("eval.record", cfg.eval.record)
    if cfg.eval.record and Path(cfg.eval.record).suffix.lower() not in RECORD_SUFFIXES:
        raise ConfigError(
            f"eval.record={cfg.eval.record}: use a .gif, .mp4 or .txt (ansi trace) file"
        )
    if cfg.mode == "eval" and cfg.checkpoint is None:
        raise ConfigError("mode=eval needs checkpoint=PATH (a checkpoint file or a run directory)")
    check_choice("memory", cfg.memory.kind, (*kind_names(), *RECURRENT_KINDS))
    try:
        build_core(cfg.memory)  # the memory config checks its own fields
    except ValueError as error:
        raise ConfigError(str(error)) from None
    try:  # the agent checks the env's observation and action spaces
        build_agent(cfg, single.observation_space, single.action_space)
    except ValueError as error:
        raise ConfigError(f"env.id={cfg.env.id}: {error}") from None


def final_values(
    agent: ActorCritic,
    vec_env: gym.vector.VectorEnv,
    final_obs: np.ndarray,
    truncated: np.ndarray,
    state: Any,
    previous: tuple[torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """The values of the final observations ``final_obs`` of the episodes ``truncated`` (B,) by
    a step limit, each read with the memory ``state`` it had before its env reset."""
    space = vec_env.single_observation_space
    obs = concatenate(space, list(final_obs), create_empty_array(space, len(final_obs)))
    device = previous[1].device
    index = torch.as_tensor(np.flatnonzero(truncated), device=device)
    continuing = torch.zeros(len(index), dtype=torch.bool, device=device)
    chosen = tuple(x[index] for x in previous)
    # (greedy: no sample is drawn, so the random streams are those of a run without limit)
    obs = to_device(obs, device)
    _, _, value, _ = agent.act(obs, state.select(index), continuing, chosen, greedy=True)
    return value


def learner_loss(
    agent_cfg: DictConfig, logits, values, actions, old_log_probs, advantages, returns, mask
) -> LossTerms:
    if agent_cfg.name == "ppo":
        clip = agent_cfg.clip
        return ppo_loss(logits, values, actions, old_log_probs, advantages, returns, clip, mask)
    return actor_critic_loss(logits, values, actions, advantages, returns, mask)


def train(cfg: DictConfig, checkpoint: dict | None) -> None:
    """Trains from scratch, or continues the run of ``checkpoint`` (``resumed_run``)."""
    with ExitStack() as resources:  # closed on every way out, exceptions included
        dist, run_dir = start_run(resources, cfg, checkpoint)
        if dist.is_main:
            log.info(describe_preset(cfg, CONFIGS))
        seed_everything(rank_seed(cfg.seed, dist.rank))
        B, T = cfg.num_envs, cfg.unroll_len
        steps_per_update = B * T * dist.world_size
        num_updates = math.ceil(cfg.total_steps / steps_per_update)

        vec_env = make_vector_env(cfg.env, B)
        resources.callback(vec_env.close)
        next_step = resets_next_step(vec_env)
        # The paper's tasks end an episode at their step limit; elsewhere a truncated
        # episode's last step bootstraps from the value of its final observation.
        bootstrap_truncated = not named_env(cfg.env.name).step_limit_ends_episode
        obs, _ = vec_env.reset(seed=rank_seed(cfg.seed, dist.rank))
        agent = build_agent(cfg, vec_env.single_observation_space, vec_env.single_action_space)
        agent.to(dist.device)
        state = agent.initial_state(B, dist.device)
        ddp_agent = (  # (the agent itself in a single process)
            DistributedDataParallel(agent, broadcast_buffers=False)
            if dist.world_size > 1
            else agent
        )
        optimizer = make_optimizer(
            agent, cfg.agent.optimizer, cfg.agent.lr, cfg.agent.span_lr_scale
        )
        base_lrs = [group["lr"] for group in optimizer.param_groups]  # before a resume's state
        # A KL penalty towards the best agent once it solved the task (agent.anchor_coef;
        # runs saved before it existed had none).
        anchor_coef, anchor = cfg.agent.get("anchor_coef", 0.0), None
        if anchor_coef:
            anchor = PolicyAnchor(agent, cfg.agent.anchor_from)

        first_update, best = 0, None  # best: the best logged task metric, {metric, value, step}
        if checkpoint is not None:
            agent.load_state_dict(checkpoint["agent"])
            optimizer.load_state_dict(checkpoint["optimizer"])
            restore_rng_state(checkpoint["rng"][dist.rank])
            first_update, best = checkpoint["update"], checkpoint.get("best")
            if anchor is not None and "anchor" in checkpoint:
                anchor.model.load_state_dict(checkpoint["anchor"])
                anchor.active = True
        logger = start_logging(resources, run_dir, cfg, dist.is_main, checkpoint)
        progress = resources.enter_context(
            progress_bar(
                num_updates * steps_per_update,
                initial=first_update * steps_per_update,
                enabled=dist.is_main,
            )
        )

        device = dist.device
        obs = to_device(obs, device)  # a tensor, or a tuple or dict of them (Tuple, Dict)
        obs_buf = map_observation(lambda x: x.new_zeros((B, T, *x.shape[1:])), obs)
        action_shape = vec_env.single_action_space.shape  # (components,) for MultiDiscrete
        actions = torch.zeros((B, T, *action_shape), dtype=torch.long, device=device)
        log_probs, values, rewards, dones = (torch.zeros((B, T), device=device) for _ in range(4))
        # V(final observation) of the steps that truncated an episode (else 0)
        truncation_values = torch.zeros((B, T), device=device)
        starts = torch.zeros((B, T), dtype=torch.bool, device=device)
        # False for the reset steps of a next-step env: their action was not taken
        valid = torch.ones((B, T), dtype=torch.bool, device=device)

        episode_start = torch.ones(B, dtype=torch.bool, device=device)
        resetting = np.zeros(B, dtype=bool)  # next-step envs: this step starts a new episode
        previous = (actions[:, 0].clone(), rewards[:, 0].clone())  # the last action and reward
        gym_path = named_env(cfg.env.name).any_gym_id
        mmer = math.nan  # POPGym's MMER: the best interval mean return so far (gym path)
        stats = EpisodeStats(B, cfg.env.name)
        span_stats = SpanStats()
        interval = dict.fromkeys(INTERVAL_MEANS, 0.0)
        interval[BEHAVIOUR_RATIO_ERROR] = 0.0  # the largest of the interval's updates
        interval_start, updates_in_interval = time.perf_counter(), 0
        acting = checkpoint.get("acting") if checkpoint is not None else None
        if acting is not None:
            mmer = acting[dist.rank].get("mmer", math.nan)
        if acting is not None and acting[dist.rank]["envs"] is not None:  # continue the episodes
            saved = acting[dist.rank]
            vec_env.load_state_dict(as_arrays(saved["envs"]))
            obs, episode_start = to_device(saved["obs"], device), saved["episode_start"].to(device)
            previous = tuple(x.to(device) for x in saved["previous"])
            resetting = saved["resetting"].numpy().copy()
            state = type(state).from_state_dict(saved["memory"], device)
            if anchor is not None and anchor.active:
                anchor.state = type(state).from_state_dict(saved["anchor_memory"], device)
            stats.load_state_dict(saved["episodes"])
            span_stats.load_state_dict(saved["spans"])
            interval, updates_in_interval = saved["interval"], saved["updates_in_interval"]
        elif checkpoint is not None:  # (environments without a state_dict)
            log.warning("the environments restart from their seeds: the run replays episodes")
        if anchor is not None and anchor.active and anchor.state is None:
            anchor.state = anchor.model.core.refresh(state)

        for update in range(first_update, num_updates):
            # Act for T steps in step mode, from the carried memory read with the current
            # weights, as the learner will read it; remember the memory the unroll starts from.
            agent.eval()
            state = agent.core.refresh(state)
            unroll_state, unroll_previous = state, previous
            memory_size = 0.0
            truncation_values.zero_()
            for t in range(T):
                store_step(obs_buf, t, obs)
                starts[:, t] = episode_start
                valid[:, t] = torch.as_tensor(~resetting, device=device)
                action, log_probs[:, t], values[:, t], out = agent.act(
                    obs, state, episode_start, previous
                )
                actions[:, t] = action
                memory_size += out.memory_size
                span_stats.add(out.spans)
                next_obs, reward, terminated, truncated, info = vec_env.step(action.cpu().numpy())
                ended = terminated | truncated
                stats.record(reward, ended, episode_info(info, next_step), counted=~resetting)
                reward = torch.as_tensor(reward, dtype=torch.float32, device=device)
                cut = truncated & ~terminated & bootstrap_truncated
                if next_step:  # bootstrapped from the reset step's value, after the unroll
                    truncation_values[:, t] = torch.as_tensor(cut, device=device)
                elif cut.any():
                    truncation_values[cut, t] = final_values(
                        agent, vec_env, info["final_obs"][cut], cut, out.state, (action, reward)
                    )
                rewards[:, t] = reward
                dones[:, t] = torch.as_tensor(ended | resetting, device=device)
                state, obs, previous = out.state, to_device(next_obs, device), (action, reward)
                starting, resetting = after_step(ended, resetting, next_step)
                episode_start = torch.as_tensor(starting, device=device)
            # The bootstrap value (its state is not kept).
            _, _, bootstrap_value, _ = agent.act(obs, state, episode_start, previous)
            if next_step:  # a reset step acted on the final observation of the episode before
                next_values = torch.cat([values[:, 1:], bootstrap_value[:, None]], dim=1)
                truncation_values.mul_(next_values)

            # Learn in block mode over the unroll.
            agent.train()
            advantages, returns = generalized_advantages(
                rewards,
                values,
                dones,
                bootstrap_value,
                cfg.agent.gamma,
                cfg.agent.gae_lambda,
                truncation_values,
            )
            mask = None if bool(valid.all()) else valid
            if cfg.agent.name == "ppo":
                advantages = normalised(advantages, returns, cfg.agent.advantage_scale, mask)
            # What the agent saw before each step: the unroll's actions and rewards, shifted.
            previous_actions, previous_rewards = (
                torch.cat([first[:, None], later[:, :-1]], dim=1)
                for first, later in zip(unroll_previous, (actions, rewards), strict=True)
            )
            # (runs saved before agent.lr_schedule existed had a constant rate)
            fraction = lr_fraction(cfg.agent.get("lr_schedule", "constant"), update, num_updates)
            for group, base_lr in zip(optimizer.param_groups, base_lrs, strict=True):
                group["lr"] = base_lr * fraction
            anchored = anchor is not None and anchor.active
            if anchored:  # the anchor's policy on the whole unroll, once, from its own memory
                anchor_logits = anchor.policy(obs_buf, starts, (previous_actions, previous_rewards))
            losses = dict.fromkeys(LOSS_KEYS, torch.zeros((), device=device))
            epochs_run, minibatches_run, ratio_error = 0, 0, 0.0
            for _ in range(cfg.agent.epochs):
                epochs_run, epoch_kl = epochs_run + 1, 0.0
                for index in minibatches(B, cfg.agent.minibatches):
                    start = unroll_state if index is ALL else unroll_state.select(index)
                    logits, new_values, out = ddp_agent(
                        select_envs(obs_buf, index),
                        start,
                        starts[index],
                        (previous_actions[index], previous_rewards[index]),
                    )
                    minibatch_mask = None if mask is None else mask[index]
                    if minibatches_run == 0:  # before the unroll's first optimiser step
                        ratio_error = behaviour_ratio_error(
                            logits, actions[index], log_probs[index], minibatch_mask
                        )
                    terms = learner_loss(
                        cfg.agent,
                        logits,
                        new_values,
                        actions[index],
                        log_probs[index],
                        advantages[index],
                        returns[index],
                        minibatch_mask,
                    )
                    loss = terms.total(cfg.agent.value_coef, cfg.agent.entropy_coef) + out.aux_loss
                    anchor_kl = torch.zeros((), device=device)
                    if anchored:
                        reference = select_envs(anchor_logits, index)
                        anchor_kl = masked_mean(policy_kl(logits, reference), minibatch_mask)
                        loss = loss + anchor_coef * anchor_kl
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                    if cfg.agent.max_grad_norm:
                        torch.nn.utils.clip_grad_norm_(agent.parameters(), cfg.agent.max_grad_norm)
                    optimizer.step()
                    minibatches_run += 1
                    for key, value in zip(
                        LOSS_KEYS,
                        (terms.policy, terms.value, terms.entropy, out.aux_loss, anchor_kl),
                        strict=True,
                    ):
                        losses[key] = losses[key] + value.detach()  # summed without a sync
                    if terms.approx_kl is not None:
                        epoch_kl += terms.approx_kl.detach() / cfg.agent.minibatches  # no sync
                # PPO: stop this unroll's epochs once the policy is target_kl away from the one
                # that acted (decided on the mean over ranks, so that all ranks stop together).
                target_kl = cfg.agent.get("target_kl")
                if target_kl and all_reduce_mean({"kl": float(epoch_kl)}, dist)["kl"] > target_kl:
                    break

            update_means = {key: float(value) / minibatches_run for key, value in losses.items()}
            update_means.update(
                memory_size=memory_size / T, approx_kl=float(epoch_kl), epochs=epochs_run
            )
            for key, value in update_means.items():
                interval[key] = interval.get(key, 0.0) + value  # (resumed: a key may be new)
            interval[BEHAVIOUR_RATIO_ERROR] = max(interval[BEHAVIOUR_RATIO_ERROR], ratio_error)
            updates_in_interval += 1
            step = (update + 1) * steps_per_update
            progress.update(steps_per_update)

            if (update + 1) % cfg.log_interval == 0 or update + 1 == num_updates:
                elapsed = time.perf_counter() - interval_start
                metrics = {key: value / updates_in_interval for key, value in interval.items()}
                metrics[BEHAVIOUR_RATIO_ERROR] = all_reduce_max(
                    interval[BEHAVIOUR_RATIO_ERROR], dist
                )
                metrics.update(stats.summary())
                metrics.update(span_stats.summary())
                metrics.update(
                    update=update + 1,
                    sps=updates_in_interval * steps_per_update / elapsed,
                    lr=optimizer.param_groups[0]["lr"],
                )
                metrics = all_reduce_mean(metrics, dist)  # a collective: every rank logs here
                if gym_path:
                    metrics["mmer"] = mmer = float(np.fmax(mmer, metrics["return"]))  # NaN: none
                logger.log(metrics, step=step)
                set_metrics(progress, {k: metrics[k] for k in PROGRESS_KEYS if k in metrics})
                # Keep the model of the best interval so far beside the last one (the same on
                # every rank: the metrics are averaged over ranks).
                metric = best["metric"] if best else task_metric(cfg.env.name, [metrics])
                value = metrics[metric]
                if not math.isnan(value) and (best is None or value > best["value"]):
                    best = {"metric": metric, "value": value, "step": step}
                    if anchor is not None:  # (the env reports success: check_config)
                        anchor.keep(agent, metrics["success"], state)
                    if dist.is_main:
                        model = {"agent": agent.state_dict(), "step": step, "best": best}
                        model["config"] = OmegaConf.to_container(cfg, resolve=True)
                        save_checkpoint(run_dir, model, filename=BEST_CHECKPOINT_FILE)
                interval = dict.fromkeys(interval, 0.0)
                interval_start, updates_in_interval = time.perf_counter(), 0
            if (update + 1) % cfg.checkpoint_interval == 0 or update + 1 == num_updates:
                # Every rank takes part: what each rank's acting carries over is gathered.
                exact_envs = hasattr(vec_env, "state_dict")  # a user's env may have none
                anchored = anchor is not None and anchor.active
                carried = {
                    "envs": as_tensors(vec_env.state_dict()) if exact_envs else None,
                    "obs": map_observation(torch.Tensor.cpu, obs),
                    "episode_start": episode_start.cpu(),
                    "resetting": torch.from_numpy(resetting.copy()),
                    "previous": [x.cpu() for x in previous],
                    "mmer": mmer,
                    "memory": state.state_dict(),
                    "anchor_memory": anchor.state.state_dict() if anchored else None,
                    "episodes": stats.state_dict(),
                    "spans": span_stats.state_dict(),
                    "interval": dict(interval),
                    "updates_in_interval": updates_in_interval,
                }
                gathered = gather_rank_states(dist, agent, acting=carried)
                if dist.is_main:
                    save_checkpoint(
                        run_dir,
                        keep_last=cfg.checkpoint_keep,
                        state={
                            **gathered,
                            "agent": agent.state_dict(),
                            "optimizer": optimizer.state_dict(),
                            "update": update + 1,
                            "step": step,
                            "best": best,
                            "config": OmegaConf.to_container(cfg, resolve=True),
                            **({"anchor": anchor.model.state_dict()} if anchored else {}),
                        },
                    )
        progress.close()
        if cfg.eval.after_training and dist.is_main:
            report_trained_agent(agent, cfg, run_dir)


def report_trained_agent(agent: ActorCritic, cfg: DictConfig, run_dir: Path) -> None:
    """What a finished run leaves besides its checkpoints: RUN_DIR/eval.json, the trained
    agent's evaluation (`evaluate_agent`, with the eval settings), and RUN_DIR/curves.png, its
    learning curves (`python -m analysis.curves`)."""
    result = evaluate_agent(agent, cfg.env, cfg.eval, cfg.seed)
    with atomic_open(run_dir / EVAL_FILE, "w") as file:
        json.dump(result, file)
    records = read_metrics(run_dir / METRICS_FILE)
    metric = task_metric(cfg.env.name, records)
    runs = [(run_label(cfg), metric, records)]
    with atomic_open(run_dir / CURVES_FILE, "wb") as file:
        plot_curves(runs).savefig(file, format="png", dpi=110)
    policy = "greedy" if cfg.eval.greedy else "sampled"
    log.info(
        "%s %s: %.3f over %d episodes (%s)",
        policy,
        metric,
        result.get(metric, math.nan),
        result["episodes"],
        run_dir / EVAL_FILE,
    )


def store_step(obs_buf: Any, t: int, obs: Any) -> None:
    """obs_buf[:, t] = obs, for each tensor of a structured observation."""
    map_observation(lambda buffer, x: buffer[:, t].copy_(x), obs_buf, obs)


def select_envs(obs: Any, index: Any) -> Any:
    """obs[index]: the observations of some environments (a minibatch)."""
    return map_observation(lambda x: x[index], obs)


def as_tensors(value: Any) -> Any:
    """`value` with its NumPy arrays as tensors, so that it loads with weights_only=True."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, dict):
        return {key: as_tensors(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [as_tensors(item) for item in value]
    return value


def as_arrays(value: Any) -> Any:
    """The inverse of `as_tensors`."""
    if isinstance(value, torch.Tensor):
        return value.numpy()
    if isinstance(value, dict):
        return {key: as_arrays(item) for key, item in value.items()}
    if isinstance(value, list):
        return [as_arrays(item) for item in value]
    return value


def evaluate(cfg: DictConfig) -> None:
    """Runs episodes with a trained agent and prints their outcome as one JSON line; with
    `eval.record=FILE` also writes one episode as a GIF/MP4 (rgb frames) or text (ansi)."""
    checkpoint = load_checkpoint(cfg.checkpoint)
    if checkpoint is None:
        raise ConfigError(f"checkpoint={cfg.checkpoint}: no checkpoint file there")
    check_checkpoint_kind(checkpoint, "agent", cfg.checkpoint, other="train_lm.py")
    trained = OmegaConf.create(checkpoint["config"])
    if cfg.eval.keep_marked and trained.memory.kind != "expire_span":
        raise ConfigError(
            f"eval.keep_marked sets expire-spans, but {cfg.checkpoint} is a "
            f"memory={trained.memory.kind} agent; drop eval.keep_marked"
        )
    use_host(cfg.torch_threads)
    single = make_env(trained.env)
    agent = build_agent(trained, single.observation_space, single.action_space)
    single.close()
    agent.load_state_dict(checkpoint["agent"])
    result = evaluate_agent(agent, trained.env, cfg.eval, cfg.seed)
    result["checkpoint"] = str(cfg.checkpoint)
    if cfg.eval.record:
        path = Path(cfg.eval.record)
        result["record"] = record_episode(agent, trained.env, path, cfg.seed, cfg.eval.greedy)
    print(json.dumps(result))


@hydra.main(config_path="configs", config_name="rl", version_base=None)
@exit_on_config_error
def main(cfg: DictConfig) -> None:
    if cfg.mode == "eval":
        check_config(cfg)
        evaluate(cfg)
        return
    cfg, checkpoint = resumed_run(cfg)
    check_config(cfg)
    train(cfg, checkpoint)
    gc.collect()  # frees a DDP wrapper's process group now, not at shutdown (cleanup_distributed)


if __name__ == "__main__":
    sys.argv[1:] = eval_writes_nothing(sys.argv[1:])
    # checked before Hydra writes anything:
    exit_on_config_error(check_run_dir_argument)(sys.argv[1:], CONFIGS, "rl", check_config)
    main()
