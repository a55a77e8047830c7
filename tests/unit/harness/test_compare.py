"""``thundersync compare``'s own flags and the training flags it shares: each hostile value
is one line and exit 2 before any run starts (CompareConfig's declaration)."""

from __future__ import annotations

import pytest

from thundersync.cli import main


@pytest.fixture
def no_run(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a comparison started: the bad input reached the runs")

    monkeypatch.setattr("harness.compare_command.run_compare", refuse)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--seeds", "0"], "--seeds: input should be greater than or equal to 1"),
        (["--seeds", "2.5"], "--seeds: input should be a valid integer"),
        (["--target", "1.5"], "--target: input should be less than or equal to 1"),
        (["--target", "nan"], "--target: input should be a finite number"),
        (["--budget-s", "inf"], "--budget-s: input should be a finite number"),
        (["--eval-every", "0"], "--eval-every: input should be greater than or equal to 1"),
        (["--eval-tasks", "-3"], "--eval-tasks: input should be greater than or equal to 1"),
        (["--eval-samples", "0"], "--eval-samples: input should be greater than or equal to 1"),
        (["--eval-env-kwargs", '{"a": NaN}'], "--eval-env-kwargs: expected a JSON object"),
        (["--temperature", "nan"], "--temperature: input should be a finite number"),
        (["--seed", "-1"], "--seed: input should be greater than or equal to 0"),
        (["--device", "gpu"], "--device: expected cpu, cuda or cuda:N"),
    ],
)
def test_a_hostile_compare_flag_is_one_line(argv, message, capsys, no_run, tmp_path):
    code = main(["compare", "--out", str(tmp_path / "c"), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and message in err[0], err
