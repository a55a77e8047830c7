"""``TrainConfig``: every knob of a training run, in one typed dataclass.

Each field's annotation declares its type and range (``thundersync.declared``): from it come
the command line (each field is a ``--flag``, its help the field's docstring), the checks of
a config file (JSON or TOML with the same keys) and of every construction. Flags override the
file, and every run writes the resolved config to ``config.json`` (strict JSON) in its run
folder. What depends on the machine (the env, installed engines, GPUs, cores, the run
folder) is ``check_inputs``'s, before any worker starts.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from thundersync.declared import (
    DOCSTRINGS,
    Device,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Sandbox,
    Seed,
    Text,
    add_flags,
    check_fields,
    non_finite,
    parse_flag,
)
from thundersync.documents import DocumentError, load_file

Mode = Literal["sync", "async", "streaming"]
Algo = Literal["grpo", "opd"]
Engine = Literal["hf", "vllm"]
Dtype = Literal["float32", "float64", "bfloat16"]
MODES: tuple[str, ...] = typing.get_args(Mode)
ALGOS: tuple[str, ...] = typing.get_args(Algo)
ENGINES: tuple[str, ...] = typing.get_args(Engine)
DTYPES: tuple[str, ...] = typing.get_args(Dtype)
VLLM_DTYPES: tuple[str, ...] = ("float32", "bfloat16")
"""The dtypes engine vllm takes (vLLM has no float64; the learner no float16)."""
MAX_CONFIG_BYTES = 1024 * 1024
"""A config file (or a run's config.json) is at most 1 MiB: a few dozen fields."""


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """One training run (docs/design.md §4, §5)."""

    __pydantic_config__ = DOCSTRINGS

    env: Text = "thundersync/ToySum-v0"
    """Registered env id (``thundersync envs`` lists them; plugins too)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make(env, **env_kwargs)`` (JSON on the command line)."""
    mode: Mode = "streaming"
    """sync: roll out and grade the whole batch, then learn. async: rollout never waits and
    samples with weights up to ``staleness`` versions old. streaming: zero staleness, each
    piece of gradient work starts as soon as its inputs are fixed, the same update as sync."""
    staleness: PositiveInt = 1
    """async only: how many versions behind the learner a sampled token may be (k >= 1)."""
    algo: Algo = "grpo"
    """grpo (rewards from the env's grader) or opd (on-policy distillation from ``teacher``)."""
    objective: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of ``GRPO(...)`` or ``OPD(...)`` (e.g. {"loss_agg": "token-mean"})."""
    model: Text | None = None
    """Hugging Face checkpoint folder of the policy (None: a tiny random model is built)."""
    teacher: Text | None = None
    """opd: checkpoint folder of the teacher (same tokenizer as the student)."""
    steps: NonNegativeInt = 10
    """Optimizer steps (one per rollout batch)."""
    tasks_per_step: PositiveInt = 4
    """B: tasks per rollout batch (one GRPO group each)."""
    group_size: PositiveInt = 4
    """G: episodes per task (samples per group)."""
    seed: Seed = 0
    """Seeds task draws, sampling (per episode and turn) and env resets."""
    deterministic: bool = False
    """Bitwise reproducible: every request is generated alone (batch-invariant sampling) and
    the learner reduces in canonical order, so sync and streaming give identical weights."""
    engine: Engine = "hf"
    """Rollout engine: hf (transformers generation) or vllm (needs vLLM installed: on a CPU,
    ``make test-vllm`` builds .venv-vllm; the model's head_dim must be one vLLM's attention
    supports, e.g. 32 or 64 on a CPU; dtype float32 or bfloat16)."""
    backend: Literal["local", "ray"] = "local"
    """Where workers run: local processes, or Ray actors placed by resources (a private Ray
    head on this machine, or the cluster at RAY_ADDRESS; needs the ray extra)."""
    learner_ranks: PositiveInt = 1
    """Data-parallel learner ranks (torch.distributed, gloo over loopback): each rank trains
    its own groups and one all-reduce joins them per step; the same update as one learner
    (with --deterministic, bitwise). At most the machine's cores (cpu) or GPUs (cuda); under
    Ray the cluster decides."""
    device: Device = "cpu"
    """Where the learner, its KL reference, the OPD teacher and the HF engine compute: cpu, or
    cuda (learner rank r on cuda:r, NCCL joining the ranks; the engine and the teacher on
    cuda:0; under Ray the engine and teacher on a GPU Ray gives them), or cuda:N. Sampling
    draws on the CPU from per-request generators, so tokens stay a function of the seed."""
    sandbox: Sandbox = "bwrap"
    """Sandbox kind for the env's tasks."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """adamw, or sgd (plain gradient descent: what exactness checks of updates compare,
    since Adam's division by sqrt(v) amplifies last-bit gradient differences)."""
    lr: PositiveFloat = 1e-4
    """Learning rate."""
    weight_decay: NonNegativeFloat = 0.0
    """Weight decay."""
    max_grad_norm: NonNegativeFloat = 1.0
    """Gradient-norm clip (0 disables)."""
    dtype: Dtype = "float32"
    """Parameter dtype of the learner, the engine and the teacher. No float16: the learner
    has no loss scaling (float16 gradients underflow, and AdamW's eps 1e-8 is below float16's
    smallest number); no float64 with engine vllm."""
    max_new_tokens: PositiveInt = 48
    """Most tokens one action may have."""
    temperature: NonNegativeFloat = 1.0
    """Sampling temperature (1.0: the policy the learner trains; 0: greedy)."""
    max_concurrency: NonNegativeInt = 0
    """Episodes in flight at once (0: B×G, or B×G×(1+k) in async(k))."""
    batch_window_s: NonNegativeFloat = 0.005
    """A batch gathers until no request has arrived for this long (at most ten such windows)."""
    early_start: bool = False
    """streaming GRPO: start a trajectory's backward at EpisodeCompleted, during grading."""
    buffer_budget_bytes: NonNegativeInt = 0
    """streaming: cap on accumulator memory (0: no cap)."""
    micro_batch_size: PositiveInt = 8
    """Trajectories per padded backward."""
    learner_threads: PositiveInt = 1
    """torch threads of the learner (1 is robust when rollout shares the CPU)."""
    rollout_threads: PositiveInt = 1
    """torch threads of the rollout engine."""
    checkpoint_every: PositiveInt = 1
    """Save a checkpoint every N steps (and at the end)."""
    keep_checkpoints: PositiveInt = 2
    """Checkpoints kept (oldest removed first)."""
    out: Text = "runs/train"
    """Run folder: config.json, metrics.jsonl, events.jsonl, spans.jsonl, checkpoints/."""
    tensorboard: bool = False
    """Also log metrics to TensorBoard (needs the tensorboard package)."""
    wandb: bool = False
    """Also log metrics to Weights & Biases in offline mode (needs the wandb package)."""
    worker_timeout_s: PositiveFloat = 600.0
    """A run with no event from any worker for this long stops with an error."""

    def __post_init__(self) -> None:
        check_fields(self)  # each field's type and range, as its annotation declares
        checks = [
            (self.algo != "opd" or self.teacher, "teacher", "a checkpoint folder for opd"),
            (
                self.engine != "vllm" or self.dtype in VLLM_DTYPES,
                "dtype",
                "float32 or bfloat16 with engine 'vllm' (vLLM has no float64)",
            ),
            (
                self.learner_ranks == 1 or self.device in ("cpu", "cuda"),
                "device",
                "cpu or cuda with learner_ranks > 1 (each rank takes its own GPU)",
            ),
            (
                self.backend == "local"
                or self.device == "cpu"
                or (self.device == "cuda" and self.learner_ranks == 1),
                "device",
                "with backend 'ray', cpu, or cuda with one learner rank (Ray picks the GPUs; "
                "GPU learner ranks as Ray actors: not yet, use the local backend)",
            ),
        ]
        for ok, name, expected in checks:
            if not ok:
                raise ValueError(
                    f"config field {name!r}: expected {expected}, got {getattr(self, name)!r}"
                )
        objective = self.build_objective()
        for name in ("env_kwargs", "objective"):  # (the objective has named a bad keyword)
            where = non_finite(getattr(self, name))
            if where is not None:
                raise ValueError(
                    f"config field {name!r}: {where} is NaN or infinite (a run's "
                    "config.json is strict JSON)"
                )
        if self.early_start:
            no_effect = early_start_problem(self)
            if no_effect:
                raise ValueError(
                    f"config field 'early_start': no effect {no_effect}; leave out --early-start"
                )
        if self.mode == "async" and (self.algo != "grpo" or objective.tis_cap is not None):
            raise ValueError(
                "config fields 'mode'/'algo'/'objective': async trains GRPO "
                "without tis_cap (its PPO ratio already corrects for the sampler; "
                "OPD has no off-policy correction)"
            )

    def build_objective(self) -> Any:
        """The learner's ``GRPO(**objective)`` or ``OPD(**objective)`` (each keyword typed
        and ranged by the objective's declaration); a ValueError naming the field and the
        keyword when the keywords are not the objective's."""
        from thundersync.objectives import GRPO, OPD

        cls = GRPO if self.algo == "grpo" else OPD
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(self.objective) - set(known))
        if unknown:
            raise ValueError(
                f"config field 'objective': unknown keyword(s) {unknown} of "
                f"{cls.__name__} (algo {self.algo!r}); it takes {known}"
            )
        try:
            return cls(**self.objective)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"config field 'objective': {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def with_model_folders(config: TrainConfig) -> TrainConfig:
    """``config`` with its ``model`` and ``teacher`` as folders: a Hugging Face hub id is
    resolved to its snapshot in the local cache (``thundersync.models.model_folder``; nothing
    is downloaded), so the run's config.json names the exact revision it trained from."""
    from thundersync.models import model_folder

    folders = {
        name: model_folder(value, option=f"config field {name!r}:")
        for name in ("model", "teacher")
        if (value := getattr(config, name))
    }
    changed = {name: folder for name, folder in folders.items() if folder != getattr(config, name)}
    return dataclasses.replace(config, **changed) if changed else config


