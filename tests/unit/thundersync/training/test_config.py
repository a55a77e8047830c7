"""TrainConfig's declaration: every hostile value is one line and exit 2 before any worker
starts, whether it comes from a flag, a JSON or a TOML file; the run folder is proven
writable; the choices come from the Literals; config.json stays strict JSON."""

from __future__ import annotations

import json
import math
import typing
from pathlib import Path

import pytest

from thundersync.cli import main
from thundersync.training import checks
from thundersync.training import config as config_module
from thundersync.training.checks import check_inputs
from thundersync.training.config import TrainConfig


@pytest.fixture
def no_worker(monkeypatch):
    """Fail the test if a run gets as far as making its Trainer (which starts workers)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a Trainer was made: the bad input reached the workers")

    monkeypatch.setattr("thundersync.training.trainer.Trainer", refuse)


def refused(argv: list[str], capsys) -> str:
    """The one stderr line of a command that must exit 2."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(err) == 1, err
    return err[0]


HOSTILE = [
    ("lr", math.nan, "finite"),
    ("lr", -1.0, "greater than 0"),
    ("lr", 0, "greater than 0"),
    ("lr", math.inf, "finite"),
    ("max_grad_norm", -1.0, "greater than or equal to 0"),
    ("micro_batch_size", 0, ">= 1"),
    ("learner_threads", 0, ">= 1"),
    ("max_concurrency", -1, ">= 0"),
    ("steps", 1e400, "valid integer"),
    ("steps", 2.5, "valid integer"),
    ("staleness", 1.0, "valid integer"),
    ("tasks_per_step", True, "valid integer"),
    ("temperature", math.nan, "finite"),
    ("temperature", -0.5, "greater than or equal to 0"),
    ("weight_decay", math.inf, "finite"),
    ("batch_window_s", math.nan, "finite"),
    ("worker_timeout_s", math.inf, "finite"),
    ("keep_checkpoints", 0, ">= 1"),
    ("seed", -1, ">= 0"),
    ("dtype", "float16", "float32"),
    ("mode", "fast", "'sync', 'async' or 'streaming'"),
    ("device", "gpu", "cpu, cuda or cuda:N"),
]
IDS = [f"{name}={value!r}" for name, value, _ in HOSTILE]


def _says(expected: str) -> str:
    return expected.replace(">= ", "greater than or equal to ")


@pytest.mark.parametrize(("name", "value", "says"), HOSTILE, ids=IDS)
def test_a_hostile_value_in_a_json_config_file_is_one_line_naming_file_and_field(
    name, value, says, tmp_path, capsys, no_worker
):
    file = tmp_path / "run.json"
    file.write_text(json.dumps({name: value}))  # NaN and Infinity as Python writes them
    line = refused(["train", "--config", str(file)], capsys)
    assert f"config field {name!r}" in line and str(file) in line and _says(says) in line


@pytest.mark.parametrize(("name", "value", "says"), HOSTILE, ids=IDS)
def test_a_hostile_value_as_a_flag_is_one_line_naming_the_flag(
    name, value, says, capsys, no_worker
):
    if isinstance(value, bool):
        text = "true"
    elif isinstance(value, float) and value == 1e400:
        text = "1e400"
    else:
        text = str(value)
    line = refused(["train", f"--{name.replace('_', '-')}", text], capsys)
    flag = f"--{name.replace('_', '-')}"
    assert line.startswith(f"train: error: {flag}:") and _says(says) in line, line


def test_a_toml_file_is_held_to_the_same_declaration(tmp_path, capsys, no_worker):
    file = tmp_path / "run.toml"
    file.write_text("lr = nan\n")
    assert "config field 'lr': input should be a finite number" in refused(
        ["train", "--config", str(file)], capsys
    )
    file.write_text("steps = 1e400\n")
    assert "config field 'steps': input should be a valid integer" in refused(
        ["train", "--config", str(file)], capsys
    )


def test_booleans_are_booleans(tmp_path, capsys, no_worker):
    file = tmp_path / "run.json"
    file.write_text('{"deterministic": "false"}')
    line = refused(["train", "--config", str(file)], capsys)
    assert "'deterministic': input should be a valid boolean, got 'false'" in line
    with pytest.raises(ValueError, match="'early_start'.*valid boolean"):
        TrainConfig(early_start=1)


def test_keep_checkpoints_is_its_own_problem():
    with pytest.raises(ValueError, match=r"^config field 'keep_checkpoints'"):
        TrainConfig(keep_checkpoints=0)


