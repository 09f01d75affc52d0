"""analysis.aggregate: each run's scores against their formulas, the learned-task rule, and
rliable's IQM and probability of improvement on scores whose answer is known; then the
aggregate through `python -m analysis.plot --markdown`."""

import itertools
import math

import numpy as np
import pytest
from test_plot import make_run, rl_config

from analysis.aggregate import (
    AggregateError,
    RunScore,
    aggregate_markdown,
    comparison_markdown,
    final_mean,
    improvement_intervals,
    iqm_intervals,
    learned_tasks,
    normalise,
    popgym_mmer,
    score_matrices,
    setting_comparisons,
    verdict,
)
from analysis.plot import main

pytest.importorskip("rliable", reason='the stats extra: pip install -e ".[stats]"')
stats = pytest.importorskip("scipy.stats", reason='the stats extra: pip install -e ".[stats]"')
REPS = 300
FEWER_REPS = ["--bootstrap-reps", str(REPS)]  # (the plot command's intervals, at a tenth the time)


def test_returns_and_rates_are_normalised_to_the_unit_interval():
    assert [normalise("return", r) for r in (-1.0, 0.0, 0.5, 1.0)] == [0.0, 0.5, 0.75, 1.0]
    assert normalise("success", 0.3) == 0.3
    with pytest.raises(AggregateError, match="rooms_reached"):
        normalise("rooms_reached", 3.0)


def test_the_final_score_is_the_mean_over_the_last_tenth_of_the_steps():
    records = [{"step": 50 * (i + 1), "return": float(i)} for i in range(20)]  # steps 50..1000
    assert final_mean(records, "return") == (18 + 19) / 2  # steps 950 and 1000 are > 900


def test_mmer_is_the_best_episode_weighted_mean_over_windows_of_64k_steps():
    returns = [0.0, 0.2, 0.4, 0.6, 0.9, 0.9, 0.1, 0.1, 0.5, 0.5]  # ten intervals of 16k steps
    episodes = [1, 1, 1, 1, 3, 1, 1, 1, 1, 1]
    records = [
        {"step": 16_000 * (i + 1), "return": r, "episodes": e}
        for i, (r, e) in enumerate(zip(returns, episodes, strict=True))
    ]
    # windows: intervals 0-3 (64k), then 4-9 (the 32k tail joins the window before it)
    first = np.mean(returns[:4])
    second = np.dot(returns[4:], episodes[4:]) / sum(episodes[4:])
    assert popgym_mmer(records) == pytest.approx(max(first, second))
    assert popgym_mmer(records) != pytest.approx(max(returns))  # not the best single interval
    assert popgym_mmer(records[:3]) == pytest.approx(np.mean(returns[:3]))  # under one window


def scores(task, kind, finals, start=0.25):
    return [RunScore(task, kind, seed, f, start, None) for seed, f in enumerate(finals)]


def test_a_task_is_learned_when_a_memory_ends_a_tenth_above_its_starting_level():
    runs = scores("a", "gru", [0.3, 0.32]) + scores("a", "lstm", [0.31, 0.33])
    runs += scores("b", "gru", [0.4, 0.3]) + scores("b", "lstm", [0.2, 0.2])
    assert learned_tasks(runs) == {"a": False, "b": True}  # b: gru's mean 0.35 >= 0.25 + 0.1


def test_the_level_without_memory_is_the_starting_level_where_runs_without_memory_exist():
    runs = scores("a", "gru", [0.8, 0.8]) + scores("a", "mlp", [0.75, 0.75])
    assert learned_tasks(runs) == {"a": False}  # 0.55 above where it starts, 0.05 above no memory
    runs += scores("b", "gru", [0.9, 0.9]) + scores("b", "mlp", [0.75, 0.75])
    assert learned_tasks(runs)["b"]


