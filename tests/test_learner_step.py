"""benchmarks/unroll_time.py: a gradient step of the learner against its matrix products."""

import pytest
from test_benchmarks import benchmark_json
from tiny_rl import TINY_RL


@pytest.mark.slow
def test_unroll_time_times_a_gradient_step_against_its_products():
    """A tiny Corridor run: the step calls its products and more, so it takes longer than they
    do replayed alone; its profile has products and other operations in the forward pass and
    in the rest, and names the other operations of the most time."""
    short = ["--updates", "1", "--warmup", "1", "--threads", "1", *TINY_RL]
    timing = benchmark_json("unroll_time.py", *short)
    step, products = timing["learner_step_ms"], timing["learner_products_ms"]
    assert 0 < products < step
    # (each figure rounded to 0.01 ms: a tiny model's products take a few tenths)
    assert timing["learner_step_over_products"] == pytest.approx(step / products, rel=0.05)
    assert timing["learner_step_over_products"] >= 1
    for region in ("forward", "gradient"):
        parts = timing["learner_profiled_ms"][region]
        assert parts["matrix_products"] > 0 and parts["other_ops"] > 0
    others = timing["learner_other_ops"]
    assert others and all(op["region"] in ("forward", "gradient") for op in others)
    # ATen operations, none of them a matrix product (mm, addmm, bmm, baddbmm, addbmm)
    assert all(op["op"].startswith("aten::") and not op["op"].endswith("mm") for op in others)
    assert all(op["calls"] > 0 and op["ms"] >= 0 for op in others)
