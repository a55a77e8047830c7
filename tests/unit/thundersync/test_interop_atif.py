"""ATIF out and in (thundersync/interop): documents our models' ``atif`` validates, a bitwise
round trip of token ids and log-probs, refusals of what cannot be trained on, ``export``'s
one-line errors, and ``verify --trajectories`` on a user's own batch."""

from __future__ import annotations

import json
import random
import sys

import pytest

atif = pytest.importorskip("atif", reason="the interop extra: pip install -e '.[interop]'")

from thundersync import events as ev  # noqa: E402
from thundersync.cli import main  # noqa: E402
from thundersync.core.random_batches import BatchShape, random_episode_events  # noqa: E402
from thundersync.interop.atif import (  # noqa: E402
    TrajectoryRefused,
    episodes,
    load_atif,
    to_atif,
)
from thundersync.protocol.types import Trajectory, Turn  # noqa: E402

VOCAB = 500
SHAPE = BatchShape(max_turns=4, max_tokens=60, infra_failure_rate=0.2)


def batch(seed: int = 0, *, groups: int = 3, size: int = 3, teacher: bool = False) -> list:
    """Episode events in causal order, groups with unequal rewards, one with an extra tool
    result after the last action."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        for i in range(size):
            out += random_episode_events(
                rng,
                VOCAB,
                SHAPE,
                episode_id=f"s{g}-g{g}-e{i}",
                group_id=f"s{g}-g{g}",
                group_size=size,
                policy_version=g,
                teacher=teacher,
            )
    return out


def write_docs(events: list, folder) -> list[dict]:
    folder.mkdir(parents=True, exist_ok=True)
    done, incomplete = episodes(events)
    assert not incomplete
    docs = []
    for episode in done:
        doc = to_atif(episode, session_id="run").to_json_dict()
        (folder / f"{episode.started.episode_id}.json").write_text(json.dumps(doc))
        docs.append(doc)
    return docs


def canonical(events: list) -> list:
    return sorted(events, key=lambda e: (e.episode_id, type(e).__name__, getattr(e, "turn", -1)))


@pytest.mark.parametrize("teacher", [False, True])
def test_episodes_round_trip_bitwise_through_validated_atif_documents(tmp_path, teacher):
    events = batch(1, teacher=teacher)
    docs = write_docs(events, tmp_path / "atif")
    for doc in docs:  # the package's own models accept every document, as JSON
        assert atif.Trajectory.model_validate(json.loads(json.dumps(doc))).schema_version == (
            "ATIF-v1.8"
        )
    back = load_atif([tmp_path / "atif"])
    assert canonical(back) == canonical(events)  # ids, log-probs (floats), versions, t
    for a, b in zip(canonical(back), canonical(events), strict=True):
        for name in ("action_logprobs", "teacher_logprobs"):
            if hasattr(a, name):
                assert [x.hex() for x in getattr(a, name)] == [x.hex() for x in getattr(b, name)]


def test_each_agent_step_holds_the_context_the_policy_saw(tmp_path):
    """An independent reference: ``types.Trajectory.context_ids`` built from the events."""
    events = batch(2)
    done, _ = episodes(events)
    for episode in done:
        s = episode.started
        turns = tuple(
            Turn(
                t.action_ids,
                t.action_logprobs,
                t.policy_version,
                episode.tools[k].observation_ids if k in episode.tools else (),
            )
            for k, t in enumerate(episode.turns)
        )
        reference = Trajectory(
            s.episode_id, s.group_id, s.group_size, s.task_id, s.prompt_ids, turns
        )
        doc = to_atif(episode, session_id="run")
        agent = [step for step in doc.steps if step.source == "agent"]
        assert len(agent) == len(turns)
        for k, step in enumerate(agent):
            ids, _ = reference.context_ids(k)
            assert step.metrics.prompt_token_ids + [] == ids[: len(ids) - len(turns[k].action_ids)]
            assert step.metrics.completion_token_ids == list(turns[k].action_ids)
            assert step.extra["thundersync"]["policy_version"] == turns[k].policy_version
        assert doc.extra["reward"] == episode.reward.reward
        assert doc.extra["thundersync"]["infra_failure"] == episode.reward.infra_failure


def test_a_trajectory_without_token_ids_is_refused_for_training(tmp_path):
    docs = write_docs(batch(3, groups=1), tmp_path / "atif")
    doc = docs[0]
    del doc["steps"][1]["metrics"]["completion_token_ids"]
    path = tmp_path / "atif" / f"{doc['trajectory_id']}.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(TrajectoryRefused, match="re-tokenising the text") as info:
        load_atif([tmp_path / "atif"])
    assert str(path) in str(info.value) and "completion_token_ids" in str(info.value)


def text_only_doc(**step_extra) -> dict:
    return {
        "schema_version": "ATIF-v1.8",
        "agent": {"name": "other", "version": "1"},
        "extra": {"reward": 1.0, "task_id": "t"},
        "steps": [
            {"step_id": 1, "source": "user", "message": "add 2 and 3"},
            {"step_id": 2, "source": "agent", "message": "answer 5", **step_extra},
        ],
    }


def test_another_harness_trajectory_with_text_only_is_refused(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps(text_only_doc()))
    with pytest.raises(TrajectoryRefused, match="refused for training"):
        load_atif([tmp_path])


def test_another_harness_trajectory_with_token_ids_loads_as_our_events(tmp_path):
    """Observation ids are what the next prompt adds; the group is the task's attempts."""
    for name, reward in (("a", 1.0), ("b", 0.0)):
        doc = text_only_doc()
        doc["extra"]["reward"] = reward
        doc["steps"][1]["metrics"] = {
            "prompt_token_ids": [5, 6],
            "completion_token_ids": [7, 8],
            "logprobs": [-0.5, -0.25],
        }
        doc["steps"].append(
            {
                "step_id": 3,
                "source": "agent",
                "message": "done",
                "metrics": {
                    "prompt_token_ids": [5, 6, 7, 8, 9, 10],
                    "completion_token_ids": [11],
                    "logprobs": [-1.5],
                },
            }
        )
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    events = load_atif([tmp_path])
    started = [e for e in events if isinstance(e, ev.EpisodeStarted)]
    assert [(e.episode_id, e.group_id, e.group_size, e.prompt_ids) for e in started] == [
        ("a", "t", 2, (5, 6)),
        ("b", "t", 2, (5, 6)),
    ]
    tools = [e for e in events if isinstance(e, ev.ToolFinished)]
    assert [(e.turn, e.observation_ids) for e in tools] == [(0, (9, 10)), (0, (9, 10))]
    turns = [e for e in events if isinstance(e, ev.TurnCompleted) and e.episode_id == "b"]
    assert [(e.action_ids, e.action_logprobs) for e in turns] == [
        ((7, 8), (-0.5, -0.25)),
        ((11,), (-1.5,)),
    ]