def check_inputs(config: TrainConfig, *, resume: bool = False) -> None:
    """What the dataclass cannot see: the env is registered, the engine is installed, the
    GPUs or cores the learner ranks need are here, every model folder is a checkpoint and the
    run folder is writable. A ValueError naming the field, before any worker starts."""
    from environments.registry import require_env

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


def engine_problem(engine: str) -> str | None:
    """Why the rollout engine ``engine`` cannot run here (vLLM not installed: how to get it),
    or None. ``train --engine`` and ``eval --engine`` share it."""
    if engine == "vllm" and importlib.util.find_spec("vllm") is None:
        from thundersync.training.engines.vllm import INSTALL_HINT

        return INSTALL_HINT
    return None


def early_start_problem(config: TrainConfig) -> str | None:
    """Where ``early_start`` changes nothing (its words after "no effect"), or None: it moves
    a GRPO trajectory's backward from its reward to its EpisodeCompleted, which only the
    non-deterministic streaming strategy does (sync and async learn after the batch; OPD's
    pieces start at each turn's teacher score; deterministic streaming already starts every
    trajectory's piece as soon as its tokens are known)."""
    if config.mode != "streaming":
        return f"with --mode {config.mode} (only streaming starts backwards before the step)"
    if config.algo != "grpo":
        return "with --algo opd (its turns' gradients already start at each teacher score)"
    if config.deterministic:
        return (
            "with --deterministic (its streaming already starts each trajectory's piece "
            "when its tokens are known)"
        )
    return None


