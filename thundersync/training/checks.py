"""The checks before any worker starts: what ``TrainConfig`` cannot see by itself (the env,
installed engines, GPUs, cores, model folders, the run folder), each a one-line error naming
the field.

Some imports are inside the functions that need them: the command line imports this module
for every command, and ``thundersync.models`` (transformers, torch) and ``environments``
take seconds to import (``python -X importtime``), which ``thundersync --help`` need not pay.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from thundersync.training.config import TrainConfig


def with_model_folders(config: TrainConfig) -> TrainConfig:
    """``config`` with its ``model`` and ``teacher`` as folders: a Hugging Face hub id is
    resolved to its snapshot in the local cache (``thundersync.models.model_folder``; nothing
    is downloaded), so the run's config.json names the exact revision it trained from."""
    from thundersync.models import model_folder  # start-up cost (module docstring)

    def folder(name: str, value: str | None) -> str | None:
        return model_folder(value, option=f"config field {name!r}:") if value else value

    model, teacher = folder("model", config.model), folder("teacher", config.teacher)
    if (model, teacher) == (config.model, config.teacher):
        return config
    return dataclasses.replace(config, model=model, teacher=teacher)


def check_inputs(config: TrainConfig, *, resume: bool = False) -> None:
    """What the dataclass cannot see: the env is registered, the engine is installed, the
    GPUs or cores the learner ranks need are here, every model folder is a checkpoint and the
    run folder is writable. A ValueError naming the field, before any worker starts."""
    from environments.registry import require_env  # start-up cost (module docstring)

    require_env(config.env, option="config field 'env':")
    check_env_kwargs(config)
    problem = engine_problem(config.engine)
    if problem:
        raise ValueError(f"config field 'engine': {problem}")
    if config.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError(
            "config field 'backend': --backend ray needs Ray: pip install 'thundersync[ray]'"
        )
    check_device(config)
    from thundersync.training.placement import placement_problem

    problem = placement_problem(config)
    if problem:
        raise ValueError(f"config field 'placement': {problem}")
    cores = usable_cores()
    if config.backend == "local" and config.device == "cpu" and config.learner_ranks > cores:
        raise ValueError(
            f"config field 'learner_ranks': {config.learner_ranks} ranks on a "
            f"machine with {cores} core(s); at most {cores} (one process each), "
            "or --backend ray to place them on a cluster"
        )
    for name in ("model", "teacher"):
        folder = getattr(config, name)
        if folder and not (Path(folder) / "config.json").is_file():
            raise ValueError(
                f"config field {name!r}: {folder}: not a checkpoint folder "
                "(no config.json; thundersync warmstart builds one, or name a "
                "Hugging Face model in the local cache: org/name)"
            )
    if config.model:
        problem = chat_template_problem(config.model)
        if problem:
            raise ValueError(f"config field 'model': {problem}")
    if config.algo == "opd" and config.teacher:
        problem = tokenizer_mismatch(student_tokenizer(config), config.teacher)
        if problem:
            raise ValueError(f"config field 'teacher': {problem}")
    problem = folder_problem(config.out)
    if problem:
        raise ValueError(f"config field 'out': {problem}")


CHAT_TEMPLATE_HINT = (
    "add one as a Jinja template: a 'chat_template' string in tokenizer_config.json, or a "
    "chat_template.jinja file in the folder (tokenizer.chat_template = '...' then "
    "tokenizer.save_pretrained(DIR); transformers docs: 'Chat templates')"
)


def engine_problem(engine: str) -> str | None:
    """Why the rollout engine ``engine`` cannot run here (vLLM not installed: how to get it),
    or None. ``train --engine`` and ``eval --engine`` share it."""
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        from thundersync.training.engines.vllm import INSTALL_HINT  # imports torch

        return INSTALL_HINT
    return None


