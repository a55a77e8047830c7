"""Our episodes as ATIF documents and ATIF trajectories as our events, token for token.

ATIF (the Agent Trajectory Interchange Format, ``atif`` package 1.8.0, ``ATIF-v1.8``) is a
sequence of steps. An episode maps onto one document:

- step 1, ``source="user"``: the task's prompt (its text when the folder recorded it; the ids
  in ``extra.thundersync.token_ids``);
- step k+2, ``source="agent"``, one per ``TurnCompleted`` k: ``metrics.prompt_token_ids`` is
  the whole context the policy saw before action k (prompt, then every earlier action and
  observation), ``completion_token_ids`` the sampled action, ``logprobs`` its sampling
  log-probs, ``extra.thundersync.policy_version`` the version that sampled it; the tool call
  the action made (``env.step``) and, from ``ToolFinished``, its ``observation`` (ids in the
  result's ``extra.thundersync.token_ids`` — the last one is in no later prompt — with the
  exit code, time-out and duration); an OPD teacher's scores in ``metrics.extra``;
- the document's ``extra``: ``reward``, and under ``thundersync`` the episode, group and task
  ids, ``stop_reason``, ``infra_failure`` and ``grading`` (``RewardReady.details`` as the
  grader wrote it: strict grading, tamper flags, ``agent_failure``, errors).

Importing reads the token ids back: action k's ids and log-probs from its step's metrics,
observation k from the next step's prompt minus the context so far (which must be its
prefix). A trajectory without them is refused for training: re-tokenising its text would not
give the tokens the policy sampled, so its log-probs would belong to other tokens.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from thundersync.protocol import events as ev
from thundersync.protocol.documents import DocumentError, load_file
from thundersync.protocol.episode import EpisodeRecord

SCHEMA_VERSION = "ATIF-v1.8"
EXTRA = "thundersync"
"""The key of our fields in ATIF ``extra`` objects."""
INSTALL = "pip install 'thundersync[interop]' (or pip install atif==1.8.0)"
TOOL = "env.step"
"""The tool call an action makes: the env parses the action's text and runs it."""
MAX_DOCUMENT_BYTES = 256 * 1024 * 1024
"""The most bytes one document may hold: a document repeats each step's whole context, so it
grows with the square of its turns (100 turns of a 32k-token context is about 25 MB), and its
parsed ids take several times its bytes in memory. Documents are also read with their nesting
bounded (``documents.MAX_DEPTH``; ours nest under 10 levels): a file from another harness is
input from outside, and ``[[[...]]]`` 100,000 deep would otherwise be a ``RecursionError``."""


class AtifError(ValueError):
    """Input that cannot be exported or imported; the message names the file and field."""


class TrajectoryRefused(AtifError):
    """An ATIF trajectory that cannot be trained on (no token ids or log-probs)."""


def atif_models() -> Any:
    """The ``atif`` package, or an ``AtifError`` saying how to install it."""
    try:
        import atif
    except ImportError as exc:
        raise AtifError(f"the ATIF format needs the atif package: {INSTALL}") from exc
    return atif


# --- episodes --------------------------------------------------------------------------------


EPISODE_EVENTS = ev.EPISODE_EVENTS


def episodes(events: Iterable[ev.Event]) -> tuple[list[EpisodeRecord], list[str]]:
    """The complete episodes in the order they started, and the ids of incomplete ones. An
    episode started again (a resumed run replays the step it stopped in) is the new one."""
    records: dict[str, EpisodeRecord] = {}
    for event in events:
        if not isinstance(event, EPISODE_EVENTS):
            continue
        if isinstance(event, ev.EpisodeStarted):
            records.pop(event.episode_id, None)  # a resumed run played it again: keep that
        record = records.setdefault(event.episode_id, EpisodeRecord(event.episode_id))
        if _already(record, event):
            turn = getattr(event, "turn", type(event).__name__)
            raise AtifError(
                f"episode {event.episode_id}: {type(event).__name__} twice (turn {turn})"
            )
        record.fold(event)
    done = [r for r in records.values() if r.complete]
    return done, [r.episode_id for r in records.values() if not r.complete]


def _already(record: EpisodeRecord, event: ev.Event) -> bool:
    """Whether the record holds this kind of event (of this turn) already."""
    match event:
        case ev.TurnCompleted():
            return event.turn in record.actions
        case ev.ToolFinished():
            return event.turn in record.tools
        case ev.TeacherScored():
            return event.turn in record.scores
        case ev.EpisodeCompleted():
            return record.completed is not None
        case ev.RewardReady():
            return record.reward is not None
    return False


