"""Trainer state files load without running code; a tampered or damaged one is a one-line
error naming it, and ``train --resume`` stops on it (exit 2) before anything starts."""

from __future__ import annotations

import builtins
import json
import random

import numpy as np
import pytest
import torch

from thundersync.cli import main
from thundersync.training import checkpoint as ckpt
from thundersync.training.config import TrainConfig


class Payload:
    """Unpickling this runs ``exec``, which creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.exec, (f"open({self.marker!r}, 'w').close()",)


def write_state(folder, state):
    folder.mkdir(parents=True)
    torch.save(state, folder / ckpt.STATE_FILE)
    return folder


def tampered_run(tmp_path):
    """A run folder whose newest checkpoint's trainer state carries a payload."""
    marker = tmp_path / "pwned"
    state = {"completed_steps": 1, "policy_version": 1, "optimizer": {}, "rng": Payload(marker)}
    write_state(tmp_path / "run" / "checkpoints" / "step-000001", state)
    config = TrainConfig(out=str(tmp_path / "run"), steps=1).to_dict()
    (tmp_path / "run" / "config.json").write_text(json.dumps(config))
    return tmp_path / "run", marker


def test_the_payload_of_a_tampered_state_never_runs(tmp_path):
    run, marker = tampered_run(tmp_path)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.load_state(run / "checkpoints" / "step-000001")
    message = str(info.value)
    assert "\n" not in message and len(message) < 500
    assert message.startswith(str(run / "checkpoints" / "step-000001" / ckpt.STATE_FILE))
    assert "could run code" in message
    assert not marker.exists()


def test_a_truncated_state_is_a_one_line_error_naming_the_file(tmp_path):
    folder = tmp_path / "step-000001"
    write_state(folder, {"completed_steps": 1, "policy_version": 1, "optimizer": {}, "rng": {}})
    file = folder / ckpt.STATE_FILE
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    with pytest.raises(ckpt.CheckpointError, match="not a readable trainer state") as info:
        ckpt.load_state(folder)
    assert str(info.value).startswith(f"{file}: ") and "\n" not in str(info.value)


def test_a_state_without_its_fields_is_refused(tmp_path):
    folder = write_state(tmp_path / "step-000001", {"completed_steps": 1})
    with pytest.raises(ckpt.CheckpointError, match="expected a trainer state with fields"):
        ckpt.load_state(folder)


def test_resume_from_a_tampered_run_exits_2_before_anything_runs(tmp_path, capsys):
    run, marker = tampered_run(tmp_path)
    assert main(["train", "--resume", "--out", str(run), "--steps", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("train: error: ") and err.count("\n") == 1
    assert ckpt.STATE_FILE in err and "could run code" in err
    assert not marker.exists()
    assert not (run / "metrics.jsonl").exists()  # the trainer never started


def test_a_state_in_another_steps_folder_is_refused_naming_both(tmp_path):
    """``step-000002`` holding step 1's state (copied by hand) would resume after step 1 and
    apply update 2 a second time on top of weights that already hold it."""
    state = {"completed_steps": 1, "policy_version": 1, "optimizer": {}, "rng": {}}
    folder = write_state(tmp_path / "checkpoints" / "step-000002", state)
    with pytest.raises(ckpt.CheckpointError) as info:
        ckpt.check_resumable(tmp_path / "checkpoints")
    message = str(info.value)
    assert message.startswith(f"{folder / ckpt.STATE_FILE}: ") and "\n" not in message
    assert "after step 1" in message and "step-000002" in message and "step 2" in message


def test_a_state_saved_before_rng_states_were_plain_data_still_resumes(tmp_path):
    """Run folders written by the previous version hold numpy's RNG state as an ndarray."""
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    old = {
        "completed_steps": 4,
        "policy_version": 4,
        "optimizer": {"state": {}, "param_groups": []},
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
            "torch": torch.get_rng_state(),
        },
    }
    expected = (random.random(), np.random.rand(), torch.rand(1))
    folder = write_state(tmp_path / "step-000004", old)
    state = ckpt.load_state(folder)
    ckpt.restore_rng(state)
    assert state["completed_steps"] == 4
    assert (random.random(), np.random.rand()) == expected[:2]
    assert torch.equal(torch.rand(1), expected[2])


def test_a_saved_state_holds_only_plain_data_and_restores_every_rng(tiny_model_dirs, tmp_path):
    from thundersync.models import load_model, load_tokenizer

    model = load_model(tiny_model_dirs["gpt2"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    np.random.seed(5)
    np.random.randn()  # a cached gaussian is part of numpy's state
    folder = ckpt.save_checkpoint(
        tmp_path,
        model,
        load_tokenizer(tiny_model_dirs["gpt2"]),
        optimizer,
        completed_steps=1,
        policy_version=1,
        keep=1,
    )
    expected = (random.random(), np.random.randn(), np.random.rand(), torch.rand(1))
    assert torch.serialization.get_unsafe_globals_in_checkpoint(folder / ckpt.STATE_FILE) == []
    ckpt.restore_rng(ckpt.load_state(folder))
    assert (random.random(), np.random.randn(), np.random.rand()) == expected[:3]
    assert torch.equal(torch.rand(1), expected[3])