def test_without_runs_without_memory_a_task_starts_where_those_of_another_budget_end():
    """The suite's 10M runs: a policy without memory leaves its first interval at once, so
    HigherLowerEasy (0.52 to 0.75, where no memory ends at 1M) would count as learned."""
    runs = scores("hl", "gru", [0.76, 0.75], start=0.52) + scores("cr", "gru", [0.8, 0.8])
    assert learned_tasks(runs) == {"hl": True, "cr": True}
    at_1m = scores("hl", "mlp", [0.75, 0.75]) + scores("cr", "mlp", [0.04, 0.04])
    assert learned_tasks(runs, at_1m) == {"hl": False, "cr": True}
    here = scores("hl", "mlp", [0.6, 0.6])  # runs without memory of this budget come first
    assert learned_tasks(runs + here, at_1m) == {"hl": True, "cr": True}


def test_iqm_and_its_interval_follow_the_scores():
    rng = np.random.default_rng(0)
    matrices = {"a": rng.random((5, 3)), "flat": np.full((5, 3), 0.4)}
    result = iqm_intervals(matrices, REPS)
    point, low, high = result["a"]
    assert point == pytest.approx(stats.trim_mean(matrices["a"].ravel(), 0.25))
    assert low < point < high
    assert result["flat"] == pytest.approx((0.4, 0.4, 0.4))


def test_probability_of_improvement_counts_wins_and_half_ties():
    better = np.array([[0.9, 0.8], [0.95, 0.85], [0.92, 0.9]])
    matrices = {"expire_span": better, "worse": better - 0.5, "same": better.copy()}
    result = improvement_intervals(matrices, reps=REPS)
    assert result["worse"] == pytest.approx((1.0, 1.0, 1.0))
    assert result["same"][0] == pytest.approx(0.5)
    assert verdict(result["worse"]) == "improves"
    assert verdict(result["same"]) == "not resolved"
    assert verdict((0.1, 0.0, 0.3)) == "trails"


def test_settings_of_one_task_are_compared_by_order_whatever_their_counts():
    """Five runs against three, on an error (lower is better): the probability counts wins of
    the reference's runs over the other's, ties half, and turns round for an error."""
    finals = {"ES 1024": [0.1, 0.2, 0.15, 0.3, 0.05], "TXL 512": [0.4, 0.2, 0.5]}
    result = setting_comparisons(finals, ["ES 1024"], lower_is_better=True, reps=REPS)
    wins = sum((a < b) + 0.5 * (a == b) for a in finals["ES 1024"] for b in finals["TXL 512"])
    point, low, high, p = result["ES 1024", "TXL 512"]
    assert point == pytest.approx(wins / 15) and low <= point <= high
    flipped = setting_comparisons(finals, ["ES 1024"], lower_is_better=False, reps=REPS)
    assert flipped["ES 1024", "TXL 512"][0] == pytest.approx(1 - wins / 15)
    table = comparison_markdown(result)
    header = "| P(row > column) [95% CI]: verdict (permutation p) | TXL 512 |"
    assert table.splitlines()[0] == header
    assert table.splitlines()[2].startswith(f"| ES 1024 | {point:.3f} [")
    assert table.splitlines()[2].endswith(f"(p {p:.3f}) |")


def exact_p(better, other):
    """The permutation test by hand: every split of the pooled runs, by the share of pairs won."""
    pooled = [*better, *other]

    def improvement(group):
        rest = [pooled[i] for i in range(len(pooled)) if i not in group]
        return np.mean([(pooled[i] > b) + 0.5 * (pooled[i] == b) for i in group for b in rest])

    observed = improvement(range(len(better)))
    splits = [improvement(g) for g in itertools.combinations(range(len(pooled)), len(better))]
    return np.mean([value >= observed - 1e-12 for value in splits])