# --- out -------------------------------------------------------------------------------------


def to_atif(
    episode: EpisodeRecord,
    *,
    session_id: str,
    texts: list[str] | None = None,
    version: str = "",
    agent: dict[str, Any] | None = None,
    decoded_with: Path | str | None = None,
) -> Any:
    """The episode as an ``atif.Trajectory`` (validated by its models). ``texts``: the
    conversation (prompt, action 0, observation 0, ..., last action, and the last action's
    observation when known) as recorded, or as decoded from the ids with the tokenizer in
    ``decoded_with``; ``agent``: the run's settings that say who acted (model, agent, mode,
    strict grading)."""
    atif = atif_models()
    s, r, c = episode.known_start, episode.known_reward, episode.known_completion
    whole = texts is not None and len(texts) in (2 * len(episode.turns), 2 * len(episode.turns) + 1)
    texts = texts if whole else None
    steps = [
        atif.Step(
            step_id=1,
            source="user",
            message=texts[0] if texts else "",
            extra={EXTRA: {"token_ids": list(s.prompt_ids), "t": s.t}},
        )
    ]
    context = list(s.prompt_ids)
    for k, turn in enumerate(episode.turns):
        tool, teacher = episode.tools.get(k), episode.scores.get(k)
        call_id = f"{s.episode_id}/{k}"
        metrics_extra = None
        if teacher is not None:
            metrics_extra = {
                EXTRA: {"teacher_logprobs": list(teacher.teacher_logprobs), "t": teacher.t}
            }
        observation = None
        if tool is not None:
            result = atif.ObservationResult(
                source_call_id=call_id,
                content=texts[2 + 2 * k] if texts and 2 + 2 * k < len(texts) else "",
                extra={EXTRA: _tool_extra(tool)},
            )
            observation = atif.Observation(results=[result])
        sampled = bool(turn.action_ids or turn.action_logprobs)
        metrics = atif.Metrics(
            prompt_tokens=len(context),
            completion_tokens=len(turn.action_ids),
            prompt_token_ids=list(context),
            completion_token_ids=list(turn.action_ids),
            logprobs=list(turn.action_logprobs),
            extra=metrics_extra,
        )
        steps.append(
            atif.Step(
                step_id=k + 2,
                source="agent",
                message=texts[1 + 2 * k] if texts else "",
                tool_calls=[atif.ToolCall(tool_call_id=call_id, function_name=TOOL, arguments={})],
                observation=observation,
                # no tokens: a scripted agent (oracle, nop) acted, no model sampled anything
                llm_call_count=None if sampled else 0,
                metrics=metrics if sampled else None,
                extra={EXTRA: {"turn": k, "policy_version": turn.policy_version, "t": turn.t}},
            )
        )
        context += [*turn.action_ids, *(tool.observation_ids if tool else ())]
    return atif.Trajectory(
        schema_version=SCHEMA_VERSION,
        session_id=session_id,
        trajectory_id=s.episode_id,
        agent=atif.Agent(
            name="thundersync",
            version=version or "unknown",
            model_name=(agent or {}).get("model"),
            extra={EXTRA: agent} if agent else None,
        ),
        steps=steps,
        notes="token-in/token-out: metrics hold the exact ids and sampling log-probs; "
        + (
            f"messages are the ids decoded with the run's tokenizer ({decoded_with})"
            if decoded_with is not None and texts
            else "messages hold text only where the run recorded it"
        ),
        final_metrics=atif.FinalMetrics(
            total_prompt_tokens=sum(st.metrics.prompt_tokens for st in steps if st.metrics),
            total_completion_tokens=sum(len(t.action_ids) for t in episode.turns),
            total_steps=len(steps),
        ),
        extra={
            "reward": r.reward,
            EXTRA: {
                "episode_id": s.episode_id,
                "group_id": s.group_id,
                "group_size": s.group_size,
                "task_id": s.task_id,
                "policy_version": s.policy_version,
                "stop_reason": c.stop_reason,
                "infra_failure": r.infra_failure,
                "grading": r.details,
                "t": {"completed": c.t, "reward": r.t},
            },
        },
    )


def _tool_extra(tool: ev.ToolFinished) -> dict[str, Any]:
    return {
        "token_ids": list(tool.observation_ids),
        "exit_code": tool.exit_code,
        "timed_out": tool.timed_out,
        "duration_s": tool.duration_s,
        "t": tool.t,
    }


# --- in --------------------------------------------------------------------------------------