CHAT_TEMPLATE_HINT = (
    "add one as a Jinja template: a 'chat_template' string in tokenizer_config.json, or a "
    "chat_template.jinja file in the folder (tokenizer.chat_template = '...' then "
    "tokenizer.save_pretrained(DIR); transformers docs: 'Chat templates')"
)


def chat_template_problem(folder: str | Path) -> str | None:
    """Why the policy agent cannot talk to the tokenizer in ``folder`` (no chat template, or
    one whose turns it cannot split into prompt, action and observation ids), or None."""
    from thundersync.models import load_tokenizer
    from thundersync.training.chat import ChatFormat, ChatFormatError

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
    from thundersync.models import load_tokenizer, train_tokenizer

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
    import json

    from thundersync.models import load_tokenizer

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
    import tempfile

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
    import gymnasium
    import numpy as np

    from environments.registry import task_source
    from environments.tasks import TRAIN, TaskProtocolError

    env = None
    kwargs = {"sandbox": config.sandbox, **config.env_kwargs}
    try:
        task_source(config.env, **kwargs).draw(np.random.default_rng(config.seed), TRAIN)
        env = gymnasium.make(config.env, **kwargs)
    except TaskProtocolError as exc:
        raise ValueError(f"config field 'env': {config.env}: {exc}") from exc
    except Exception as exc:
        raise ValueError(
            f"config field 'env_kwargs': cannot make {config.env} with {config.env_kwargs}: {exc}"
        ) from exc
    finally:
        if env is not None:
            env.close()


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
    import torch

    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    need = max(int(device.partition(":")[2] or 0) + 1, ranks)
    if have < need:
        per_rank = f" (one per learner rank, {ranks})" if ranks > 1 else ""
        return f"{device!r} needs {need} CUDA GPU(s){per_rank}; this machine has {have}"
    return None


