"""The structured schemas Hydra checks the config files against, kept here so that `memory/`
needs no Hydra."""

from hydra.core.config_store import ConfigStore

from memory import MemoryConfig


def register_schemas() -> None:
    """Registers configs/memory/'s schema with Hydra: call it before composing a trainer's
    config. configs/memory/*.yaml extend memory/schema: each holds its kind and what differs
    from MemoryConfig's defaults (the recurrent baselines read dim and num_layers); Hydra
    refuses a misspelt or mistyped field."""
    ConfigStore.instance().store(group="memory", name="schema", node=MemoryConfig)