def test_a_re_rendered_conversation_is_refused(tmp_path):
    doc = text_only_doc()
    doc["steps"][1]["metrics"] = {
        "prompt_token_ids": [5, 6],
        "completion_token_ids": [7],
        "logprobs": [-0.5],
    }
    step = {"step_id": 3, "source": "agent", "message": "x"}
    step["metrics"] = {"prompt_token_ids": [5, 6, 70, 9], "completion_token_ids": [1]}
    step["metrics"]["logprobs"] = [-1.0]
    doc["steps"].append(step)
    (tmp_path / "a.json").write_text(json.dumps(doc))
    with pytest.raises(TrajectoryRefused, match="do not extend the previous step"):
        load_atif([tmp_path])


# --- the export command ------------------------------------------------------------------------


def eval_folder(tmp_path, events):
    folder = tmp_path / "eval"
    folder.mkdir()
    (folder / "events.jsonl").write_text("")
    with ev.JsonlSink(folder / "trajectories.jsonl", lossless=True) as sink:
        for event in events:
            sink(event)
    return folder


def one_line_error(argv, capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    return err[0]


def test_export_writes_one_validated_document_per_episode(tmp_path, capsys):
    events = batch(4)
    folder = eval_folder(tmp_path, events)
    assert main(["export", "--format", "atif", str(folder), "--out", str(tmp_path / "o")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == "export: 9 episodes as ATIF-v1.8 documents", lines
    assert lines[-2].endswith(f"per episode in {tmp_path / 'o'}"), lines
    files = sorted((tmp_path / "o").glob("*.json"))
    assert len(files) == 9
    for file in files:
        atif.Trajectory.model_validate_json(file.read_text())
    assert canonical(load_atif([tmp_path / "o"])) == canonical(events)


def test_export_refuses_a_truncated_file_and_a_folder_without_token_ids(tmp_path, capsys):
    folder = eval_folder(tmp_path, batch(5))
    text = (folder / "trajectories.jsonl").read_text()
    (folder / "trajectories.jsonl").write_text(text[: len(text) - 40])
    line = one_line_error(["export", str(folder)], capsys)
    assert "trajectories.jsonl:" in line and "truncated" in line, line
    (folder / "trajectories.jsonl").unlink()  # an older run folder: counts only
    line = one_line_error(["export", str(folder)], capsys)
    assert "holds token counts, not token ids" in line, line
    line = one_line_error(["export", str(tmp_path / "nothing")], capsys)
    assert line == f"export: error: {tmp_path / 'nothing'}: no such folder"
    line = one_line_error(["export", str(tmp_path)], capsys)
    assert "not a run folder" in line


def test_export_without_the_extra_says_how_to_install_it(tmp_path, capsys, monkeypatch):
    folder = eval_folder(tmp_path, batch(6))
    monkeypatch.setitem(sys.modules, "atif", None)  # import atif raises ImportError
    line = one_line_error(["export", str(folder)], capsys)
    assert "pip install 'thundersync[interop]'" in line


# --- verify on a user's trajectories -------------------------------------------------------


@pytest.fixture
def tiny_gpt2(tiny_model_dirs):
    return tiny_model_dirs["gpt2"]


def test_verify_certifies_a_users_trajectories(tmp_path, tiny_gpt2, capsys):
    write_docs(batch(10, groups=2, size=2), tmp_path / "atif")
    argv = ["verify", "--trajectories", str(tmp_path / "atif"), "--model", str(tiny_gpt2)]
    code = main([*argv, "--algo", "grpo", "--json"])
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 0, captured.err
    assert len(report["results"]) == 9 and all(r["trials"] == 2 for r in report["results"])
    assert not any(r["zero_gradient"] for r in report["results"])
    assert report["trajectories"].startswith("trajectories: 4 episodes, 2 groups (2 with unequal")


def test_verify_refuses_a_log_prob_no_softmax_gives(tmp_path, tiny_gpt2, capsys):
    """The certificate runs the learner's event checks: a log-prob above 0 is refused. A
    plausible wrong log-prob is not caught: sync and streaming fold the same value."""
    events = batch(8, groups=1)
    turn = next(e for e in events if isinstance(e, ev.TurnCompleted))
    bad = ev.TurnCompleted(
        t=turn.t,
        episode_id=turn.episode_id,
        turn=turn.turn,
        action_ids=turn.action_ids,
        action_logprobs=(2.0, *turn.action_logprobs[1:]),
        policy_version=turn.policy_version,
    )
    write_docs([bad if e is turn else e for e in events], tmp_path / "atif")
    argv = ["verify", "--trajectories", str(tmp_path / "atif"), "--model", str(tiny_gpt2)]
    line = one_line_error(argv, capsys)
    assert line.startswith(f"verify: error: --trajectories {tmp_path / 'atif'}: grpo: "), line
    assert turn.episode_id in line


@pytest.mark.parametrize(
    "text",
    ['{"a":' * 100_000 + "1" + "}" * 100_000, "[" * 100_000 + "]" * 100_000],
    ids=["objects", "lists"],
)
def test_verify_refuses_a_deeply_nested_document_as_bad_input(tmp_path, tiny_gpt2, capsys, text):
    """A document nested 100,000 deep is bad input (exit 2, one line naming the file), not a
    ``RecursionError`` traceback with exit 1, which the contract reads as a violation."""
    (tmp_path / "deep.json").write_text(text)
    argv = ["verify", "--trajectories", str(tmp_path), "--model", str(tiny_gpt2)]
    line = one_line_error(argv, capsys)
    assert str(tmp_path / "deep.json") in line and "nested more than 100 levels deep" in line


def test_verify_refuses_a_document_past_the_size_bound(tmp_path, tiny_gpt2, capsys, monkeypatch):
    """The bytes read are bounded before anything is parsed (the bound lowered here: a real
    one is hundreds of MiB)."""
    import thundersync.interop.atif as atif_module

    write_docs(batch(10, groups=1, size=2), tmp_path / "atif")
    monkeypatch.setattr(atif_module, "MAX_DOCUMENT_BYTES", 100)
    argv = ["verify", "--trajectories", str(tmp_path / "atif"), "--model", str(tiny_gpt2)]
    line = one_line_error(argv, capsys)
    assert "expected at most 100 bytes" in line and ".json" in line


def test_verify_on_tied_rewards_certifies_nothing(tmp_path, tiny_gpt2, capsys):
    events = [
        ev.RewardReady(t=e.t, episode_id=e.episode_id, reward=0.5)
        if isinstance(e, ev.RewardReady)
        else e
        for e in batch(9, groups=1, size=2)
    ]
    write_docs(events, tmp_path / "atif")
    argv = ["verify", "--trajectories", str(tmp_path / "atif"), "--model", str(tiny_gpt2)]
    assert main([*argv, "--algo", "grpo"]) == 1
    assert capsys.readouterr().out.strip().splitlines()[-1].endswith(": zero gradient")


def test_a_scripted_agents_turns_are_non_llm_steps_and_refused_for_training(tmp_path):
    """The oracle and nop agents sample nothing: ATIF's ``llm_call_count=0``, no metrics."""
    events = [
        ev.TurnCompleted(
            t=e.t,
            episode_id=e.episode_id,
            turn=e.turn,
            action_ids=(),
            action_logprobs=(),
            policy_version=0,
        )
        if isinstance(e, ev.TurnCompleted)
        else e
        for e in batch(11, groups=1, size=1)
    ]
    (doc,) = write_docs(events, tmp_path / "atif")
    agent = [step for step in doc["steps"] if step["source"] == "agent"]
    assert agent and all(s["llm_call_count"] == 0 and "metrics" not in s for s in agent)
    with pytest.raises(TrajectoryRefused, match="no metrics.prompt_token_ids"):
        load_atif([tmp_path / "atif"])


def test_export_of_a_compare_folder_writes_each_run_apart(tmp_path, capsys):
    for name, seed in (("sync-seed0", 12), ("streaming-seed0", 13)):
        run = eval_folder(tmp_path, batch(seed, groups=1, size=2))
        run.rename(tmp_path / name)
        (tmp_path / "cmp" / "runs").mkdir(parents=True, exist_ok=True)
        (tmp_path / name).rename(tmp_path / "cmp" / "runs" / name)
    assert main(["export", str(tmp_path / "cmp")]) == 0
    assert capsys.readouterr().out.strip().endswith("4 episodes as ATIF-v1.8 documents")
    for name in ("sync-seed0", "streaming-seed0"):
        assert len(list((tmp_path / "cmp" / "atif" / name).glob("*.json"))) == 2


def test_an_episode_played_again_after_a_resume_is_exported_as_replayed(tmp_path):
    first, again = batch(14, groups=1, size=1), batch(15, groups=1, size=1)
    done, incomplete = episodes([*first[:3], *again])  # the first play stopped mid-episode
    assert not incomplete and [e.events() for e in done] == [again]


# --- text of a training run's episodes --------------------------------------------------------


def train_folder(tmp_path, model, *, turns: list[tuple[str, str]]):
    """A train run folder (config.json names its model; no attempts.jsonl, whose text an eval
    keeps) of one episode: the instruction, then each turn's action and tool output as the
    rollout worker tokenises them."""
    from thundersync.models import load_tokenizer
    from thundersync.training.chat import ChatFormat

    chat = ChatFormat(load_tokenizer(model))
    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"mode": "sync", "model": str(model)}))
    (folder / "events.jsonl").write_text("")
    eid = "s0-g0-e0"
    started = ev.EpisodeStarted(
        t=0.0,
        episode_id=eid,
        group_id="s0-g0",
        group_size=1,
        task_id="t",
        prompt_ids=chat.prompt_ids(INSTRUCTION),
        policy_version=0,
    )
    events: list = [started]
    for k, (action, output) in enumerate(turns):
        ids = (*chat.content_ids(action), chat.end_of_turn_id)
        events.append(
            ev.TurnCompleted(
                t=1.0 + k,
                episode_id=eid,
                turn=k,
                action_ids=ids,
                action_logprobs=tuple([-0.5] * len(ids)),
                policy_version=0,
            )
        )
        observation = chat.observation_ids(output)
        events.append(
            ev.ToolFinished(
                t=1.5 + k,
                episode_id=eid,
                turn=k,
                observation_ids=observation,
                duration_s=0.1,
                exit_code=0,
                timed_out=False,
            )
        )
    events += [
        ev.EpisodeCompleted(t=9.0, episode_id=eid, num_turns=len(turns), stop_reason="submitted"),
        ev.RewardReady(t=9.5, episode_id=eid, reward=1.0, infra_failure=False, details={}),
    ]
    with ev.JsonlSink(folder / "trajectories.jsonl", lossless=True) as sink:
        for event in events:
            sink(event)
    return folder


