"""`python -m training.export SOURCE DEST`: what an exported file keeps and what is refused
(that it evaluates as its source: tests/test_train_rl.py)."""

import torch

from training.checkpoint import load_checkpoint, save_checkpoint
from training.config import exit_on_config_error
from training.export import main


def export(*args, capsys) -> tuple[int, str]:
    """The command's exit code and its error output."""
    try:
        exit_on_config_error(main)([str(arg) for arg in args])
    except SystemExit as exit:
        return exit.code, capsys.readouterr().err
    return 0, capsys.readouterr().err


def test_a_language_model_keeps_what_its_evaluation_reads(tmp_path, capsys):
    """train_lm.py's evaluation reads the vocabulary and the task paths' base beside the
    weights and config; the optimizer and the carried memory are left out."""
    weights = {"embedding.weight": torch.randn(5, 4)}
    source = {"model": weights, "optimizer": {"state": {0: torch.randn(5, 4)}}, "step": 30}
    source.update(vocab=list("abcde"), started_in="/runs", config={"lr": 1e-3})
    source["memory_state"] = [{"time": 30, "episode_begin": torch.zeros(2)}]
    save_checkpoint(tmp_path, source)
    assert export(tmp_path, tmp_path / "model.pt", capsys=capsys) == (0, "")
    exported = load_checkpoint(tmp_path / "model.pt")
    assert set(exported) == {"model", "config", "step", "vocab", "started_in", "exported_from"}
    assert torch.equal(exported["model"]["embedding.weight"], weights["embedding.weight"])
    assert exported["exported_from"] == {"file": str(tmp_path / "checkpoint.pt"), "best": None}


def test_an_rl_agent_keeps_where_it_came_from(tmp_path, capsys):
    best = {"metric": "success", "value": 0.97, "step": 800}
    source = {"agent": {"w": torch.ones(3)}, "step": 800, "best": best, "config": {"seed": 1}}
    save_checkpoint(tmp_path, source, filename="best.pt")
    assert export(tmp_path / "best.pt", tmp_path / "agent.pt", capsys=capsys)[0] == 0
    exported = load_checkpoint(tmp_path / "agent.pt")
    assert set(exported) == {"agent", "config", "step", "exported_from"}
    assert exported["exported_from"] == {"file": str(tmp_path / "best.pt"), "best": best}


def test_refused_sources_and_destinations_are_one_line_errors(tmp_path, capsys):
    save_checkpoint(tmp_path, {"step": 1, "config": {}}, filename="other.pt")
    save_checkpoint(tmp_path, {"agent": {}, "step": 1, "config": {}}, filename="agent.pt")
    (tmp_path / "dir.pt").mkdir()
    for args, expected in [
        ((tmp_path / "none", tmp_path / "a.pt"), "no checkpoint there"),
        ((tmp_path / "other.pt", tmp_path / "a.pt"), "holds neither 'agent' nor 'model'"),
        ((tmp_path / "agent.pt", tmp_path / "no" / "a.pt"), f"{tmp_path / 'no'} does not exist"),
        ((tmp_path / "agent.pt", tmp_path / "dir.pt"), "is a directory"),
    ]:
        code, error = export(*args, capsys=capsys)
        assert code == 2 and expected in error and len(error.strip().splitlines()) == 1, error
    assert sorted(path.name for path in tmp_path.iterdir()) == ["agent.pt", "dir.pt", "other.pt"]