def load_atif(paths: Iterable[str | Path]) -> list[ev.EpisodeEvent]:
    """Our events of every ATIF document in ``paths`` (files, or folders searched for
    ``*.json``), episode by episode in causal order. ``TrajectoryRefused`` for a trajectory
    without token ids or log-probs, ``AtifError`` for anything else that is wrong; both name
    the file and the step."""
    files: list[Path] = []
    for path in map(Path, paths):
        if path.is_dir():
            files += sorted(path.rglob("*.json"))
        elif path.is_file():
            files.append(path)
        else:
            raise AtifError(f"{path}: no such file or folder")
    if not files:
        raise AtifError(f"no ATIF documents (*.json) in {', '.join(map(str, paths))}")
    loaded = [_episode(file) for file in files]
    seen: dict[str, Path] = {}
    sizes: dict[str, int] = defaultdict(int)
    for file, episode in zip(files, loaded, strict=True):
        episode_id = episode.known_start.episode_id
        if episode_id in seen:
            raise AtifError(f"{file}: episode {episode_id} also in {seen[episode_id]}")
        seen[episode_id] = file
        sizes[episode.known_start.group_id] += 1
    out: list[ev.EpisodeEvent] = []
    for file, episode in zip(files, loaded, strict=True):
        s = episode.known_start
        size = s.group_size if s.group_size > 0 else sizes[s.group_id]
        if sizes[s.group_id] != size:
            raise AtifError(
                f"{file}: group {s.group_id} has {sizes[s.group_id]} of its {size} episodes: "
                "GRPO normalises rewards within a whole group, load all of them"
            )
        if size != s.group_size:
            episode = _with_group_size(episode, size)
        out += episode.events()
    return out


def _with_group_size(episode: EpisodeRecord, size: int) -> EpisodeRecord:
    s = episode.known_start
    started = ev.EpisodeStarted(
        t=s.t,
        episode_id=s.episode_id,
        group_id=s.group_id,
        group_size=size,
        task_id=s.task_id,
        prompt_ids=s.prompt_ids,
        policy_version=s.policy_version,
    )
    return replace(episode, started=started)


def _episode(file: Path) -> EpisodeRecord:
    """One document as an episode. Ours carry ``extra.thundersync``; another harness's give
    the episode id (``trajectory_id``, else the file's name), the group (``extra.group_id``,
    else ``extra.task_id``: GRPO's groups are attempts at one task) and ``extra.reward``."""
    atif = atif_models()
    try:
        value = load_file(file, kind="json", max_bytes=MAX_DOCUMENT_BYTES)
    except DocumentError as exc:  # unreadable, not JSON, too large or nested too deep
        raise AtifError(f"{file}: not an ATIF document: {exc.problem}") from None
    try:
        doc = atif.Trajectory.model_validate(value)
    except ValueError as exc:  # pydantic's ValidationError
        first = str(exc).splitlines()
        raise AtifError(f"{file}: not an ATIF trajectory: {' '.join(first[:3])}") from exc
    if not doc.schema_version.startswith("ATIF-v1."):
        raise AtifError(f"{file}: schema_version {doc.schema_version!r}: expected ATIF-v1.x")
    extra = doc.extra or {}
    ours = extra.get(EXTRA) or {}
    user = next((st for st in doc.steps if st.source == "user"), None)
    agent_steps = [st for st in doc.steps if st.source == "agent" and not st.is_copied_context]
    episode_id = ours.get("episode_id") or doc.trajectory_id or file.stem
    reward = extra.get("reward")
    if not isinstance(reward, int | float) or isinstance(reward, bool):
        raise TrajectoryRefused(
            f"{file}: extra.reward={reward!r}: a trajectory needs a numeric reward to be trained on"
        )
    turns, tools, teacher, prompt = _turns(file, episode_id, agent_steps)
    if prompt is None:  # no action: the prompt's ids are ours or nothing to train on
        prompt = _ours(user, "token_ids") if user is not None else None
        if prompt is None:
            raise TrajectoryRefused(f"{file}: no agent step with token ids: nothing to train on")
    t = ours.get("t") or {}
    group_id = str(ours.get("group_id") or extra.get("group_id") or extra.get("task_id") or "")
    started = ev.EpisodeStarted(
        t=_time(_ours(user, "t") if user is not None else None),
        episode_id=str(episode_id),
        group_id=group_id or str(episode_id),
        group_size=int(ours.get("group_size") or 0),
        task_id=str(ours.get("task_id") or extra.get("task_id") or episode_id),
        prompt_ids=tuple(prompt),
        policy_version=int(ours.get("policy_version", turns[0].policy_version if turns else 0)),
    )
    completed = ev.EpisodeCompleted(
        t=_time(t.get("completed")),
        episode_id=started.episode_id,
        num_turns=len(turns),
        stop_reason=str(ours.get("stop_reason") or extra.get("stop_reason") or "submitted"),
    )
    graded = ev.RewardReady(
        t=_time(t.get("reward")),
        episode_id=started.episode_id,
        reward=reward,
        infra_failure=bool(ours.get("infra_failure", False)),
        details=dict(ours.get("grading") or {}),
    )
    record = EpisodeRecord(started.episode_id)
    for event in (started, *turns, *tools.values(), *teacher.values(), completed, graded):
        record.fold(event)
    return record


