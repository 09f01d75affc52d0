"""Named methods: preset=paper is the paper's agent (A.3.1), every preset_env file belongs to a
preset and an env, a run names its per-env settings, and the README names every way the
default differs from the paper."""

import re
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from agents.build import build_agent
from agents.compiled_step import refuse_unchecked_target
from envs.registry import make_env
from memory import MemoryConfig
from scripts import load_script
from training import ConfigError
from training.presets import PRESET_ENV_GROUP, describe_preset, file_settings, flattened

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose("rl", overrides=list(overrides))


def flat(cfg):
    return flattened(OmegaConf.to_container(cfg, resolve=True))


def test_paper_preset_is_the_papers_corridor_agent():
    cfg = composed("preset=paper", "env=corridor")
    agent, memory = cfg.agent, cfg.memory
    assert (agent.name, agent.optimizer, agent.lr, agent.lr_schedule) == (
        "a2c",
        "rmsprop",
        1e-4,
        "constant",
    )
    assert (cfg.num_envs, cfg.unroll_len, agent.entropy_coef) == (64, 100, 5e-4)
    assert (agent.gae_lambda, agent.epochs, agent.minibatches) == (1, 1, 1)
    assert agent.max_grad_norm is None and agent.anchor_coef == 0
    assert (memory.kind, memory.num_layers, memory.dim) == ("expire_span", 2, 64)
    assert (memory.max_span, memory.aux_loss_coef, memory.ramp) == (200, 5e-6, 16)
    assert memory.init_span_fraction == 0.1 and memory.attended_span_coef == 0
    assert not memory.scaled_span
    assert cfg.preset == "paper"


def test_paper_preset_on_portal_has_the_papers_portal_settings():
    cfg = composed("preset=paper", "env=portal")
    assert (cfg.agent.name, cfg.agent.optimizer, cfg.agent.lr) == ("a2c", "adam", 5e-4)
    assert (cfg.num_envs, cfg.agent.max_grad_norm, cfg.agent.gamma) == (1024, 0.1, 0.98)
    assert (cfg.memory.max_span, cfg.memory.aux_loss_coef, cfg.memory.ramp) == (100, 1e-6, 16)


def test_every_preset_env_file_belongs_to_a_preset_and_an_env():
    presets = {path.stem for path in (CONFIGS / "preset").glob("*.yaml")}
    envs = {path.stem for path in (CONFIGS / "env").glob("*.yaml")}
    assert {"default", "paper"} <= presets
    for path in (CONFIGS / PRESET_ENV_GROUP).glob("*.yaml"):
        preset, _, env = path.stem.partition("_")
        assert preset in presets and env in envs, path.name


@pytest.mark.parametrize("preset", ["default", "paper"])
@pytest.mark.parametrize("env", ["corridor", "portal", "gym", "popgym", "minigrid_memory"])
def test_a_run_names_each_per_env_setting_of_its_preset_and_uses_it(preset, env):
    cfg = composed(f"preset={preset}", f"env={env}")
    line = describe_preset(cfg, CONFIGS)
    assert line.startswith(f"preset={preset}")
    path = CONFIGS / PRESET_ENV_GROUP / f"{preset}_{env}.yaml"
    settings = file_settings(path) if path.exists() else {}
    assert ("with no settings of its own" in line) == (not settings)
    for key, value in settings.items():
        assert OmegaConf.select(cfg, key) == value
        assert f"{key}={value}" in line


def test_a_command_line_value_shows_beside_the_presets():
    cfg = composed("env=corridor", "agent.anchor_coef=0")
    line = describe_preset(cfg, CONFIGS)
    assert "agent.anchor_coef=0 (the preset's 1.0, replaced)" in line
    assert "memory.init_span_fraction=0.5," in line


def test_portal_default_takes_the_papers_portal_settings_with_ppo():
    default, paper = composed("env=portal"), composed("env=portal", "preset=paper")
    assert default.agent.name == "ppo"
    for key in file_settings(CONFIGS / PRESET_ENV_GROUP / "paper_portal.yaml"):
        assert OmegaConf.select(default, key) == OmegaConf.select(paper, key)


def test_readme_names_every_way_the_default_differs_from_the_paper_on_the_corridor():
    default = flat(composed("env=corridor"))
    paper = flat(composed("env=corridor", "preset=paper"))
    differing = {
        key
        for key in default.keys() | paper.keys()
        if default.get(key) != paper.get(key) and key != "preset"
    }
    assert {"agent.name", "memory.init_span_fraction", "agent.anchor_coef"} <= differing
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## Methods", 1)[1].split("\n## ", 1)[0]
    table = "\n".join(line for line in section.splitlines() if line.startswith("|"))
    named = set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", table)) | set(
        re.findall(r"`([a-z_]+)`", table)
    )
    assert differing <= named, f"not in the README's Methods table: {sorted(differing - named)}"


def test_memory_files_hold_only_their_kind_and_what_differs_from_the_schema():
    """configs/memory/*.yaml extend memory.MemoryConfig (Hydra's schema `memory/schema`), or
    another memory file that does: each states its kind and only the fields whose value
    differs from the default, and a field the schema lacks is refused when the config is
    composed."""
    defaults = MemoryConfig()
    for path in sorted((CONFIGS / "memory").glob("*.yaml")):
        fields = OmegaConf.to_container(OmegaConf.load(path))
        base, last = fields.pop("defaults")
        assert last == "_self_" and base != path.stem, path.name
        assert base == "schema" or (CONFIGS / "memory" / f"{base}.yaml").is_file(), path.name
        assert fields.pop("kind") == path.stem
        same = {k: v for k, v in fields.items() if getattr(defaults, k) == v}
        assert not same, f"{path.name} restates defaults: {same}"
    with pytest.raises(ConfigCompositionException, match="max_spam"):
        composed("memory.max_spam=9")


@pytest.mark.parametrize("memory", ["expire_span", "gru"])
def test_compile_acting_compiles_a_memory_transformers_step(memory):
    cfg = composed(f"memory={memory}", "compile_acting=true")
    env = make_env(cfg.env)
    agent = build_agent(cfg, env.observation_space, env.action_space)
    assert (agent.compiled_step is not None) is (memory == "expire_span")
    assert composed().compile_acting is False


def test_compile_acting_on_a_gpu_is_refused_before_the_run_starts(monkeypatch):
    """On CUDA the compiled step was not checked (loading it crashed the process there), so
    train_rl.py refuses ``compile_acting`` with ``device=cuda`` in one line before it starts,
    as does the agent at its first step."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    train_rl = load_script("train_rl")
    cfg = composed("env.max_length=3", "compile_acting=true", "device=cuda")
    with pytest.raises(ConfigError, match="compile_acting=false") as error:
        train_rl.check_config(cfg)
    assert "on cuda it was not checked" in str(error.value) and "\n" not in str(error.value)
    train_rl.check_config(composed("env.max_length=3", "compile_acting=true", "device=cpu"))
    with pytest.raises(RuntimeError, match="compile_acting=false"):
        refuse_unchecked_target(torch.device("cuda"))
