"""``thundersync warmstart``'s flags come from WarmStartConfig's declaration: a hostile value
is one line and exit 2 before any demonstration runs."""

from __future__ import annotations

import pytest

from thundersync.cli import main
from thundersync.training.warmstart import WarmStartConfig


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--lr", "nan"], "--lr: input should be a finite number"),
        (["--lr", "0"], "--lr: input should be greater than 0"),
        (
            ["--corrupt-fraction", "1.5"],
            "--corrupt-fraction: input should be less than or equal to 1",
        ),
        (["--steps", "0"], "--steps: input should be greater than or equal to 1"),
        (["--num-demos", "1e400"], "--num-demos: input should be a valid integer"),
        (["--bias-steps", "-1"], "--bias-steps: input should be greater than or equal to 0"),
        (["--hidden-size", "0"], "--hidden-size: input should be greater than or equal to 1"),
        (["--hidden-size", "63"], "'hidden_size': expected a multiple of num_heads"),
        (["--threads", "0"], "--threads: expected an int >= 1"),
        (["--seed", "-2"], "--seed: input should be greater than or equal to 0"),
    ],
)
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


# --- the model is written atomically, says what it is, and reports progress ----------------

DEMO = [
    ("user", "What is alpha + beta?"),
    ("assistant", "```bash\nlookup alpha\n```"),
    ("user", "17"),
    ("assistant", "```bash\necho THUNDERSYNC_SUBMIT 42\n```"),
]
TINY = ["--num-demos", "4", "--steps", "2", "--bias-steps", "1", "--hidden-size", "16"]


@pytest.fixture
def canned_demos(monkeypatch):
    """Demonstrations without a sandbox: each phase's progress is reported as a real one's."""
    import thundersync.training.warmstart as warmstart

    def collect(
        config,
        *,
        corrupt_fraction,
        first=0,
        progress=warmstart.no_progress,
        phase="demonstrations",
        **kwargs,
    ):
        for i in range(config.num_demos):
            progress(phase, i + 1, config.num_demos)
        return [list(DEMO) for _ in range(config.num_demos)]

    monkeypatch.setattr(warmstart, "collect_demos", collect)


def test_a_failure_midway_leaves_no_out_folder(canned_demos, monkeypatch, tmp_path, capsys):
    import thundersync.training.warmstart as warmstart

    def fail(*args, **kwargs):  # the model and tokenizer are already written by now
        raise RuntimeError("injected failure during fine-tuning")

    monkeypatch.setattr(warmstart, "_fine_tune", fail)
    with pytest.raises(RuntimeError, match="injected"):
        main(["warmstart", "--out", str(tmp_path / "warm"), *TINY])
    assert list(tmp_path.iterdir()) == []  # neither --out nor the temporary folder


def test_the_model_appears_whole_at_the_end_and_says_what_it_is(canned_demos, tmp_path, capsys):
    from thundersync.models import load_model

    out = tmp_path / "warm"
    assert main(["warmstart", "--out", str(out), *TINY, "--corrupt-fraction", "0.5"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "50% answer without the tools (--corrupt-fraction)" in text
    assert "Biased on purpose" in text and "RL has a decision to learn" in text
    assert "(biased on purpose (--corrupt-fraction 0.5, --bias-steps 1))" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warm"]
    load_model(out)
    # a second run replaces a previous warm model; a folder holding anything else is refused
    assert main(["warmstart", "--out", str(out), *TINY, "--bias-steps", "0"]) == 0
    assert "an imitation of the oracle" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["warm"]
    (out / "notes.txt").write_text("mine")
    assert main(["warmstart", "--out", str(out), *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "holds what a warm model does not (notes.txt)" in err[0], err


def test_progress_reports_each_phase_in_a_pipe(monkeypatch):
    import threading

    from thundersync import cli_output
    from thundersync.training.train_command import PhaseProgress

    class Pipe:
        def __init__(self):
            self.text, self.seen = "", threading.Event()
            self.wanted = ""

        def write(self, text):
            self.text += text
            if self.wanted and self.wanted in self.text:
                self.seen.set()

        def flush(self):
            pass

    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.01)
    pipe = Pipe()
    with PhaseProgress("demonstrations", 4, stream=pipe) as progress:
        progress("demonstrations", 4, 4)
        pipe.wanted = "warmstart: fine-tuning: 3/600 steps"
        progress("fine-tuning", 3, 600)
        assert pipe.seen.wait(10), pipe.text  # a line while fine-tuning runs, not after


def test_every_phase_is_named_before_its_work_starts(canned_demos, tmp_path):
    """Between the last demonstration and the first fine-tuning step the tokenizer is trained
    and the model built (tens of seconds on a loaded machine): the progress names that phase,
    and each fine-tuning phase from its step 0, so a pipe never repeats a finished phase."""
    import thundersync.training.warmstart as warmstart

    calls = []
    config = WarmStartConfig(num_demos=4, steps=2, bias_steps=1, hidden_size=16)
    warmstart.warm_start(config, tmp_path / "warm", progress=lambda *c: calls.append(c))
    phases = [phase for phase, _, _ in calls]
    first = {phase: calls[phases.index(phase)] for phase in phases}
    assert list(first) == [
        "demonstrations",
        "biased demonstrations",
        warmstart.BUILD_PHASE,
        "fine-tuning",
        "bias fine-tuning",
    ]
    assert first["fine-tuning"] == ("fine-tuning", 0, 2)
    assert first["bias fine-tuning"] == ("bias fine-tuning", 0, 1)
