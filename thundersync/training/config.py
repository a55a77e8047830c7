"""``TrainConfig``: every knob of a training run, in one typed dataclass.

The command line is generated from it (each field is a ``--flag``), a config file (JSON or
TOML with the same keys) sets any of them, flags override the file, and every run writes the
resolved config to ``config.json`` in its run folder.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from thundersync.documents import DocumentError, excerpt, load_file, load_json

MODES = ("sync", "async", "streaming")
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")
ALGOS = ("grpo", "opd")
ENGINES = ("hf", "vllm")
MAX_CONFIG_BYTES = 1024 * 1024
"""A config file (or a run's config.json) is at most 1 MiB: a few dozen fields."""


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """One training run (docs/design.md §4, §5)."""

    env: str = "thundersync/ToySum-v0"
    """Registered env id (``thundersync envs`` lists them; plugins too)."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make(env, **env_kwargs)`` (JSON on the command line)."""
    mode: Literal["sync", "async", "streaming"] = "streaming"
    """sync: roll out and grade the whole batch, then learn. async: rollout never waits and
    samples with weights up to ``staleness`` versions old. streaming: zero staleness, each
    piece of gradient work starts as soon as its inputs are fixed, the same update as sync."""
    staleness: int = 1
    """async only: how many versions behind the learner a sampled token may be (k >= 1)."""
    algo: Literal["grpo", "opd"] = "grpo"
    """grpo (rewards from the env's grader) or opd (on-policy distillation from ``teacher``)."""
    objective: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of ``GRPO(...)`` or ``OPD(...)`` (e.g. {"loss_agg": "token-mean"})."""
    model: str | None = None
    """Hugging Face checkpoint folder of the policy (None: a tiny random model is built)."""
    teacher: str | None = None
    """opd: checkpoint folder of the teacher (same tokenizer as the student)."""
    steps: int = 10
    """Optimizer steps (one per rollout batch)."""
    tasks_per_step: int = 4
    """B: tasks per rollout batch (one GRPO group each)."""
    group_size: int = 4
    """G: episodes per task (samples per group)."""
    seed: int = 0
    """Seeds task draws, sampling (per episode and turn) and env resets."""
    deterministic: bool = False
    """Bitwise reproducible: every request is generated alone (batch-invariant sampling) and
    the learner reduces in canonical order, so sync and streaming give identical weights."""
    engine: Literal["hf", "vllm"] = "hf"
    """Rollout engine: hf (transformers generation) or vllm (needs vLLM installed: on a CPU,
    ``make test-vllm`` builds .venv-vllm; the model's head_dim must be one vLLM's attention
    supports, e.g. 32 or 64 on a CPU; dtype float32 or bfloat16)."""
    backend: Literal["local", "ray"] = "local"
    """Where workers run: local processes, or Ray actors placed by resources (a private Ray
    head on this machine, or the cluster at RAY_ADDRESS; needs the ray extra)."""
    learner_ranks: int = 1
    """Data-parallel learner ranks (torch.distributed, gloo over loopback): each rank trains
    its own groups and one all-reduce joins them per step; the same update as one learner
    (with --deterministic, bitwise)."""
    device: str = "cpu"
    """Where the learner, its KL reference, the OPD teacher and the HF engine compute: cpu, or
    cuda (learner rank r on cuda:r, NCCL joining the ranks; the engine and the teacher on
    cuda:0; under Ray the engine and teacher on a GPU Ray gives them), or cuda:N. Sampling
    draws on the CPU from per-request generators, so tokens stay a function of the seed."""
    sandbox: Literal["bwrap", "docker"] = "bwrap"
    """Sandbox kind for the env's tasks."""
    optimizer: Literal["adamw", "sgd"] = "adamw"
    """adamw, or sgd (plain gradient descent: what exactness checks of updates compare,
    since Adam's division by sqrt(v) amplifies last-bit gradient differences)."""
    lr: float = 1e-4
    """Learning rate."""
    weight_decay: float = 0.0
    """Weight decay."""
    max_grad_norm: float = 1.0
    """Gradient-norm clip (0 disables)."""
    dtype: Literal["float32", "float64", "bfloat16"] = "float32"
    """Learner parameter dtype (the engine samples in float32 or the checkpoint's dtype)."""
    max_new_tokens: int = 48
    """Most tokens one action may have."""
    temperature: float = 1.0
    """Sampling temperature (1.0: the policy the learner trains)."""
    max_concurrency: int = 0
    """Episodes in flight at once (0: B×G, or B×G×(1+k) in async(k))."""
    batch_window_s: float = 0.005
    """A batch gathers until no request has arrived for this long (at most ten such windows)."""
    early_start: bool = False
    """streaming GRPO: start a trajectory's backward at EpisodeCompleted, during grading."""
    buffer_budget_bytes: int = 0
    """streaming: cap on accumulator memory (0: no cap)."""
    micro_batch_size: int = 8
    """Trajectories per padded backward."""
    learner_threads: int = 1
    """torch threads of the learner (1 is robust when rollout shares the CPU)."""
    rollout_threads: int = 1
    """torch threads of the rollout engine."""
    checkpoint_every: int = 1
    """Save a checkpoint every N steps (and at the end)."""
    keep_checkpoints: int = 2
    """Checkpoints kept (oldest removed first)."""
    out: str = "runs/train"
    """Run folder: config.json, metrics.jsonl, events.jsonl, spans.jsonl, checkpoints/."""
    tensorboard: bool = False
    """Also log metrics to TensorBoard (needs the tensorboard package)."""
    wandb: bool = False
    """Also log metrics to Weights & Biases in offline mode (needs the wandb package)."""
    worker_timeout_s: float = 600.0
    """A run with no event from any worker for this long stops with an error."""

    def __post_init__(self) -> None:
        checks = [
            (self.mode in MODES, "mode", f"one of {MODES}"),
            (self.algo in ALGOS, "algo", f"one of {ALGOS}"),
            (self.staleness >= 1, "staleness", ">= 1"),
            (self.steps >= 0, "steps", ">= 0"),
            (self.tasks_per_step >= 1 and self.group_size >= 1, "tasks_per_step/group_size",
             ">= 1"),
            (self.max_new_tokens >= 1, "max_new_tokens", ">= 1"),
            (self.temperature >= 0, "temperature", ">= 0"),
            (self.algo != "opd" or self.teacher, "teacher", "a checkpoint folder for opd"),
            (self.engine in ENGINES, "engine", f"one of {ENGINES}"),
            (self.engine != "vllm" or self.dtype != "float64", "dtype",
             "float32 or bfloat16 with engine 'vllm' (vLLM has no float64)"),
            (self.learner_ranks >= 1, "learner_ranks", ">= 1"),
            (_DEVICE.fullmatch(self.device) is not None, "device", "cpu, cuda or cuda:N"),
            (self.learner_ranks == 1 or self.device in ("cpu", "cuda"), "device",
             "cpu or cuda with learner_ranks > 1 (each rank takes its own GPU)"),
            (self.backend == "local" or self.device == "cpu"
             or (self.device == "cuda" and self.learner_ranks == 1), "device",
             "with backend 'ray', cpu, or cuda with one learner rank (Ray picks the GPUs; "
             "GPU learner ranks as Ray actors: not yet, use the local backend)"),
            (self.checkpoint_every >= 1 and self.keep_checkpoints >= 1, "checkpoint_every",
             ">= 1"),
        ]  # fmt: skip
        for ok, name, expected in checks:
            if not ok:
                raise ValueError(f"config field {name!r}: expected {expected}, got "
                                 f"{getattr(self, name.split('/')[0])!r}")  # fmt: skip
        objective = self.build_objective()
        if self.mode == "async" and (self.algo != "grpo" or objective.tis_cap is not None):
            raise ValueError("config fields 'mode'/'algo'/'objective': async trains GRPO "
                             "without tis_cap (its PPO ratio already corrects for the sampler; "
                             "OPD has no off-policy correction)")  # fmt: skip

    def build_objective(self) -> Any:
        """The learner's ``GRPO(**objective)`` or ``OPD(**objective)``; a ValueError naming
        the field when the keywords are not the objective's."""
        from thundersync.objectives import GRPO, OPD

        try:
            return (GRPO if self.algo == "grpo" else OPD)(**self.objective)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"config field 'objective': {exc}") from exc

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def check_inputs(config: TrainConfig) -> None:
    """What the dataclass cannot see: the env is registered, the engine is installed and every
    model folder is a checkpoint. A ValueError naming the field, before any worker starts."""
    from environments.registry import require_env

    require_env(config.env, option="config field 'env':")
    check_env_kwargs(config)
    if config.engine == "vllm":
        from thundersync.training.engines.vllm import INSTALL_HINT

        if importlib.util.find_spec("vllm") is None:
            raise ValueError(f"config field 'engine': {INSTALL_HINT}")
    if config.backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError("config field 'backend': --backend ray needs Ray: "
                         "pip install 'thundersync[ray]'")  # fmt: skip
    check_device(config)
    for name in ("model", "teacher"):
        folder = getattr(config, name)
        if folder and not (Path(folder) / "config.json").is_file():
            raise ValueError(f"config field {name!r}: {folder}: not a checkpoint folder "
                             "(no config.json; thundersync warmstart builds one)")  # fmt: skip