@pytest.mark.parametrize(
    "better, other",
    [
        ([0.3, 0.4, 0.5], [0.1, 0.0, 0.2]),  # apart: the bootstrap says [1, 1], the test 1/20
        ([0.3, 0.4, 0.5, 0.6, 0.35], [0.1, 0.0, 0.2]),  # apart, five against three: 1/56
        ([0.3, 0.1, 0.5, 0.2], [0.1, 0.4, 0.2]),  # mixed, with ties
    ],
)
def test_a_comparison_of_few_runs_says_how_likely_its_order_is_by_chance(better, other):
    result = setting_comparisons({"ES": better, "TXL": other}, ["ES"], reps=REPS)
    assert result["ES", "TXL"].p == pytest.approx(exact_p(better, other))
    if max(other) < min(better):
        assert result["ES", "TXL"][:3] == (1.0, 1.0, 1.0)
        splits = math.comb(len(better) + len(other), len(better))  # the top group is one of them
        assert result["ES", "TXL"].p == pytest.approx(1 / splits)
    flipped = setting_comparisons({"ES": other, "TXL": better}, ["ES"], reps=REPS)["ES", "TXL"]
    assert flipped.p == pytest.approx(result["ES", "TXL"].p)  # (the p of the order shown)


def test_a_comparison_is_resolved_only_where_the_interval_and_the_test_both_show_it():
    apart = (1.0, 1.0, 1.0)  # the bootstrap of runs that separate completely
    assert verdict(apart, p=1 / 20) == "improves"  # three runs a side
    assert verdict(apart, p=1 / 10) == "not resolved"  # three against two
    assert verdict((0.0, 0.0, 0.0), p=1 / 56) == "trails"
    assert verdict((0.7, 0.4, 0.9), p=0.01) == "not resolved"
    finals = {"ES": [0.3, 0.4, 0.5], "TXL": [0.1, 0.2]}
    table = comparison_markdown(setting_comparisons(finals, ["ES"], reps=REPS))
    assert table.splitlines()[2] == "| ES | 1.000 [1.000, 1.000]: not resolved (p 0.100) |"


def test_a_setting_of_one_run_is_compared_with_none():
    """A single run resampled is always itself: its interval would have no width and read as a
    resolved difference, so it gets no comparison either way."""
    finals = {"ES 1024": [0.1, 0.2], "ES 512": [0.3], "TXL 512": [0.4, 0.5]}
    result = setting_comparisons(finals, ["ES 1024", "ES 512"], reps=REPS)
    assert set(result) == {("ES 1024", "TXL 512")}


def test_uneven_runs_per_task_cannot_be_stratified():
    runs = scores("a", "gru", [0.5, 0.6]) + scores("b", "gru", [0.5])
    with pytest.raises(AggregateError, match="as many runs"):
        score_matrices(runs, ["a", "b"])


def test_unlearned_tasks_are_named_and_left_out_of_the_aggregate():
    runs = scores("learned", "expire_span", [0.9, 0.95, 1.0]) + scores("learned", "gru", [0.5] * 3)
    runs += scores("flat", "expire_span", [0.26] * 3) + scores("flat", "gru", [0.27] * 3)
    text, result = aggregate_markdown(runs, reps=REPS)
    assert result["learned"] == ["learned"] and result["unlearned"] == ["flat"]
    assert "| flat (unlearned) |" in text
    assert result["iqm"]["gru"] == pytest.approx((0.5, 0.5, 0.5))  # the flat task left out
    assert "| gru | 3 |" in text and ": improves |" in text


def test_a_memory_that_ran_only_unlearned_tasks_is_named_and_left_out():
    """The suite's 10M runs while they land: the GRU's so far only on a task no memory learns."""
    runs = scores("learned", "expire_span", [0.9, 0.95, 1.0]) + scores("flat", "gru", [0.26] * 3)
    runs += scores("flat", "expire_span", [0.27] * 3)
    text, result = aggregate_markdown(runs, reps=REPS)
    assert set(result["iqm"]) == {"expire_span"} and result["improvement"] == {}
    assert text.endswith("Left out of the aggregate, with no runs of the learned tasks: gru")


