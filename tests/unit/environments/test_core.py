"""ShellEnv: spaces, reset/step semantics, submission, limits, grading and infra failures."""

from __future__ import annotations

import gymnasium as gym
import pytest

from environments.actions import format_action
from environments.core import ShellEnv, UnicodeText
from environments.tasks import Grade
from tests.unit.environments.shell_fakes import FileTask, SandboxMaker
from thundersync.protocol.types import StopReason


def make_env(maker: SandboxMaker | None = None, **kwargs) -> ShellEnv:
    return ShellEnv([FileTask()], sandbox=maker or SandboxMaker(), **kwargs)


def test_text_space_accepts_any_unicode_up_to_its_length():
    space = UnicodeText(40)
    assert "ls -la | grep 'x' && echo $?" in space
    assert "héllo wörld ✓\n\t" in space
    assert "" in space
    assert "x" * 41 not in space
    assert b"bytes" not in space
    assert all(space.sample() in space for _ in range(20))


def test_text_space_is_gymnasiums_printable_text_space_with_its_own_rng():
    # UnicodeText shares the charset tables instead of running Text.__init__: it must still be
    # the Text space it claims to be (a gymnasium upgrade that adds an attribute shows here).
    import string

    from gymnasium import spaces

    space, text = UnicodeText(40, seed=3), spaces.Text(40, min_length=0, charset=string.printable)
    assert space == text and space.character_list == text.character_list
    assert {
        k: v for k, v in vars(space).items() if k not in ("_np_random", "sample_max_length")
    } == {k: v for k, v in vars(text).items() if k != "_np_random"}
    other = UnicodeText(40, seed=3)
    assert space.np_random is not other.np_random
    assert [space.sample() for _ in range(3)] == [other.sample() for _ in range(3)]
    with pytest.raises(ValueError, match="max_length"):
        UnicodeText(-1)


def test_reset_returns_instruction_and_makes_a_fresh_sandbox_each_time():
    maker = SandboxMaker()
    env = make_env(maker)
    obs, info = env.reset(seed=0)
    assert obs == "Write ok to answer.txt."
    assert info == {"task_id": "file-task", "infra_failure": False}
    env.reset(seed=1)
    assert len(maker.made) == 2 and maker.made[0].closed and not maker.made[1].closed
    env.close()
    assert maker.num_open == 0


def test_step_runs_the_command_and_files_persist():
    env = make_env()
    env.reset(options={"task": "file-task"})
    obs, reward, terminated, truncated, info = env.step(format_action("echo hi > f.txt"))
    assert (obs, reward, terminated, truncated) == ("", 0.0, False, False)
    assert info["tool"]["exit_code"] == 0 and info["turn"] == 0
    assert info["termination_reason"] is None
    obs, *_, info = env.step("Now read it.\n```bash\ncat f.txt\n```")
    assert obs == "hi\n" and info["turn"] == 1
    obs, *_ = env.step(format_action("exit 3"))
    assert obs.endswith("[exit code 3]")
    env.close()


def test_submit_word_terminates_without_a_tool_call_and_grades():
    env = make_env()
    env.reset(options={"task": 0})
    env.step(format_action("echo ok > answer.txt"))
    obs, reward, terminated, truncated, info = env.step(format_action("submit"))
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert "tool" not in info
    assert info["termination_reason"] == StopReason.SUBMITTED
    with pytest.raises(gym.error.ResetNeeded):
        env.step(format_action("ls"))
    env.close()


def test_submission_marker_output_terminates_after_the_tool_call():
    env = make_env()
    env.reset()
    obs, reward, terminated, _, info = env.step(
        format_action("echo nope > answer.txt; echo THUNDERSYNC_SUBMIT; echo done")
    )
    assert terminated and reward == 0.0 and info["tool"]["exit_code"] == 0
    assert obs == "done\n"
    env.close()


def test_unparseable_actions_get_a_correction_and_truncate_at_the_limit():
    env = make_env(max_format_errors=2)
    env.reset()
    obs, _, terminated, truncated, info = env.step("just talking, no command")
    assert "exactly one ```bash block" in obs and not (terminated or truncated)
    assert "format_error" in info and "tool" not in info
    env.step(format_action("echo fine"))  # a good action resets the consecutive count
    env.step("```bash\nls\n```\n```bash\npwd\n```")
    obs, _, terminated, truncated, info = env.step("```bash\n\n```")
    assert truncated and not terminated
    assert info["termination_reason"] == StopReason.FORMAT_ERRORS
    env.close()


def test_max_turns_truncates_and_still_grades():
    env = make_env(max_turns=2)
    env.reset()
    env.step(format_action("echo ok > answer.txt"))
    _, reward, terminated, truncated, info = env.step(format_action("true"))
    assert truncated and not terminated and reward == 1.0
    assert info["termination_reason"] == StopReason.MAX_TURNS
    env.close()


def test_episode_time_limit_truncates():
    env = make_env(max_episode_s=0.3)
    env.reset()
    _, _, _, truncated, info = env.step(format_action("sleep 1"))
    assert truncated and info["termination_reason"] == StopReason.TIME_LIMIT
    assert info["tool"]["timed_out"]
    env.close()