def check_env_kwargs(config: TrainConfig) -> None:
    """The env is made (not reset) once with the run's sandbox and env kwargs and draws one
    task, as the rollout worker's first step will: a kwarg it refuses is a one-line error here
    instead of a worker's traceback."""
    import gymnasium
    import numpy as np

    env = None
    try:
        env = gymnasium.make(config.env, sandbox=config.sandbox, **config.env_kwargs)
        env.get_wrapper_attr("draw_task")(np.random.default_rng(config.seed))
    except Exception as exc:
        raise ValueError(f"config field 'env_kwargs': cannot make {config.env} with "
                         f"{config.env_kwargs}: {exc}") from exc  # fmt: skip
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
    if _DEVICE.fullmatch(device) is None:
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
    """The fields set by a JSON or TOML file; unknown keys are an error naming them."""
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
    can set it)."""
    docs, hints = field_docs(), typing.get_type_hints(TrainConfig)
    for f in dataclasses.fields(TrainConfig):
        if f.name in exclude:
            continue
        flag = "--" + f.name.replace("_", "-")
        base, choices = _base_type(hints[f.name])
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        help_text = f"{docs.get(f.name, '')} (default: {default!r})"
        if base is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction,
                                default=None, help=help_text)  # fmt: skip
        elif base is dict:
            parser.add_argument(flag, dest=f.name, type=json_object, default=None, help=help_text)
        else:
            parser.add_argument(flag, dest=f.name, type=base, choices=choices, default=None,
                                help=help_text)  # fmt: skip


def resolve_config(args: argparse.Namespace, base: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, then ``base`` (a config file or a resumed run's config.json), then flags."""
    values = dict(base or {})
    for f in dataclasses.fields(TrainConfig):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = given
    return TrainConfig(**values)


def field_docs() -> dict[str, str]:
    """Each field's docstring (the string literal under it in this module)."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(TrainConfig))
    docs, body = {}, tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr):
            value = getattr(nxt, "value", None)
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                docs[node.target.id] = " ".join(value.value.split())  # type: ignore[union-attr]
    return docs


def _base_type(resolved: Any) -> tuple[type, list[Any] | None]:
    origin = typing.get_origin(resolved)
    if origin is Literal:
        values = list(typing.get_args(resolved))
        return type(values[0]), values
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(resolved) if a is not type(None)]
        return _base_type(args[0])
    if origin is dict or resolved is dict:
        return dict, None
    return resolved, None


def json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object (``--env-kwargs '{...}'`` and the like)."""
    try:
        value = load_json(text, "<argument>")
    except DocumentError as exc:
        raise argparse.ArgumentTypeError(
            f"expected a JSON object, got {excerpt(text)}: {exc.problem}"
        ) from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {excerpt(text)}")
    return value