def _turns(
    file: Path, episode_id: str, steps: list[Any]
) -> tuple[
    list[ev.TurnCompleted],
    dict[int, ev.ToolFinished],
    dict[int, ev.TeacherScored],
    list[int] | None,
]:
    """The turns, tool results and teacher scores of the agent steps, and the prompt's ids."""
    turns: list[ev.TurnCompleted] = []
    tools: dict[int, ev.ToolFinished] = {}
    teacher: dict[int, ev.TeacherScored] = {}
    context: list[int] | None = None
    prompt: list[int] | None = None
    for k, step in enumerate(steps):
        m = step.metrics
        where = f"{file}: step {step.step_id}"
        for name in ("prompt_token_ids", "completion_token_ids", "logprobs"):
            if m is None or getattr(m, name) is None:
                raise TrajectoryRefused(
                    f"{where}: no metrics.{name}: refused for training (re-tokenising the "
                    "text would not give the tokens the policy sampled); export token ids "
                    "and log-probs"
                )
        if len(m.logprobs) != len(m.completion_token_ids):
            raise AtifError(
                f"{where}: {len(m.logprobs)} logprobs for "
                f"{len(m.completion_token_ids)} completion_token_ids"
            )
        if context is None:
            prompt = list(m.prompt_token_ids)
        else:
            if m.prompt_token_ids[: len(context)] != context:
                raise TrajectoryRefused(
                    f"{where}: prompt_token_ids do not extend the previous step's prompt and "
                    "completion (the conversation was re-rendered): not one token trajectory"
                )
            observed = m.prompt_token_ids[len(context) :]
            tools[k - 1] = _tool(file, episode_id, k - 1, steps[k - 1], observed)
        context = [*m.prompt_token_ids, *m.completion_token_ids]
        ours = step.extra.get(EXTRA, {}) if step.extra else {}
        turns.append(
            ev.TurnCompleted(
                t=_time(ours.get("t")),
                episode_id=episode_id,
                turn=k,
                action_ids=tuple(m.completion_token_ids),
                action_logprobs=tuple(float(x) for x in m.logprobs),
                policy_version=int(ours.get("policy_version", 0)),
            )
        )
        scores = (m.extra or {}).get(EXTRA, {})
        if "teacher_logprobs" in scores:
            teacher[k] = ev.TeacherScored(
                t=_time(scores.get("t")),
                episode_id=episode_id,
                turn=k,
                teacher_logprobs=tuple(float(x) for x in scores["teacher_logprobs"]),
            )
    if steps and _result(steps[-1]).get("token_ids") is not None:
        last = len(steps) - 1
        tools[last] = _tool(file, episode_id, last, steps[-1], _result(steps[-1])["token_ids"])
    return turns, tools, teacher, prompt


def _tool(file: Path, episode_id: str, turn: int, step: Any, ids: list[int]) -> ev.ToolFinished:
    ours = _result(step)
    if ours.get("token_ids") is not None and list(ours["token_ids"]) != list(ids):
        raise AtifError(
            f"{file}: step {step.step_id}: observation token_ids differ from the next step's prompt"
        )
    return ev.ToolFinished(
        t=_time(ours.get("t")),
        episode_id=episode_id,
        turn=turn,
        observation_ids=tuple(ids),
        duration_s=float(ours.get("duration_s", 0.0)),
        exit_code=ours.get("exit_code"),
        timed_out=bool(ours.get("timed_out", False)),
    )


def _result(step: Any) -> dict[str, Any]:
    """Our fields of the step's observation, if it has one of ours."""
    results = step.observation.results if step.observation is not None else []
    return next(((r.extra or {}).get(EXTRA, {}) for r in results if r.extra), {})


def _ours(step: Any, key: str) -> Any:
    return (step.extra or {}).get(EXTRA, {}).get(key)


def _time(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else ev.now()
