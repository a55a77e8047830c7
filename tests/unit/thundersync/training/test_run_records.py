"""TrainConfig flags and files, checkpoints, batch bookkeeping and metrics records."""

from __future__ import annotations

import argparse
import importlib.util
import json

import pytest
import torch

from thundersync import events as ev
from thundersync.training import checkpoint as ckpt
from thundersync.training.config import TrainConfig
from thundersync.training.config_files import (
    add_config_flags,
    load_config_file,
    resolve_config,
)
from thundersync.training.run_metrics import (
    BatchTracker,
    MetricsLogger,
    read_metrics,
    step_number,
    truncate_metrics,
)


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    return parser.parse_args(list(argv))


def test_every_field_is_a_flag_and_flags_override_the_file(tmp_path):
    file = tmp_path / "run.toml"
    file.write_text('mode = "sync"\nsteps = 7\nenv_kwargs = { tool_latency_s = 0.5 }\n')
    args = parse("--steps", "3", "--no-deterministic", "--objective", '{"loss_agg": "token-mean"}')
    config = resolve_config(args, load_config_file(file))
    assert (config.mode, config.steps, config.deterministic) == ("sync", 3, False)
    assert config.env_kwargs == {"tool_latency_s": 0.5}
    assert config.objective == {"loss_agg": "token-mean"}
    assert resolve_config(parse(), {}) == TrainConfig()


@pytest.mark.parametrize(
    "values, field",
    [
        ({"mode": "fast"}, "mode"),
        ({"staleness": 0}, "staleness"),
        ({"algo": "opd"}, "teacher"),
        ({"engine": "sglang"}, "engine"),
        ({"engine": "vllm", "dtype": "float64"}, "dtype"),
        ({"steps": -1}, "steps"),
        ({"objective": {"bogus": 1}}, "objective"),
        ({"objective": {"loss_agg": "x"}}, "objective"),
        ({"mode": "async", "algo": "opd", "teacher": "t"}, "async"),
        ({"mode": "async", "objective": {"tis_cap": 2.0}}, "async"),
        ({"device": "gpu"}, "device"),
        ({"device": "cuda:1", "learner_ranks": 2}, "device"),
        ({"device": "cuda:0", "backend": "ray"}, "device"),
        ({"device": "cuda", "backend": "ray", "learner_ranks": 2}, "device"),
    ],
)
def test_a_bad_config_names_the_field(values, field):
    with pytest.raises(ValueError, match=field):
        TrainConfig(**values)


def test_an_unknown_env_or_a_missing_model_folder_is_named_before_any_work(tmp_path):
    from thundersync.training.checks import check_inputs

    with pytest.raises(ValueError, match=r"'env'.*'nope/X-v0'.*thundersync/ToySum-v0"):
        check_inputs(TrainConfig(env="nope/X-v0"))
    with pytest.raises(ValueError, match=r"'model'.*not a checkpoint folder"):
        check_inputs(TrainConfig(model=str(tmp_path)))
    check_inputs(TrainConfig())  # the defaults: a registered env and a tiny model built later


@pytest.mark.parametrize(
    ("env_kwargs", "says"),
    [
        ({"tools": "pyth"}, "tools: expected 'sandbox' or 'python'"),
        ({"colour": 1}, r"unknown keyword\(s\) 'colour'; env keywords: \[.*'tools'\]"),
    ],
)
def test_env_kwargs_the_env_refuses_are_named_before_any_worker_starts(env_kwargs, says):
    from thundersync.training.checks import check_inputs

    with pytest.raises(ValueError, match=rf"'env_kwargs'.*ToySum-v0.*{says}"):
        check_inputs(TrainConfig(env_kwargs=env_kwargs))


def test_a_device_the_machine_lacks_is_named_before_any_work(monkeypatch):
    from thundersync.training.checks import check_inputs
    from thundersync.training.learner_setup import rank_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    check_inputs(TrainConfig(device="cuda"))
    with pytest.raises(ValueError, match=r"'device'.*needs 2 CUDA GPU\(s\) \(one per learner rank"):
        check_inputs(TrainConfig(device="cuda", learner_ranks=2))
    with pytest.raises(ValueError, match=r"'device'.*'cuda:1'.*needs 2 CUDA GPU"):
        check_inputs(TrainConfig(device="cuda:1"))
    check_inputs(TrainConfig(device="cuda", backend="ray"))  # the trainer's learner: one GPU
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for backend in ("local", "ray"):
        with pytest.raises(ValueError, match=r"'device'.*this machine has 0"):
            check_inputs(TrainConfig(device="cuda", backend=backend))
    assert [rank_device("cuda", r) for r in (0, 1)] == ["cuda:0", "cuda:1"]
    assert (rank_device("cuda:3", 0), rank_device("cpu", 2)) == ("cuda:3", "cpu")


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_the_vllm_engine_without_vllm_says_how_to_install_it():
    from thundersync.training.checks import check_inputs

    with pytest.raises(ValueError, match=r"'engine'.*make test-vllm"):
        check_inputs(TrainConfig(engine="vllm"))