@pytest.mark.parametrize(
    ("objective", "says"),
    [
        ({"clip_eps": 0.2}, r"unknown keyword\(s\) \['clip_eps'\] of GRPO"),
        ({"kl_coef": -0.1}, "GRPO keyword 'kl_coef': input should be greater than or equal to 0"),
        ({"kl_coef": math.inf}, "GRPO keyword 'kl_coef': input should be a finite number"),
        ({"clip_low": 1.0}, "GRPO keyword 'clip_low': input should be less than 1"),
        ({"clip_high": math.nan}, "GRPO keyword 'clip_high': input should be a finite number"),
        ({"eps": -1e-6}, "GRPO keyword 'eps'"),
        ({"tis_cap": 0.0}, "GRPO keyword 'tis_cap'"),
        ({"max_tokens": 0}, "GRPO keyword 'max_tokens'"),
        ({"max_tokens": 10.5}, "GRPO keyword 'max_tokens': input should be a valid integer"),
        ({"scale_by_std": "no"}, "GRPO keyword 'scale_by_std': input should be a valid boolean"),
        ({"dynamic_sampling": True, "max_groups": 0}, "GRPO keyword 'max_groups'"),
        ({"kl_estimator": "k2"}, "GRPO keyword 'kl_estimator'"),
    ],
)
def test_each_objective_keyword_is_typed_and_ranged(objective, says):
    with pytest.raises(ValueError, match=rf"^config field 'objective': .*{says}"):
        TrainConfig(objective=objective)


def test_nan_never_reaches_config_json(capsys, no_worker):
    with pytest.raises(ValueError, match=r"'env_kwargs': \['x'\]\[0\] is NaN or infinite"):
        TrainConfig(env_kwargs={"x": [math.inf]})
    line = refused(["train", "--env-kwargs", '{"tool_latency_s": NaN}'], capsys)
    assert "--env-kwargs" in line and "NaN is not strict JSON" in line


def test_learner_ranks_are_at_most_the_cores_unless_ray_places_them(monkeypatch, tmp_path):
    monkeypatch.setattr(checks, "usable_cores", lambda: 2)
    out = str(tmp_path / "run")
    check_inputs(TrainConfig(learner_ranks=2, out=out))
    with pytest.raises(ValueError, match=r"'learner_ranks': 1000 ranks on a machine with 2 core"):
        check_inputs(TrainConfig(learner_ranks=1000, out=out))
    monkeypatch.setattr(checks.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setattr(checks, "check_env_kwargs", lambda config: None)
    check_inputs(TrainConfig(learner_ranks=1000, backend="ray", out=out))  # the cluster decides


@pytest.mark.parametrize("where", ["file", "proc", "under-a-file"])
def test_a_run_folder_that_cannot_be_written_is_refused(where, tmp_path, capsys, no_worker):
    file = tmp_path / "taken"
    file.write_text("")
    out = {"file": file, "proc": Path("/proc/thundersync-run"), "under-a-file": file / "run"}[where]
    line = refused(["train", "--out", str(out), "--steps", "1"], capsys)
    assert line.startswith(f"train: error: config field 'out': {out}:"), line


def test_a_run_folder_is_proven_writable_and_left_as_it_was(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match=r"'out'.*not writable"):
        check_inputs(TrainConfig(out=str(tmp_path / "file" / "run")))
    (tmp_path / "file").unlink()
    out = tmp_path / "a" / "b" / "run"
    check_inputs(TrainConfig(out=str(out)))
    assert list(tmp_path.iterdir()) == []  # the probe and the folders made for it are gone
    out.mkdir(parents=True)
    (out / "keep").write_text("x")
    check_inputs(TrainConfig(out=str(out)))
    assert [p.name for p in out.iterdir()] == ["keep"]


def test_resume_without_a_run_names_the_folder(tmp_path, capsys, no_worker):
    out = tmp_path / "empty"
    line = refused(["train", "--resume", "--out", str(out)], capsys)
    assert f"--resume: {out} holds no run" in line
    assert not out.exists()


def test_the_choices_are_the_literals_and_old_config_json_still_loads():
    hints = typing.get_type_hints(TrainConfig)
    assert config_module.MODES == typing.get_args(hints["mode"]) == ("sync", "async", "streaming")
    assert typing.get_args(hints["engine"]) == config_module.ENGINES
    saved = json.loads(json.dumps(TrainConfig(lr=1).to_dict(), allow_nan=False))
    assert saved["lr"] == 1.0 and isinstance(saved["lr"], float)
    assert TrainConfig(**saved) == TrainConfig(lr=1.0)