INSTRUCTION = "Add the values of alpha and beta; write the sum to answer.txt."


def test_a_training_runs_export_has_the_text_its_model_saw(tmp_path, tiny_model_dirs, capsys):
    """A train run records token ids only; its model's tokenizer (config.json names it) gives
    back the text: the prompt's instruction, each action, each tool's output."""
    turns = [("```bash\nlookup alpha\n```", "17"), ("```bash\nanswer 42\n```", "<|im_end|> ok")]
    folder = train_folder(tmp_path, tiny_model_dirs["qwen3"], turns=turns)
    assert main(["export", str(folder), "--out", str(tmp_path / "o")]) == 0
    (file,) = (tmp_path / "o").glob("*.json")
    doc = atif.Trajectory.model_validate_json(file.read_text())
    assert doc.steps[0].message == INSTRUCTION
    agent = [step for step in doc.steps if step.source == "agent"]
    assert [step.message for step in agent] == [action for action, _ in turns]
    outputs = [step.observation.results[0].content for step in agent]
    assert outputs == [output for _, output in turns]
    assert "decoded" in doc.notes
    capsys.readouterr()


def test_an_export_records_the_lora_adapter_and_the_base_it_runs_on(tmp_path, capsys):
    from thundersync.interop.atif import EXTRA

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"base_model_name_or_path": "/models/base"}')
    folder = eval_folder(tmp_path, batch(1))
    config = {"agent": "policy", "checkpoint": str(adapter), "lora": {"rank": 4}}
    (folder / "config.json").write_text(json.dumps(config))
    assert main(["export", "--format", "atif", str(folder), "--out", str(tmp_path / "o")]) == 0
    doc = json.loads(next((tmp_path / "o").glob("*.json")).read_text())
    recorded = doc["agent"]["extra"][EXTRA]
    assert recorded["model"] == str(adapter) and recorded["base_model"] == "/models/base"
    assert recorded["lora"] == {"rank": 4}