def test_unknown_file_keys_are_named(tmp_path):
    file = tmp_path / "run.json"
    file.write_text(json.dumps({"step": 3}))
    with pytest.raises(ValueError, match=r"unknown config field\(s\) \['step'\]"):
        load_config_file(file)


def test_a_runs_config_json_with_its_warnings_loads_as_a_config_again(tmp_path):
    """config.json keeps the warnings a run printed (not a config field): ``--resume`` and
    ``--config run/config.json`` read the config it holds, the warnings left out."""
    from thundersync.training.config_files import load_saved_config

    config = TrainConfig(steps=3, env_kwargs={"strict_grading": False})
    assert len(config.warnings()) == 1 and "strict grading is off" in config.warnings()[0]
    assert TrainConfig().warnings() == []
    saved = tmp_path / "config.json"
    saved.write_text(json.dumps(config.record()))
    assert json.loads(saved.read_text())["warnings"] == config.warnings()
    for load in (load_saved_config, load_config_file):
        assert resolve_config(parse(), load(saved)) == config


def test_checkpoints_are_complete_pruned_and_restorable(tiny_model_dirs, tmp_path):
    from thundersync.models import load_model, load_tokenizer

    model = load_model(tiny_model_dirs["gpt2"])
    tokenizer = load_tokenizer(tiny_model_dirs["gpt2"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(input_ids=torch.tensor([[5, 6]])).logits.sum().backward()
    optimizer.step()
    folder = tmp_path / "checkpoints"
    (folder / ".tmp-step-000009-1").mkdir(parents=True)  # a killed save
    for steps in (1, 2, 3):
        ckpt.save_checkpoint(
            folder, model, tokenizer, optimizer, completed_steps=steps, policy_version=steps, keep=2
        )
    assert [p.name for p in ckpt.list_checkpoints(folder)] == ["step-000002", "step-000003"]
    ckpt.remove_temporaries(folder)
    assert not list(folder.glob(".tmp-*"))
    state = ckpt.load_state(folder / "step-000003")
    assert state["completed_steps"] == 3 and state["policy_version"] == 3
    restored = torch.optim.AdamW(load_model(folder / "step-000003").parameters(), lr=0.1)
    restored.load_state_dict(state["optimizer"])
    a, b = optimizer.state_dict()["state"][0], restored.state_dict()["state"][0]
    assert torch.equal(a["exp_avg"], b["exp_avg"])


def episode_events(eid: str, reward: float, turns: int, *, infra: bool = False) -> list:
    out: list = [
        ev.EpisodeStarted(
            episode_id=eid,
            group_id="g",
            group_size=2,
            task_id="t",
            prompt_ids=(1,),
            policy_version=0,
        )
    ]
    for k in range(turns):
        out.append(
            ev.TurnCompleted(
                episode_id=eid,
                turn=k,
                action_ids=(2, 3),
                action_logprobs=(-1.0, -2.0),
                policy_version=0,
            )
        )
    out.append(ev.EpisodeCompleted(episode_id=eid, num_turns=turns, stop_reason="submitted"))
    out.append(ev.RewardReady(episode_id=eid, reward=reward, infra_failure=infra))
    return out


def test_a_batch_is_complete_with_every_reward_and_for_opd_every_teacher_score():
    grpo = BatchTracker(0, frozenset({"a", "b"}), needs_teacher=False)
    opd = BatchTracker(0, frozenset({"a", "b"}), needs_teacher=True)
    for tracker in (grpo, opd):
        for e in episode_events("a", 1.0, 2) + episode_events("b", 0.0, 1, infra=True)[:-1]:
            tracker.apply(e)
        assert not tracker.complete
        tracker.apply(ev.RewardReady(episode_id="b", reward=0.0, infra_failure=True))
    assert grpo.complete and not opd.complete
    for eid, turn in (("a", 0), ("a", 1), ("b", 0)):
        opd.apply(ev.TeacherScored(episode_id=eid, turn=turn, teacher_logprobs=(-1.5, -1.5)))
    assert opd.complete
    stats = opd.stats()
    assert stats["reward_mean"] == 1.0 and stats["num_infra_failures"] == 1
    assert stats["num_action_tokens"] == 6 and stats["teacher_kl"] == pytest.approx(0.0)
    assert len(opd.take()) == 12 and opd.take() == []


def test_metrics_are_strict_json_and_a_resume_drops_the_steps_it_redoes(tmp_path):
    logger = MetricsLogger(tmp_path, tensorboard=False, wandb=False, config={})
    for step in range(3):
        logger.log({"step": step, "loss": float("nan") if step == 1 else 1.0})
    logger.close()
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert json.loads(lines[1])["loss"] is None
    truncate_metrics(tmp_path / "metrics.jsonl", 2)
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # records without step_base count from 0: renumbered from 1


def test_a_resume_keeps_the_steps_its_checkpoint_holds_in_either_numbering(tmp_path):
    """Step N's record (counted from 1) survives a resume from ``step-00000N``; an old run's
    records (counted from 0, no ``step_base``) are renumbered, so the file stays uniform."""
    new, old = tmp_path / "new.jsonl", tmp_path / "old.jsonl"
    new.write_text("".join(json.dumps({"step": n, "step_base": 1}) + "\n" for n in (1, 2, 3)))
    old.write_text("".join(json.dumps({"step": n}) + "\n" for n in (0, 1, 2)))
    for path in (new, old):
        truncate_metrics(path, 2)
        assert [step_number(r) for r in read_metrics(path)] == [1, 2]
        assert [json.loads(x) for x in path.read_text().splitlines()] == [
            {"step": 1, "step_base": 1},
            {"step": 2, "step_base": 1},
        ]


DEEP = "[" * 10_000 + "]" * 10_000


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("run.json", '{"env_kwargs": {"x": ' + DEEP + "}}"),
        ("run.toml", "env_kwargs = {x = " + DEEP + "}"),
    ],
    ids=["json", "toml"],
)
def test_a_config_file_nested_10000_deep_is_a_one_line_error_and_exit_2(
    tmp_path, capsys, name, text
):
    from thundersync.cli import main

    file = tmp_path / name
    file.write_text(text)
    assert main(["train", "--config", str(file), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    problem = "not a readable JSON/TOML config: nested more than 100 levels deep"
    assert err == f"train: error: {file}: {problem}\n"


def test_a_resumed_runs_config_json_is_read_bounded(tmp_path, capsys):
    from thundersync.cli import main

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.json").write_text(DEEP)
    assert main(["train", "--resume", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "config.json: nested more than 100 levels deep" in err and err.count("\n") == 1


def test_json_on_the_command_line_is_read_bounded(capsys):
    from thundersync.cli import main

    assert main(["train", "--env-kwargs", '{"x": ' + DEEP + "}"]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    assert "nested more than 100 levels deep" in err and len(err) < 500


def test_the_step_line_says_how_many_episodes_were_infrastructure_failures():
    """A server that is down makes every episode an infra failure: the console says so instead
    of only 'reward mean n/a'."""
    from thundersync.training.telemetry import progress_line

    metrics = {
        "step": 1,
        "reward_mean": None,
        "accuracy": None,
        "num_episodes": 16,
        "num_infra_failures": 16,
        "step_time_s": 4.2,
        "breakdown_s": {},
    }
    line = progress_line(metrics, 1)
    assert line.endswith("; 16 infrastructure failure(s), not trained on (events.jsonl says why)")
    assert "infrastructure" not in progress_line({**metrics, "num_infra_failures": 0}, 1)


def test_the_progress_line_says_where_the_envs_episodes_are_graded() -> None:
    """ToySum with in-process tools grades in the trainer's process, not in a sandbox the
    run's ``--sandbox`` names (the first hour's line said bwrap)."""
    from thundersync.training.checks import check_env_kwargs, grading_place_of

    config = TrainConfig(env_kwargs={"tools": "python"})
    check_env_kwargs(config)
    assert grading_place_of(config) == "in this process"
    sandboxed = TrainConfig(env_kwargs={"num_keys": 4})
    check_env_kwargs(sandboxed)
    assert grading_place_of(sandboxed) == "in the bwrap sandbox"


def test_an_async_steps_line_says_its_batch_rolled_out_during_earlier_steps():
    """Async hands a batch out while older steps run: its step can end 0.2 s after the
    previous one with nearly nothing in its window. The line says the batch is older."""
    from thundersync.training.telemetry import progress_line

    metrics = {
        "step": 2,
        "reward_mean": 0.5,
        "accuracy": 0.5,
        "num_episodes": 16,
        "step_time_s": 0.2,
        "submitted_at": 10.0,
        "finished_at": 12.1,
        "breakdown_s": {"engine": 0.06},
    }
    line = progress_line(metrics, 6)
    assert "wall-clock 0.20 s since the previous step" in line
    assert "its batch was handed out 2.10 s before, during earlier steps" in line
    sync = progress_line({**metrics, "step_time_s": 2.1}, 6)  # handed out at its step's start
    assert "handed out" not in sync