def rank_device(device: str, rank: int) -> str:
    """The device of learner rank ``rank`` for the run's ``device``: ``cuda`` spreads the
    ranks over cuda:0, cuda:1, ... (NCCL needs one GPU per rank)."""
    return f"cuda:{rank}" if device == "cuda" else device


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The fields set by a JSON or TOML file; unknown keys are an error naming them (the
    values are checked when the TrainConfig is made)."""
    file = Path(path)
    kind = "toml" if file.suffix == ".toml" else "json"
    try:
        values = load_file(file, kind=kind, max_bytes=MAX_CONFIG_BYTES)
    except DocumentError as exc:
        raise DocumentError(file, f"not a readable JSON/TOML config: {exc.problem}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{file}: expected a table of config fields")
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(TrainConfig)})
    if unknown:
        raise ValueError(f"{file}: unknown config field(s) {unknown}")
    return values


def load_saved_config(path: Path) -> dict[str, Any]:
    """A run folder's ``config.json`` (the base of ``--resume``), read bounded."""
    values = load_file(path, kind="json", max_bytes=MAX_CONFIG_BYTES)
    if not isinstance(values, dict):
        raise DocumentError(path, f"expected a JSON object, got {type(values).__name__}")
    return values


def add_config_flags(parser: argparse.ArgumentParser, *, exclude: tuple[str, ...] = ()) -> None:
    """One ``--field`` per TrainConfig field but ``exclude`` (default: not given, so a file
    can set it); ``resolve_config`` checks the values."""
    add_flags(
        parser,
        TrainConfig,
        [f.name for f in dataclasses.fields(TrainConfig) if f.name not in exclude],
    )


def resolve_config(args: argparse.Namespace, base: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, then ``base`` (a config file or a resumed run's config.json), then flags;
    a ValueError naming the first bad value."""
    values = dict(base or {})
    for f in dataclasses.fields(TrainConfig):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = parse_flag(TrainConfig, f.name, given)
    return TrainConfig(**values)


def json_object(text: str) -> dict[str, Any]:
    """An argparse type: a strict-JSON object (``--env-kwargs '{...}'`` and the like)."""
    from thundersync.declared import json_object as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("value: ")) from None
