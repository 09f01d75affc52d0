"""Named methods: preset=paper is the paper's agent (A.3.1), every preset_env file belongs to a
preset and an env, a run's start-up line names the files it was composed from and every value
of theirs it replaced, and the README names every way the default differs from the paper."""

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
from training.composition import describe_composition, flattened

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def composed(*overrides):
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        return compose("rl", overrides=list(overrides))


def start_up_line(config_name, *overrides):
    """The run's config and its start-up line, as `start_run` logs it."""
    with initialize_config_dir(config_dir=str(CONFIGS), version_base=None):
        cfg = compose(config_name, overrides=list(overrides))
        return cfg, describe_composition(cfg, config_name, overrides)


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
    for path in (CONFIGS / "preset_env").glob("*.yaml"):
        preset, _, env = path.stem.partition("_")
        assert preset in presets and env in envs, path.name


@pytest.mark.parametrize("preset", ["default", "paper"])
@pytest.mark.parametrize("env", ["corridor", "portal", "gym", "popgym", "minigrid_memory"])
def test_a_run_names_its_files_and_every_value_of_theirs_it_replaces(preset, env):
    """Against Hydra composing the run without the preset's per-env file: each value that file
    changes is named, the run's value beside the value it replaced."""
    cfg, line = start_up_line("rl", f"preset={preset}", f"env={env}")
    names = line.split("; ")[0]
    for group in ("memory/expire_span", "agent/", f"env/{env}", f"preset/{preset}"):
        assert group in names
    assert "memory/schema (memory.config.MemoryConfig)" in names
    has_own = (CONFIGS / "preset_env" / f"{preset}_{env}.yaml").is_file()
    assert (f"preset_env/{preset}_{env}.yaml" in names) == has_own
    with_file = flat(cfg)
    without = flat(composed(f"preset={preset}", f"env={env}", "~preset_env")) if has_own else {}
    changed = {k for k in with_file if k in without and with_file[k] != without[k]}
    for key in changed:
        now, before = (re.escape(str(value)) for value in (with_file[key], without[key]))
        assert re.search(rf"{re.escape(key)}={now} \([^)]*: {before}[,)]", line), key


def test_every_value_of_a_composed_file_is_one_that_a_named_method_runs():
    """Each file that a preset's run on a named env is composed from (the group files, the
    memory schema, rl.yaml) is run as it is by one of them: on that run's start-up line no
    value of the file is replaced. agent/ppo.yaml is the default on MiniGrid for a memory
    that its tuning gave no setting of its own (configs/tuned/; no memory, here), the schema
    the paper's Corridor agent."""
    runs = [
        (f"preset={preset}", f"env={env}")
        for preset in ("default", "paper")
        for env in ("corridor", "portal", "gym", "popgym", "minigrid_memory")
    ]
    runs.append(("preset=default", "env=minigrid_memory", "memory=mlp"))
    composed_from, run_as_is = set(), set()
    for overrides in runs:
        _, line = start_up_line("rl", *overrides)
        files, _, replacing = line.partition("; ")
        names = {name.split(" ")[0] for name in files.split(") ", 1)[1].split(", ")}
        replaced = set(re.findall(r"[(,] ?([\w/.]+): ", replacing))
        composed_from |= names
        run_as_is |= names - replaced
    assert {"agent/ppo.yaml", "agent/a2c.yaml", "memory/schema", "rl.yaml"} <= composed_from
    assert composed_from == run_as_is, sorted(composed_from - run_as_is)


def test_the_default_corridor_run_names_the_eighteen_values_its_env_file_replaces():
    _, line = start_up_line("rl")
    replaced = line.split("replacing their values: ")[1]
    assert replaced.count("(") == 18
    for setting in (
        "agent.lr_schedule=linear (agent/ppo.yaml: constant)",
        "agent.advantage_scale=returns (agent/ppo.yaml: std)",
        "agent.minibatches=4 (agent/ppo.yaml: 8)",
        "agent.entropy_coef=0.005 (agent/ppo.yaml: 0.0005)",
        "agent.entropy_schedule=rate (agent/ppo.yaml: constant)",
        "agent.anchor_coef=1.0 (agent/ppo.yaml: 0.0)",
        "agent.anchor_from=0.9 (agent/ppo.yaml: 0.95)",
        "agent.anchor_follows=True (agent/ppo.yaml: False)",
        "agent.anchor_after=3 (agent/ppo.yaml: 1)",
        "agent.anchor_schedule=rate (agent/ppo.yaml: constant)",
        "agent.anchor_until=0.67 (agent/ppo.yaml: 1.0)",
        "agent.cut_uniform_coef=1.0 (agent/ppo.yaml: 0.0)",
        "agent.held_aux_loss_coef=0.0001 (agent/ppo.yaml: None)",
        "agent.held_attended_span_coef=0.2 (agent/ppo.yaml: None)",
        "memory.init_span_fraction=0.5 (memory/schema: 0.1)",
        "memory.attended_span_coef=0.01 (memory/schema: 0.0)",
    ):
        assert setting in replaced


def test_a_command_line_value_shows_beside_the_files_value():
    _, line = start_up_line("rl", "env=corridor", "agent.anchor_coef=0")
    assert "agent.anchor_coef=0 (preset_env/default_corridor.yaml: 1.0)" in line
    _, line = start_up_line("rl", "+sweep=suite", "+benchmark=repeat_previous_easy")
    assert "sweep/suite.yaml, benchmark/repeat_previous_easy.yaml;" in line
    assert "total_steps=1000000 (rl.yaml: 3000000)" in line


def test_a_language_model_run_names_what_its_task_file_replaces():
    _, line = start_up_line("lm", "task=collision")
    assert line.startswith("composed from (later wins) memory/schema")
    assert "memory.max_span=4096 (memory/schema: 200, lm.yaml: 1024)" in line


def test_portal_default_takes_the_papers_portal_settings_with_ppo():
    default, paper = composed("env=portal"), composed("env=portal", "preset=paper")
    assert default.agent.name == "ppo"
    portal = flattened(
        OmegaConf.to_container(OmegaConf.load(CONFIGS / "preset_env" / "paper_portal.yaml"))
    )
    for key in portal:
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


def test_compile_acting_is_taken_on_cuda_and_refused_on_other_devices(monkeypatch):
    """On CUDA the step compiles with torch.compile, so train_rl.py takes ``compile_acting``
    with ``device=cuda``; a device with neither compiler is refused in one line."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    train_rl = load_script("train_rl")
    train_rl.check_config(composed("env.max_length=3", "compile_acting=true", "device=cuda"))
    with pytest.raises(RuntimeError, match="compile_acting=false") as error:
        refuse_unchecked_target(torch.device("meta"))
    assert "CPU and CUDA only, not meta" in str(error.value) and "\n" not in str(error.value)
