"""benchmarks/throughput.py, time_to_success.py, portal.py, unroll_time.py: the numbers they
derive from runs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from tiny_rl import TINY_RL
from torch._inductor import cpu_vec_isa

from agents.compiled_step import CHECKED_VECTOR_UNITS
from scripts import ROOT, load_script


@pytest.fixture
def time_to_success(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # it imports its sibling
    return load_script("benchmarks/time_to_success")


def test_time_to_target_adds_each_interval_steps_over_its_rate(time_to_success):
    lines = [
        {"step": 100, "sps": 50.0, "success": 0.5},  # 2 s
        {"step": 300, "sps": 100.0},  # 2 s, no episode ended
        {"step": 400, "sps": 25.0, "success": 0.92},  # 4 s
        {"step": 500, "sps": 25.0, "success": 0.99},
    ]
    assert time_to_success.time_to_target(lines, 0.9) == (400, 8.0)
    assert time_to_success.time_to_target(lines, 0.95) == (500, 12.0)
    assert time_to_success.time_to_target(lines, 1.0) == (None, None)


def test_export_commit_writes_that_commit_files(tmp_path: Path):
    throughput = load_script("benchmarks/throughput")
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    commit = throughput.export_commit("HEAD", tmp_path)
    assert len(commit) >= 7
    assert (tmp_path / "train_rl.py").is_file() and (tmp_path / "configs" / "rl.yaml").is_file()


def test_portal_runs_each_seed_in_its_own_directory_and_sums_up_over_seeds(tmp_path, monkeypatch):
    portal = load_script("benchmarks/portal")
    commands = []
    monkeypatch.setattr(portal.subprocess, "run", lambda command, **_: commands.append(command))
    for seed, rooms in ((0, [1.0, 4.0, 5.0, 6.0]), (1, [2.0, 2.0, 2.0, 2.0])):
        run_dir = tmp_path / "expire_span" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        lines = [
            {"step": 1000 * k, "rooms_reached": r, "return": r / 2, "memory_size": 10.0 * seed}
            for k, r in enumerate(rooms, 1)
        ]
        (run_dir / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        (run_dir / "eval.json").write_text(
            json.dumps({"greedy": {"return": 3.0 + seed, "rooms_reached": 7.0}})
        )
    (tmp_path / "expire_span" / "seed1" / "checkpoint.pt").touch()  # a stopped run continues

    runs = [portal.train_agent("expire_span", seed, tmp_path, 4000) for seed in (0, 1)]

    assert ["seed=0" in commands[0], "seed=1" in commands[1]] == [True, True]
    assert ["resume=true" in c for c in commands] == [False, True]
    assert commands[1][-1] == f"hydra.run.dir={tmp_path / 'expire_span' / 'seed1'}"
    assert runs[0]["rooms_reached"] == 5.0 and runs[0]["return"] == 2.5  # last three intervals
    assert runs[0]["steps"] == 4000 and runs[1]["seed"] == 1
    summary = portal.over_seeds(runs)
    assert summary["seeds"] == [0, 1]
    assert summary["rooms_reached"] == 3.5 and summary["lowest_rooms_reached"] == 2.0
    assert summary["greedy_return"] == 3.5 and summary["lowest_greedy_return"] == 3.0
    assert summary["memory_size"] == 5.0 and "lowest_memory_size" not in summary


def test_throughput_averages_the_runs_started_together_after_their_first_interval(monkeypatch):
    throughput = load_script("benchmarks/throughput")
    started = []

    def two_runs(code_dir, script, overrides, count):
        started.append((script, count, overrides[-1]))
        return [
            [{"sps": 50.0, "memory_size": 9.0}, {"sps": 100.0, "memory_size": 4.0}],
            [{"sps": 10.0, "memory_size": 9.0}, {"sps": 300.0, "memory_size": 6.0}],
        ]

    monkeypatch.setattr(throughput, "run_trainers", two_runs)
    result = throughput.measure(ROOT, throughput.SETTINGS["two_runs"], steps=800)
    assert started == [("train_rl.py", 2, "total_steps=800")]
    assert result == {"per_s": 200, "unit": "steps", "memory_size": 5.0}


def test_throughput_repeats_take_the_codes_in_turn_and_give_the_median_paired_ratio(
    monkeypatch, capsys
):
    throughput = load_script("benchmarks/throughput")
    rates = {"ref": iter([100, 200, 100]), throughput.WORKING_TREE: iter([110, 180, 130])}
    order = []

    def measure(code_dir, setting, steps):
        order.append(code_dir.name)
        return {"per_s": next(rates[code_dir.name]), "unit": "steps", "memory_size": 1.0}

    codes = {"ref": Path("ref"), throughput.WORKING_TREE: Path(throughput.WORKING_TREE)}
    monkeypatch.setattr(throughput, "code_versions", lambda reference, into: codes)
    monkeypatch.setattr(throughput, "measure", measure)
    argv = ["throughput.py", "--reference", "HEAD", "--repeats", "3", "--settings", "lm_copy"]
    monkeypatch.setattr(sys, "argv", argv)
    throughput.main()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert order == ["ref", throughput.WORKING_TREE] * 3
    assert [line["repeat"] for line in lines[:-1]] == [0, 0, 1, 1, 2, 2]
    # paired ratios 1.1, 0.9, 1.3: the median of the pairs, not the ratio of the means
    assert lines[-1] == {"setting": "lm_copy", "ratio": 1.1, "ratio_min": 0.9, "ratio_max": 1.3}


def test_the_gpu_throughput_settings_are_runs_train_rl_accepts_on_cuda(monkeypatch):
    """Each gpu_ setting's command passes train_rl.py's checks as a CUDA machine would run it,
    runs more than its first logging interval, and none runs by default on a CPU."""
    throughput = load_script("benchmarks/throughput")
    train_rl = load_script("train_rl")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    gpu = {name: s for name, s in throughput.SETTINGS.items() if name.startswith("gpu_")}
    assert len(gpu) == 6 and not set(gpu) & set(throughput.CPU_SETTINGS)
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base=None):
        for setting in gpu.values():
            cfg = compose("rl", overrides=setting.overrides)
            train_rl.check_config(cfg)
            updates = setting.total_steps / (cfg.num_envs * cfg.unroll_len)
            assert cfg.device == "cuda" and updates > 2 * cfg.log_interval


def benchmark_json(script: str, *args: str) -> dict:
    """The JSON object that ``benchmarks/<script> args`` prints, after checking it ran."""
    command = [sys.executable, str(ROOT / "benchmarks" / script), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_unroll_time_splits_an_update_and_counts_acting_flops():
    """A tiny Corridor run: the parts are positive and acting's FLOPs are those of its
    matrix products (2 layers of a 16-unit core with ffn 32 read 4 environments' steps)."""
    short = ["--updates", "2", "--warmup", "1", "--threads", "1"]
    timing = benchmark_json("unroll_time.py", *short, *TINY_RL, "eval.after_training=false")
    parts = timing["ms_per_update"]
    assert parts["acting"] > 0 and parts["learner"] > 0 and min(parts.values()) >= 0
    # per env-step: q, k, v and output projections (4 x 16 x 16), the FFN (2 x 16 x 32), x 2
    # layers, at least: 2 FLOPs per multiply-add
    assert timing["acting_mflops_per_step"] * 1e6 >= 4 * 2 * 2 * (4 * 16 * 16 + 2 * 16 * 32)
    assert timing["acting_floor_ms"] > 0 and timing["steps_per_s"] > 0
    # the products replayed alone take less than acting, which calls them and more
    assert timing["acting_threads"] == 1 and 0 < timing["acting_products_ms"] < parts["acting"]
    acting = timing["acting_profiled_ms"]
    assert acting["matrix_products"] > 0 and acting["other_ops"] > 0
    # at least each layer's q, k, v, output and two FFN products per step, and the heads
    assert timing["acting_ops_per_step"] >= 2 * 4 + 2


@pytest.mark.slow
def test_update_profile_counts_each_parts_operations():
    """A tiny Corridor run on the CPU: both parts timed; the learner's epochs over minibatches
    call more operations than acting's steps, and the top operations are among them."""
    short = ["--updates", "1", "--warmup", "1", "--threads", "1", *TINY_RL]
    profile = benchmark_json("update_profile.py", *short, "eval.after_training=false")
    assert profile["device"] == "cpu" and profile["steps_per_s"] > 0
    assert min(profile["ms_per_update"].values()) > 0
    # per acting step at least each layer's q, k, v, output and two FFN products, and the heads
    unroll_len = 10  # (TINY_RUN's)
    assert profile["acting"]["ops"] >= unroll_len * (2 * 6 + 2)
    assert profile["learner"]["ops"] > profile["acting"]["ops"]
    # no read of the host in a minibatch (8 epochs of 2): one an epoch and a few an update;
    # the CPU's fused Adam reads its step counters, counted apart
    assert profile["learner"]["host_reads"] <= 8 * 2
    assert profile["learner"]["optimizer_step_reads"] > 0
    for part in ("acting", "learner"):
        top = profile[part]["top_host_ops"]
        assert top and all(op["op"].startswith("aten::") and op["calls"] > 0 for op in top)
        assert sum(op["calls"] for op in top) <= profile[part]["ops"]
        assert "kernels" not in profile[part]  # (a GPU's figures only)
    assert "sync_sites" not in profile


@pytest.mark.skipif(
    not str(cpu_vec_isa.pick_vec_isa()).startswith(CHECKED_VECTOR_UNITS),
    reason="compile_acting is refused on this CPU's vector unit",
)
@pytest.mark.slow
def test_unroll_time_times_the_compiled_call_alone():
    """compile_acting: the compiled step's library, called alone or timed in the run, takes
    less than acting, which also plans each step; acting eagerly reports no such figures."""
    short = ["--updates", "2", "--warmup", "1", "--threads", "1", *TINY_RL]
    timing = benchmark_json("unroll_time.py", *short, "compile_acting=true", "num_envs=8")
    acting = timing["ms_per_update"]["acting"]
    assert 0 < timing["acting_compiled_call_ms"] < acting
    assert 0 < timing["acting_library_in_run_ms"] < acting
    eager = benchmark_json("unroll_time.py", *short)
    assert "acting_compiled_call_ms" not in eager and "acting_library_in_run_ms" not in eager


@pytest.mark.slow
def test_recurrent_cells_times_each_layer_in_both_shapes():
    """Tiny shapes: every layer timed learning and acting, the project's GRU as a ratio."""
    sizes = ["--batch", "2", "--block", "5", "--envs", "2", "--dim", "8", "--repeats", "2"]
    timing = benchmark_json("recurrent_cells.py", *sizes, "--threads", "1")
    for layer in ("torch_gru", "project_gru", "torch_lstm"):
        assert timing[f"{layer}_learn_ms"] > 0 and timing[f"{layer}_act_ms"] > 0
    ratio = timing["project_gru_learn_ms"] / timing["torch_gru_learn_ms"]
    assert timing["project_gru_learn_ratio"] == pytest.approx(ratio, rel=1e-3)


@pytest.mark.slow  # a fresh interpreter per entry script
@pytest.mark.parametrize("module", ["train_rl", "train_lm", "unroll_time"])
def test_the_trainers_shorten_openmp_spinning_before_torch_loads(module):
    """GOMP_SPINCOUNT is read once, when torch loads OpenMP: importing an entry script sets
    its default (its first call, `shorten_openmp_spinning`) before anything imports torch; a
    user's own value wins."""
    watch = (
        "import importlib.abc, os, sys\n"
        "class Watch(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'torch':\n"
        "            print('at torch:', os.environ.get('GOMP_SPINCOUNT'))\n"
        "            sys.meta_path.remove(self)\n"
        "sys.meta_path.insert(0, Watch())\n"
        "sys.path[:0] = ['.', 'benchmarks']\n"
        f"import {module}\n"
    )
    given = "77" if module == "train_lm" else None
    env = {k: v for k, v in os.environ.items() if k != "GOMP_SPINCOUNT"}
    env.update({"GOMP_SPINCOUNT": given} if given else {})
    out = subprocess.run(
        [sys.executable, "-c", watch], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.splitlines()[0] == f"at torch: {given or 1000}"


@pytest.mark.slow
def test_memory_efficiency_measures_a_training_step_of_each_kind():
    """One JSON line per kind: Transformer-XL keeps its whole span, Expire-Span's short spans
    keep fewer memories, and tokens/s is the step's tokens over its time; the profiled step
    counts each part's operations, Adam's at least one per parameter."""
    command = [sys.executable, str(ROOT / "benchmarks" / "memory_efficiency.py"), "--steps", "1"]
    command += ["--spans", "256", "--kinds", "expire_span", "transformer_xl", "--profile"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    rows = {row["kind"]: row for row in map(json.loads, result.stdout.splitlines())}
    assert rows["transformer_xl"]["avg_memory_size"] == 256
    assert 0 < rows["expire_span"]["avg_memory_size"] < 256
    for row in rows.values():
        assert row["tokens_per_s"] == pytest.approx(4 * 256 / row["ms_per_step"] * 1000, rel=0.01)
        assert row["peak_mb"] > 0 and (row["workload"], row["precision"]) == ("cpu", "fp32")
        assert row["compile"] is False
        profile = row["profile"]
        assert set(profile) == {"forward", "backward", "optimizer"}  # (no sync_sites on a CPU)
        # the cpu workload: 4 layers of 6 weight matrices, plus the embedding and the head
        assert profile["forward"]["ops"] >= 4 * 6 + 2 and profile["backward"]["ops"] > 0
        assert profile["forward"]["host_reads"] >= 1  # (at least the memory size it reports)
        assert profile["optimizer"]["ops"] >= 4 * 6 + 2
        assert all("kernels" not in part for part in profile.values())


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal of a machine without CUDA")
def test_the_gpu_benchmark_refuses_a_machine_without_cuda_in_one_line():
    command = [sys.executable, str(ROOT / "benchmarks" / "lm_gpu.py"), "--spans", "1024"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 1
    assert result.stderr == "--device cuda: torch sees no CUDA device here; use --device cpu\n"
