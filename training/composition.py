"""The start-up line of a run: the config files Hydra composed it from, in Hydra's own order
(its defaults list), and every value of those files that the run does not use because a later
file or the command line replaced it. A reader learns each setting of a run from the files the
line names; no value a file states is replaced without the line saying so."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from training.run_dir import CONFIG_FILE, command_line_overrides

NOT_SETTINGS = ("defaults", "hydra")  # a config file's keys that configure Hydra, not the run


def composed_files(config_name: str, overrides: Sequence[str]) -> list[tuple[str, str]]:
    """(config path, package) of each config Hydra merges for `config_name` with `overrides`,
    in the order it merges them (later wins), Hydra's own hydra/* configs left out. Needs
    Hydra initialised (`@hydra.main`, or `initialize_config_dir`)."""
    loader = GlobalHydra.instance().config_loader()
    defaults = loader.compute_defaults_list(config_name, list(overrides), RunMode.RUN).defaults
    return [(d.config_path, d.package) for d in defaults if not d.config_path.startswith("hydra/")]


class ConfigFile(NamedTuple):
    """One config of a run's composition: its name for a reader (`agent/ppo.yaml`, or a schema
    such as `memory/schema`), the dataclass a schema stands for, and the dotted keys it sets
    itself with their values as written (its own defaults list not followed)."""

    name: str
    schema: str | None
    settings: dict[str, Any]

    def __str__(self) -> str:
        return f"{self.name} ({self.schema})" if self.schema else self.name


def config_file(config_path: str, package: str) -> ConfigFile:
    """The config at `config_path` (as Hydra's defaults list names it), its keys under
    `package`."""
    sources = GlobalHydra.instance().config_loader().get_sources()
    source = next(s for s in sources if s.is_config(config_path))
    node = source.load_config(config_path).config
    schema = OmegaConf.get_type(node)
    if source.scheme() == "structured" and schema not in (None, dict):
        name, schema_name = config_path, f"{schema.__module__}.{schema.__qualname__}"
    else:
        name, schema_name = f"{config_path}.yaml", None
    prefix = f"{package}." if package else ""
    settings = {
        f"{prefix}{key}": value
        for key, value in flattened(OmegaConf.to_container(node, resolve=False)).items()
        if f"{prefix}{key}".split(".")[0] not in NOT_SETTINGS
    }
    return ConfigFile(name, schema_name, settings)


def flattened(tree: dict, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {dotted key: leaf value}."""
    flat = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flattened(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def describe_composition(cfg: DictConfig, config_name: str, overrides: Sequence[str]) -> str:
    """One line: the files the run was composed from, in order, and each value the run uses in
    place of one a file states (with that file's value beside it)."""
    used = flattened(OmegaConf.to_container(cfg, resolve=False))
    files = [config_file(path, package) for path, package in composed_files(config_name, overrides)]
    replaced: dict[str, list[str]] = {}
    for file in files:
        for key, value in file.settings.items():
            if key in used and used[key] != value:
                replaced.setdefault(key, []).append(f"{file.name}: {value}")
    line = f"composed from (later wins) {', '.join(map(str, files))}"
    if not replaced:
        return f"{line}; no value of theirs replaced"
    shown = [f"{key}={used[key]} ({', '.join(where)})" for key, where in replaced.items()]
    return f"{line}; replacing their values: {', '.join(shown)}"


def describe_start(cfg: DictConfig, checkpoint: Mapping | None, run_dir: Path) -> str:
    """The start-up line of a run that Hydra started: a new run's composition, or that a
    resumed run goes on with the settings saved in its directory."""
    if checkpoint is not None:
        changed = [
            f"{change['key']}={change['to']} (was {change['from']})"
            for change in cfg.get("changed_at_resume") or []
            if change["step"] == checkpoint["step"]
        ]
        return (
            f"continues the run in {run_dir} from step {checkpoint['step']:,} with the settings "
            f"it started with ({run_dir / CONFIG_FILE}), but for those this command gives"
            + (f"; changes at this step: {', '.join(changed)}" if changed else "")
        )
    return describe_composition(cfg, HydraConfig.get().job.config_name, command_line_overrides())
