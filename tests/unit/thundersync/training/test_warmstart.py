"""``thundersync warmstart``'s flags come from WarmStartConfig's declaration: a hostile value
is one line and exit 2 before any demonstration runs."""

from __future__ import annotations

import pytest

from thundersync.cli import main
from thundersync.training.warmstart import WarmStartConfig


@pytest.mark.parametrize(
    "argv, message",
    [(["--lr", "nan"], "--lr: input should be a finite number"),
     (["--lr", "0"], "--lr: input should be greater than 0"),
     (["--corrupt-fraction", "1.5"], "--corrupt-fraction: input should be less than or equal to 1"),
     (["--steps", "0"], "--steps: input should be greater than or equal to 1"),
     (["--num-demos", "1e400"], "--num-demos: input should be a valid integer"),
     (["--bias-steps", "-1"], "--bias-steps: input should be greater than or equal to 0"),
     (["--hidden-size", "0"], "--hidden-size: input should be greater than or equal to 1"),
     (["--hidden-size", "63"], "'hidden_size': expected a multiple of num_heads"),
     (["--threads", "0"], "--threads: expected an int >= 1"),
     (["--seed", "-2"], "--seed: input should be greater than or equal to 0")],
)  # fmt: skip
def test_a_hostile_warmstart_flag_is_one_line(argv, message, capsys, monkeypatch, tmp_path):
    def refuse(*args, **kwargs):
        raise AssertionError("the warm start ran on bad input")

    monkeypatch.setattr("thundersync.training.warmstart.warm_start", refuse)
    code = main(["warmstart", "--out", str(tmp_path / "w"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
    assert not (tmp_path / "w").exists()


def test_the_help_comes_from_the_field_docstrings(capsys):
    with pytest.raises(SystemExit):
        main(["warmstart", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "Fine-tuning steps on the oracle's play. (default: 600)" in text
    assert WarmStartConfig().corrupt_fraction == 0.85