def popgym_runs(root, task, kind, seed, level, total_steps=1_000_000):
    """A POPGym run whose interval returns climb from -0.5 to `level` over 63 intervals."""
    cfg = rl_config(kind, 200 if kind == "expire_span" else None, seed, env="popgym")
    cfg["env"]["id"] = f"popgym:popgym-{task}-v0"
    cfg["total_steps"] = total_steps
    returns = np.minimum(np.linspace(-0.5, level + 0.3, 63), level) + 0.001 * seed
    interval = 16_000 * total_steps // 1_000_000
    records = [
        {"step": interval * (i + 1), "return": float(r), "mmer": float(max(returns[: i + 1]))}
        | {"memory_size": 1.0, "episodes": 100.0}
        for i, r in enumerate(returns)
    ]
    make_run(root / f"{task}-{kind}-{total_steps}-{seed}", cfg, records)


def two_task_suite(root):
    """Expire-Span and the GRU on two POPGym tasks, three seeds each: the plot command's argv."""
    for seed in range(3):
        for task, levels in (("RepeatFirstEasy", (1.0, 0.6)), ("CountRecallEasy", (0.2, -0.2))):
            for kind, level in zip(("expire_span", "gru"), levels, strict=True):
                popgym_runs(root / "runs", task, kind, seed, level)
    return [str(root / "runs"), "--out", str(root / "out"), "--markdown", *FEWER_REPS]


@pytest.mark.slow
def test_the_plot_command_prints_the_aggregate_and_draws_it(tmp_path, capsys):
    argv = two_task_suite(tmp_path)
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "Across seeds and the 2 learned tasks" in out
    assert f"rliable, {REPS} stratified" in out
    iqm_row = next(line for line in out.splitlines() if line.startswith("| gru | 6 |"))
    point = float(iqm_row.split("|")[3].split()[0])
    expected = stats.trim_mean([(0.6 + 1) / 2] * 3 + [(-0.2 + 1) / 2] * 3, 0.25)
    assert point == pytest.approx(expected, abs=0.002)  # (seeds add at most 0.001)
    assert "1.000 [1.000, 1.000]: improves" in iqm_row
    assert (tmp_path / "out" / "aggregate.png").stat().st_size > 0
    assert not math.isnan(point)


@pytest.mark.slow
def test_each_budget_gets_its_own_aggregate(tmp_path, capsys):
    """Longer runs of some tasks (the suite's 10M runs beside its 1M ones) make an aggregate of
    their own, and leave the aggregate of the shorter runs as it was without them."""
    argv = two_task_suite(tmp_path)
    assert main(argv) == 0
    alone = capsys.readouterr().out.split("Final score (normalised")[1]
    for seed in range(3):
        for kind, level in (("expire_span", 0.8), ("gru", 0.0)):
            popgym_runs(tmp_path / "runs", "CountRecallEasy", kind, seed, level, 10_000_000)
    assert main(argv) == 0
    out = capsys.readouterr().out
    short, long = out.split("Runs of 1,000,000 steps:\n\n")[1].split("Runs of 10,000,000 steps:")
    assert short.split("Final score (normalised")[1].strip() == alone.strip()
    assert short.startswith("| task | Expire-Span 200 | GRU | memory size")  # one column each
    assert "Across seeds and the 1 learned tasks (popgym-CountRecallEasy-v0" in long
    iqm = {
        row.split(" | ")[0][2:]: float(row.split(" | ")[2].split()[0])
        for row in long.splitlines()
        if row.startswith(("| expire_span | 3 |", "| gru | 3 |"))
    }
    assert iqm == pytest.approx({"expire_span": (0.8 + 1) / 2, "gru": 0.5}, abs=0.002)
    for budget in (1_000_000, 10_000_000):
        assert (tmp_path / "out" / f"aggregate_{budget}.png").stat().st_size > 0