def chat_template_problem(folder: str | Path) -> str | None:
    """Why the policy agent cannot talk to the tokenizer in ``folder`` (no chat template, or
    one whose turns it cannot split into prompt, action and observation ids), or None."""
    from thundersync.models import load_tokenizer  # start-up cost (module docstring)
    from thundersync.training.chat import ChatFormat, ChatFormatError  # needs the line above

    try:
        tokenizer = load_tokenizer(folder)
    except Exception as exc:  # noqa: BLE001 (any loading failure is the folder's problem)
        first = str(exc).splitlines()[0] if str(exc).strip() else repr(exc)
        return f"{folder}: cannot load its tokenizer: {first}"
    if not getattr(tokenizer, "chat_template", None):
        return (
            f"{folder}: its tokenizer has no chat template (the policy agent needs one); "
            + CHAT_TEMPLATE_HINT
        )
    try:
        ChatFormat(tokenizer)
    except ChatFormatError as exc:
        return f"{folder}: {exc}"
    except Exception as exc:  # noqa: BLE001 (a template that fails to render)
        return f"{folder}: its chat template does not render: {exc}"
    return None


PROBE_TEXTS = (
    "Run one command per turn inside a ```bash block.",
    "lookup alpha -> 17; calc 17+25 -> 42; echo THUNDERSYNC_SUBMIT",
    "Traceback (most recent call last):\n  File \"/app/x.py\", line 3\nKeyError: 'é'",
)
"""Texts both tokenizers of an OPD run must encode alike (shell, numbers, non-ASCII)."""


def student_tokenizer(config: TrainConfig) -> Any:
    """The tokenizer the run's policy will have: ``--model``'s, a resumed run's built tiny
    model's, or (no --model) the one the trainer builds (the same local training, in memory)."""
    from thundersync.models import load_tokenizer, train_tokenizer  # start-up cost

    if config.model:
        return load_tokenizer(config.model)
    built = Path(config.out) / "init-model"
    if (built / "config.json").is_file():
        return load_tokenizer(built)
    return train_tokenizer()


