"""Named methods: `preset=NAME` is a learner with its settings (configs/preset/NAME.yaml), and
configs/preset_env/NAME_ENV.yaml, where it exists, the preset's settings for one env. A run
says at start which preset it runs and which of those per-env settings are in force."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

PRESET_ENV_GROUP = "preset_env"
SELF = "_self_"


def preset_env_file(configs: Path, preset: str, env: str) -> Path:
    """Where `preset` keeps its settings for `env` (the file may not exist)."""
    return configs / PRESET_ENV_GROUP / f"{preset}_{env}.yaml"


def file_settings(path: Path) -> dict[str, Any]:
    """The dotted keys a config file of the preset_env group sets and their values, with the
    files of its own defaults list merged in Hydra's order (`_self_` last unless listed)."""
    raw = OmegaConf.load(path)
    entries = list(raw.pop("defaults", []))
    if SELF not in entries:
        entries.append(SELF)
    merged = OmegaConf.create()
    for entry in entries:
        part = raw if entry == SELF else OmegaConf.load(path.with_name(f"{entry}.yaml"))
        part.pop("defaults", None)
        merged = OmegaConf.merge(merged, part)
    return flattened(OmegaConf.to_container(merged))


def flattened(tree: dict, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {dotted key: leaf value}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flattened(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def describe_preset(cfg: DictConfig, configs: Path) -> str:
    """One line: the run's preset and its settings for the run's env, each value the run uses
    and, where the command line replaced it, the preset's value beside it."""
    preset, env = cfg.get("preset", "default"), cfg.env.name
    path = preset_env_file(configs, preset, env)
    if not path.exists():
        return f"preset={preset}, with no settings of its own for env={env}"
    settings = []
    for key, value in file_settings(path).items():
        used = OmegaConf.select(cfg, key)
        replaced = "" if used == value else f" (the preset's {value}, replaced)"
        settings.append(f"{key}={used}{replaced}")
    where = path.relative_to(configs.parent)
    return f"preset={preset}, with its settings for env={env} ({where}): {', '.join(settings)}"
