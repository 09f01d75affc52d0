"""The smallest train_rl.py run the CLI tests use: 4 environments, unrolls of 10 steps,
corridors of length 3..5 and a 16-unit core, so a subprocess run takes seconds."""

TINY_RUN = [  # for any env and memory
    "num_envs=4",
    "agent.minibatches=2",
    "unroll_len=10",
    "wandb.mode=disabled",
    "log_interval=1",
]
TINY_MEMORY = [  # a memory transformer's
    "memory.dim=16",
    "memory.num_heads=2",
    "memory.ffn_dim=32",
    "memory.max_span=16",
    "memory.block_len=10",
]
TINY_RL = ["env.max_length=5", *TINY_RUN, *TINY_MEMORY]
STEPS_PER_UPDATE = 4 * 10
