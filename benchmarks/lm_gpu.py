"""A language model's training step on one GPU: tokens/s and peak GPU memory of the paper's
enwik8-sized core (12 layers of 512, 8 heads, blocks of 512, batch 8) for the four memory
kinds at L = 1024, 4096 and 16384, Expire-Span's spans short as after training.

    python benchmarks/lm_gpu.py [--precision bf16] [--compile default] [--device cuda:1]
        [--spans 1024]

It is `python benchmarks/memory_efficiency.py --workload enwik8 --device cuda --threads 0`
(whose docstring says how each figure is measured): one JSON object per line, each from a
fresh process so that peaks do not mix.
"""

from __future__ import annotations

import sys

from memory_efficiency import main  # (its sibling: run as a script, benchmarks/ is on the path)

if __name__ == "__main__":
    gpu = ["--workload", "enwik8", "--device", "cuda", "--threads", "0"]
    sys.argv[1:1] = gpu  # (options given on the command line come after, and win)
    main()
