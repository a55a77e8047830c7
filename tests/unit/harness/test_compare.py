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


def test_writing_the_results_and_plots_is_not_silent_in_a_pipe(monkeypatch, tmp_path):
    """After the evaluations, the summary and the plots take seconds (matplotlib; tens of
    seconds on a loaded machine): a pipe is told what runs then, not left silent."""
    import sys
    import threading

    import harness.compare as compare
    import harness.compare_report as report
    from thundersync import cli_output
    from thundersync.training.config import TrainConfig

    class Pipe:
        def __init__(self):
            self.text, self.seen = "", threading.Event()

        def write(self, text):
            self.text += text
            if "still writing" in self.text:
                self.seen.set()

        def flush(self):
            pass

    pipe = Pipe()
    monkeypatch.setattr(sys, "stderr", pipe)
    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.01)
    monkeypatch.setattr(compare, "train_run", lambda *args: None)
    monkeypatch.setattr(compare, "evaluate_runs", lambda runs, config: (0.0, []))
    monkeypatch.setattr(report, "summarize", lambda runs, config, initial: {})

    def plot(results, runs, config):  # as slow as plotting on a loaded machine
        assert pipe.seen.wait(10), pipe.text

    monkeypatch.setattr(report, "write_outputs", plot)
    out = str(tmp_path / "cmp")
    train = TrainConfig(model=str(tmp_path))
    compare.run_compare(
        compare.CompareConfig(train=train, modes=("sync",), seeds=1, out=out, leaderboard=False)
    )
    assert f"compare: writing {tmp_path / 'cmp' / 'results.json'} and the plots" in pipe.text


@pytest.mark.parametrize("env_kwargs, warned", [('{"strict_grading": false}', 1), ("{}", 0)])
def test_training_without_strict_grading_is_said_before_the_runs(
    env_kwargs, warned, capsys, monkeypatch, tmp_path
):
    """As ``train`` does: the runs train on grading a policy can game, so it is said first
    (each run's config.json keeps it too: the runs are ``train``'s)."""

    def stop(config, **options):
        raise RuntimeError("compare: stopped here")

    monkeypatch.setattr("harness.compare_command.run_compare", stop)
    code = main(["compare", "--out", str(tmp_path / "c"), "--env-kwargs", env_kwargs])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err[-1] == "compare: stopped here", err
    assert len(err) == warned + 1
    assert all(line.startswith("compare: warning: strict grading is off") for line in err[:-1])
