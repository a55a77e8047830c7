"""The README's commands, in order (train to step 20, ``--resume`` to 40, ``eval --checkpoint``
of step 20), keep every checkpoint they later evaluate: each ``train`` command is parsed as
the CLI parses it, its resumed config resolved as ``--resume`` resolves it, and its
checkpoints saved and rotated by the trainer's own ``save_checkpoint`` (a stub model)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import torch

from thundersync.cli import build_parser
from thundersync.training.checkpoint import list_checkpoints, save_checkpoint
from thundersync.training.config_files import resolve_config

README = Path(__file__).resolve().parents[4] / "README.md"


def readme_commands() -> list[list[str]]:
    """Every ``thundersync ...`` command of the README's bash blocks, in order, as argv."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", README.read_text(), re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words[:1] == ["thundersync"]:
                commands.append(words[1:])
    return commands


class StubModel:
    def save_pretrained(self, folder: Path) -> None:
        (Path(folder) / "config.json").write_text("{}")


class StubTokenizer:
    def save_pretrained(self, folder: Path) -> None:
        pass


def run_checkpoints(argv: list[str], saved: dict[str, dict]) -> None:
    """Save and rotate the checkpoints ``train argv`` would (every checkpoint_every steps and
    at the end, the keep_checkpoints newest kept), continuing a resumed run's."""
    args = build_parser().parse_args(["train", *argv])
    out = args.out or "runs/train"
    config = resolve_config(args, saved.get(out) if args.resume else None)
    saved[config.out] = config.to_dict()
    folder = Path(config.out) / "checkpoints"
    done = int(list_checkpoints(folder)[-1].name.split("-")[1]) if args.resume else 0
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    for completed in range(done + 1, config.steps + 1):
        if completed % config.checkpoint_every == 0 or completed == config.steps:
            save_checkpoint(
                folder,
                StubModel(),
                StubTokenizer(),
                optimizer,
                completed_steps=completed,
                policy_version=completed,
                keep=config.keep_checkpoints,
            )


def test_the_readme_keeps_every_checkpoint_it_evaluates(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    commands = readme_commands()
    trains = [c[1:] for c in commands if c[0] == "train"]
    evaluated = [
        c[c.index("--checkpoint") + 1] for c in commands if c[0] == "eval" and "--checkpoint" in c
    ]
    assert any("--resume" in t for t in trains) and evaluated  # the sequence is still there
    saved: dict[str, dict] = {}
    for argv in trains:
        run_checkpoints(argv, saved)
    trained = {Path(out) for out in saved}
    checked = [c for c in evaluated if Path(c).parent.parent in trained]  # not compare's runs
    assert checked, (evaluated, trained)
    for checkpoint in checked:
        kept = [p.name for p in list_checkpoints(Path(checkpoint).parent)]
        assert Path(checkpoint).name in kept, (checkpoint, kept)