def test_command_timeout_is_reported():
    task = FileTask(timeout_s=0.2)
    env = ShellEnv([task], sandbox=SandboxMaker())
    env.reset()
    obs, *_, info = env.step(format_action("sleep 2"))
    assert info["tool"]["timed_out"] and info["tool"]["exit_code"] is None
    assert "[command timed out after 0.2 s]" in obs
    env.close()


def test_the_graded_reward_comes_back_from_step_and_reward_wrappers_see_it():
    seen = []

    def before_grading(observation, info):
        seen.append((observation, info["termination_reason"], len(task.grade_started)))

    task = FileTask()
    env = gym.wrappers.TransformReward(ShellEnv([task], sandbox=SandboxMaker()), lambda r: 10 * r)
    env.reset(options={"before_grading": before_grading})
    env.step(format_action("echo ok > answer.txt"))
    _, reward, terminated, _, info = env.step(format_action("echo THUNDERSYNC_SUBMIT; echo bye"))
    assert terminated and reward == 10.0 and info["grade_details"]["output"] == "ok\n"
    # the hook ran once, with the final observation, before grading started
    assert seen == [("bye\n", StopReason.SUBMITTED, 0)] and len(task.grade_started) == 1
    env.close()


def test_the_grader_gets_a_context_with_fresh_sandboxes_it_closes_and_strictness():
    contexts = []

    class ContextTask(FileTask):
        def grade(self, sandbox, context):
            contexts.append(context)
            fresh = context.fresh_sandbox()
            fresh.execute("true", 5)
            return super().grade(sandbox, context)

    maker = SandboxMaker()
    for strict in (True, False):
        env = ShellEnv([ContextTask()], sandbox=maker, strict_grading=strict)
        env.reset()
        env.step(format_action("submit"))
        env.close()
    assert [c.strict for c in contexts] == [True, False]
    assert len(maker.made) == 4 and maker.num_open == 0


def test_each_episode_gets_its_own_artifacts_folder_named_by_its_id(tmp_path):
    folders = []

    class ArtifactsTask(FileTask):
        def grade(self, sandbox, context):
            folders.append(context.artifacts_dir)
            return super().grade(sandbox, context)

    env = ShellEnv([ArtifactsTask()], sandbox=SandboxMaker(), artifacts_dir=tmp_path)
    for options in ({"episode_id": "s1-g0-e2"}, {"episode_id": "../x y"}, {}, {}):
        env.reset(options=options)
        env.step(format_action("submit"))
    env.close()
    names = ["s1-g0-e2", "_x_y", "episode-3", "episode-4"]  # no id: never the same folder
    assert folders == [tmp_path / name for name in names]
    plain = ShellEnv([ArtifactsTask()], sandbox=SandboxMaker())
    plain.reset()
    plain.step(format_action("submit"))
    plain.close()
    assert folders[-1] is None  # nothing kept unless asked


def test_sandbox_failure_during_a_step_is_an_infra_failure_not_a_zero():
    maker = SandboxMaker(fail_on_call=2)  # call 1 is the task's setup
    env = make_env(maker)
    env.reset()
    _, reward, terminated, truncated, info = env.step(format_action("echo hi"))
    assert truncated and not terminated and reward == 0.0
    assert info["infra_failure"] and info["termination_reason"] == StopReason.ERROR
    assert "fake sandbox died" in info["error"]
    assert maker.num_open == 0


def test_sandbox_failure_at_reset_ends_the_episode_on_the_next_step():
    env = make_env(SandboxMaker(fail_on_create=True))
    obs, info = env.reset()
    assert info["infra_failure"] and "could not start" in info["error"]
    _, _, _, truncated, info = env.step(format_action("ls"))
    assert truncated and info["termination_reason"] == StopReason.ERROR


def test_grading_failure_is_an_infra_failure():
    maker = SandboxMaker(fail_on_call=2)
    env = make_env(maker)
    env.reset()
    _, reward, _, _, info = env.step(format_action("submit"))
    assert reward == 0.0 and info["infra_failure"]
    assert info["termination_reason"] == StopReason.ERROR


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), "1.0", None, True])
def test_a_grader_reward_that_is_not_a_finite_number_is_a_recorded_infra_failure(bad):
    """One NaN reward would poison every update it reached: the env reports it as the
    grader's failure (never trained on), with the task and the value in the error."""

    class BadGrader(FileTask):
        def grade(self, sandbox, context):
            return Grade(bad, details={"tests": "ran"})

    env = ShellEnv([BadGrader()], sandbox=SandboxMaker())
    env.reset()
    _, reward, _, _, info = env.step(format_action("submit"))
    env.close()
    assert reward == 0.0 and info["infra_failure"]
    assert info["termination_reason"] == StopReason.ERROR
    assert "file-task" in info["error"] and repr(bad) in info["error"]
    assert info["grade_details"]["tests"] == "ran"


def test_a_grader_that_returns_something_else_than_a_grade_is_an_infra_failure():
    class NumberGrader(FileTask):
        def grade(self, sandbox, context):
            return 1.0

    env = ShellEnv([NumberGrader()], sandbox=SandboxMaker())
    env.reset()
    _, reward, _, _, info = env.step(format_action("submit"))
    env.close()
    assert reward == 0.0 and info["infra_failure"] and "not a Grade" in info["error"]


def test_unknown_task_id_names_it():
    env = make_env()
    with pytest.raises(ValueError, match="unknown task id 'nope'"):
        env.reset(options={"task": "nope"})