@pytest.mark.slow
def test_a_budget_without_runs_without_memory_starts_where_another_budgets_end(tmp_path, capsys):
    """At 10M steps, with no run without memory, a task no memory learns at 1M is unlearned
    where the memories end near no memory's 1M level, though far above their first interval."""
    runs = tmp_path / "runs"
    for seed in range(3):
        for task, level in (("HigherLowerEasy", 0.5), ("CountRecallEasy", -0.9)):
            popgym_runs(runs, task, "mlp", seed, level)
            popgym_runs(runs, task, "expire_span", seed, level + 0.05)
            for kind in ("expire_span", "gru"):
                level_10m = {"HigherLowerEasy": 0.52, "CountRecallEasy": 0.4}[task]
                popgym_runs(runs, task, kind, seed, level_10m, 10_000_000)
    assert main([str(runs), "--out", str(tmp_path / "out"), "--markdown", *FEWER_REPS]) == 0
    long = capsys.readouterr().out.split("Runs of 10,000,000 steps:")[1]
    assert "the 1 learned tasks (popgym-CountRecallEasy-v0; unlearned: popgym-Higher" in long
    row = next(
        row for row in long.splitlines() if row.startswith("| popgym-HigherLowerEasy-v0 (unl")
    )
    assert float(row.split(" | ")[1]) == pytest.approx((0.5 + 1) / 2, abs=0.002)  # no memory's


@pytest.mark.slow  # (five bootstraps)
def test_an_interval_is_the_same_twice_and_whatever_else_is_compared():
    rng = np.random.default_rng(1)
    matrices = {kind: rng.random((3, 4)) for kind in ("expire_span", "gru", "lstm")}
    once = improvement_intervals(matrices, reps=REPS)
    assert improvement_intervals(matrices, reps=REPS) == once
    assert improvement_intervals({k: matrices[k] for k in ("expire_span", "lstm")}, reps=REPS) == {
        "lstm": once["lstm"]
    }
    assert (
        iqm_intervals({"gru": matrices["gru"]}, REPS)["gru"] == iqm_intervals(matrices, REPS)["gru"]
    )


@pytest.mark.slow
def test_the_plot_command_compares_expire_span_with_each_setting_of_an_lm_task(tmp_path, capsys):
    """An LM figure (one task, error): every Expire-Span setting against every other setting."""
    errors = {("expire_span", 512): 0.3, ("expire_span", 1024): 0.2, ("transformer_xl", 512): 0.4}
    for (kind, span), error in errors.items():
        for seed in range(3):
            cfg = {"task": {"name": "collision"}, "memory": {"kind": kind, "max_span": span}}
            records = [{"step": 250, "valid_error": error + 0.01 * seed, "valid_memory_size": 9.0}]
            make_run(tmp_path / "runs" / f"{kind}-{span}-{seed}", {**cfg, "seed": seed}, records)
    argv = [str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--markdown", *FEWER_REPS]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert f"every other, over their runs' final valid_error (rliable, {REPS} bootstrap" in out
    rows = {line.split(" | ")[0]: line for line in out.splitlines() if line.startswith("| Expire")}
    header = next(line for line in out.splitlines() if line.startswith("| P(row > column)"))
    assert header.count("|") == 5  # three other settings for each row (two of them Expire-Span)
    assert "1.000 [1.000, 1.000]: improves" in rows["| Expire-Span 1024"]  # beats both others
    assert "0.000 [0.000, 0.000]: trails" in rows["| Expire-Span 512"]  # trails ES 1024


def test_a_memory_of_one_run_per_task_is_left_out_of_the_aggregate():
    """One seed per task resamples to itself: no IQM interval and no verdict for that memory,
    and none at all when no memory has two runs a task."""
    runs = scores("a", "expire_span", [0.9, 1.0]) + scores("a", "gru", [0.5, 0.6])
    runs += scores("a", "lstm", [0.7])
    text, result = aggregate_markdown(runs, reps=REPS)
    assert set(result["iqm"]) == {"expire_span", "gru"} and set(result["improvement"]) == {"gru"}
    assert text.endswith("(a single run resampled has an interval of no width): lstm")
    text, result = aggregate_markdown([r for r in runs if r.seed == 0], reps=REPS)
    assert "iqm" not in result and "no width): expire_span, gru, lstm" in text
