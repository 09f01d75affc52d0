"""OpenMP's settings for a training process, which an entry script makes first: OpenMP reads
them once, when torch loads it, so this module imports nothing that loads torch."""

import os


def shorten_openmp_spinning() -> None:
    """OpenMP threads waiting for work spin only briefly before they sleep (GNU libgomp's
    default is 300,000 spins): with two runs on the cores, a spinning thread burns the time
    slice that its partner thread needs, and each of two default runs fell to a quarter of its
    speed alone; with 1,000 spins each keeps about half (docs/performance.md). A value already
    in the environment wins. Call it before anything imports torch."""
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")
