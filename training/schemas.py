"""The structured schemas Hydra checks the config files against, kept here so that `memory/`
needs no Hydra, and the memory config a composed `memory` group makes."""

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from memory import MemoryConfig
from training.config import ConfigError


def register_schemas() -> None:
    """Registers configs/memory/'s schema with Hydra: call it before composing a trainer's
    config. configs/memory/*.yaml extend memory/schema: each holds its kind and what differs
    from MemoryConfig's defaults (the recurrent baselines read dim and num_layers); Hydra
    refuses a misspelt or mistyped field."""
    ConfigStore.instance().store(group="memory", name="schema", node=MemoryConfig)


def memory_config(memory_cfg: DictConfig) -> MemoryConfig:
    """The MemoryConfig of a memory transformer's `memory` group, which checks its own fields
    (block_len >= 1, dim divisible by num_heads, the kind's options, ...) without building a
    core: a bad one is a ConfigError."""
    try:
        return MemoryConfig(**OmegaConf.to_container(memory_cfg, resolve=True))
    except (TypeError, ValueError) as error:
        raise ConfigError(str(error)) from None
