"""benchmarks/throughput.py and time_to_success.py: the numbers they derive from a run."""

from pathlib import Path

import pytest

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