def tokenizer_mismatch(student: Any, teacher_folder: str | Path) -> str | None:
    """How the teacher's tokenizer (and embedding) differs from the student's, or None. OPD
    scores the student's sampled ids with the teacher, so an id must name the same token in
    both: the same vocabulary (every token's id) and the same encodings of probe texts."""
    from thundersync.models import load_tokenizer  # start-up cost (module docstring)

    try:
        teacher = load_tokenizer(teacher_folder)
    except Exception as exc:  # noqa: BLE001
        return f"{teacher_folder}: cannot load its tokenizer: {exc}"
    where = f"{teacher_folder}: the teacher's tokenizer differs from the student's"
    hint = "OPD needs one tokenizer for both (e.g. a teacher warm-started like the student)"
    if len(student) != len(teacher):
        return f"{where}: vocabulary of {len(teacher)} tokens, the student's {len(student)}; {hint}"
    s_vocab, t_vocab = student.get_vocab(), teacher.get_vocab()
    moved = sorted(t for t in s_vocab if t_vocab.get(t) != s_vocab[t])
    if moved:
        token = moved[0]
        return (
            f"{where}: {len(moved)} of {len(s_vocab)} tokens have other ids (e.g. "
            f"{token!r}: {t_vocab.get(token)} vs the student's {s_vocab[token]}); {hint}"
        )
    for text in PROBE_TEXTS:
        s_ids = student(text, add_special_tokens=False)["input_ids"]
        t_ids = teacher(text, add_special_tokens=False)["input_ids"]
        if s_ids != t_ids:
            return f"{where}: they encode {text[:30]!r} differently; {hint}"
    try:
        size = json.loads((Path(teacher_folder) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError):
        size = None
    if isinstance(size, int) and size < len(student):
        return (
            f"{teacher_folder}: the teacher's embedding has {size} rows, fewer than the "
            f"{len(student)} tokens of the shared tokenizer"
        )
    return None


def usable_cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


PSEUDO_FILESYSTEMS = (Path("/proc"), Path("/sys"))


def folder_problem(folder: str | Path) -> str | None:
    """Why ``folder`` cannot be a run folder (a file, under /proc or /sys, not writable), or
    None. Writability is proven: the missing folders and a probe file are created, then
    removed again."""
    given = Path(folder)
    for path in (Path(os.path.abspath(given)), given.resolve()):
        for pseudo in PSEUDO_FILESYSTEMS:
            if path.is_relative_to(pseudo):
                return f"{folder}: under {pseudo}, a kernel filesystem, not a place for a run"
    if given.exists() and not given.is_dir():
        return f"{folder}: exists and is not a folder"
    made = [p for p in (given, *given.parents) if not p.exists()]
    try:
        given.mkdir(parents=True, exist_ok=True)
        descriptor, probe = tempfile.mkstemp(prefix=".write-probe-", dir=given)
        os.close(descriptor)
        os.unlink(probe)
    except OSError as exc:
        return f"{folder}: not writable ({exc.strerror or exc})"
    finally:
        for path in made:  # innermost first
            try:
                path.rmdir()
            except OSError:
                break
    return None


def check_env_kwargs(config: TrainConfig) -> None:
    """The env's task source draws one training task, as the rollout worker's first step
    will, and the env is made (not reset) once with the run's sandbox and env kwargs: a kwarg
    either refuses, or a task of a protocol version this ThunderSync cannot serve, is a
    one-line error here instead of a worker's traceback."""
    import gymnasium  # start-up cost (module docstring), as the two below
    import numpy as np

    from environments.registry import grading_place, task_source
    from environments.tasks import TRAIN, TaskProtocolError

    env = None
    kwargs = {"sandbox": config.sandbox, **config.env_kwargs}
    try:
        task_source(config.env, **kwargs).draw(np.random.default_rng(config.seed), TRAIN)
        env = gymnasium.make(config.env, **kwargs)
        _places[_place_key(config)] = grading_place(env, config.sandbox)
    except TaskProtocolError as exc:
        raise ValueError(f"config field 'env': {config.env}: {exc}") from exc
    except Exception as exc:
        raise ValueError(
            f"config field 'env_kwargs': cannot make {config.env} with {config.env_kwargs}: {exc}"
        ) from exc
    finally:
        if env is not None:
            env.close()


_places: dict[str, str] = {}


def _place_key(config: TrainConfig) -> str:
    return json.dumps([config.env, config.sandbox, config.env_kwargs], sort_keys=True)


def grading_place_of(config: TrainConfig) -> str:
    """Where the run's env plays and grades its episodes, as its progress line says it
    (``environments.registry.grading_place``), found when ``check_env_kwargs`` made the env;
    the sandbox's name where it did not run."""
    return _places.get(_place_key(config), f"in the {config.sandbox} sandbox")


def check_device(config: TrainConfig) -> None:
    """A ValueError unless the GPUs ``config.device`` names are here (one per learner rank;
    under Ray, rank 0's: the trainer's; Ray checks its cluster's for the workers)."""
    problem = device_problem(config.device, config.learner_ranks)
    if problem:
        raise ValueError(f"config field 'device': {problem}")


def device_problem(device: str, ranks: int = 1) -> str | None:
    """Why ``device`` (cpu, cuda or cuda:N) cannot hold ``ranks`` learner ranks here (one
    GPU each), or None."""
    if re.fullmatch(r"cpu|cuda(:\d+)?", device) is None:
        return f"expected cpu, cuda or cuda:N, got {device!r}"
    if device == "cpu":
        return None
    import torch  # start-up cost (module docstring)

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    need = max(int(device.partition(":")[2] or 0) + 1, ranks)
    if have < need:
        per_rank = f" (one per learner rank, {ranks})" if ranks > 1 else ""
        return f"{device!r} needs {need} CUDA GPU(s){per_rank}; this machine has {have}"
    return None
