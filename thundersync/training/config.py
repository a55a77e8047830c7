"""``TrainConfig``: every knob of a training run, in one typed dataclass.

Each field's annotation declares its type and range (``thundersync.declared``): from it come
the command line (each field is a ``--flag``, its help the field's docstring), the checks of
a config file (JSON or TOML with the same keys) and of every construction. Flags override the
file, and every run writes the resolved config to ``config.json`` (strict JSON) in its run
folder, with the warnings it printed at its start (``TrainConfig.record``). What depends on
the machine (the env, installed engines, GPUs, cores, the run folder) is
``checks.check_inputs``'s, before any worker starts. What differs between the modes
is the mode object's (``TrainConfig.training_mode()``, ``thundersync.training.modes``).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from dataclasses import dataclass, field
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
    check_fields,
    non_finite,
)
from thundersync.lora import LoraSettings
from thundersync.training.modes import REGISTRY, choose_mode
from thundersync.training.modes import Mode as TrainingMode

if typing.TYPE_CHECKING:
    Mode = str
else:  # the registered modes' names: --mode's choices, the field's check
    Mode = Literal[tuple(cls.name for cls in REGISTRY)]
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
RUN_NOTES = ("warnings", "placed")
"""What a run's config.json holds besides the config's fields (``TrainConfig.record``): the
warnings the run printed at its start, and where its learner and rollout ran (``placed``:
the cores and devices of each side, and the learner thread's affinity as it started).
Loading a config (``--resume``, or ``--config`` naming a run's
config.json) leaves them out: they are the run's record, not settings."""


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
    lora: dict[str, Any] | None = None
    """Train LoRA adapters instead of every weight (needs the lora extra): a table of rank
    (8), alpha (16), dropout (0) and target_modules (peft's default); ``--lora`` alone: all
    defaults. The base stays frozen and is GRPO's KL reference (adapters disabled)."""
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
    """streaming GRPO: start a trajectory's work at EpisodeCompleted, during grading."""
    buffer_budget_bytes: NonNegativeInt = 0
    """streaming: cap on accumulator memory (0: no cap; early start then holds a whole
    trajectory's gradient to its reward only within 2 x groups + 1 parameter copies)."""
    micro_batch_size: PositiveInt = 8
    """Most trajectories per padded backward (shortest first, none past twice the first)."""
    learner_threads: PositiveInt = 1
    """torch threads of the learner (1 is robust when rollout shares the CPU)."""
    rollout_threads: PositiveInt = 1
    """torch threads of the rollout engine."""
    placement: Literal["colocated", "disaggregated"] = "colocated"
    """colocated: learner and rollout share every core; disaggregated: the learner (and its
    ranks) on learner_ranks x learner_threads cores of its own, rollout, sandboxes and
    graders on the rest (with --device cuda: the learner on the first GPUs, the engine on the
    next). Any mode; the math is unchanged."""
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
        self.lora_settings()
        for name in ("env_kwargs", "objective", "lora"):  # (these named no bad keyword)
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
        mode = self.training_mode()
        problem = mode.learner_contract().problem(objective)
        if problem:
            raise ValueError(
                f"config fields 'mode'/'algo'/'objective': mode {mode.label!r}: {problem}"
            )

    def training_mode(self) -> TrainingMode:
        """The mode object of ``mode``: what differs between sync, async and streaming."""
        return choose_mode(self.mode, staleness=self.staleness)

    def build_objective(self) -> Any:
        """The learner's ``GRPO(**objective)`` or ``OPD(**objective)`` (each keyword typed
        and ranged by the objective's declaration); a ValueError naming the field and the
        keyword when the keywords are not the objective's."""
        from thundersync.core.objectives import GRPO, OPD

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

    def lora_settings(self) -> LoraSettings | None:
        """The ``lora`` table as checked settings (None: full fine-tuning)."""
        return None if self.lora is None else LoraSettings.from_table(self.lora)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def warnings(self) -> list[str]:
        """What this run does that its user must not miss, one line each: ``train`` prints
        them on stderr at the start and the run's config.json keeps them (``record``).
        Default grading is allowed (a benchmark's own grading, an env without strict grading
        to compare with), but a policy can game it and RL trains whatever hack it finds
        (docs/design.md §6.1), so a run on it says so rather than looking like any other."""
        if "strict_grading" in self.env_kwargs and not self.env_kwargs["strict_grading"]:
            value = json.dumps(self.env_kwargs["strict_grading"])
            return [
                f"strict grading is off (env_kwargs strict_grading={value}): the rewards come "
                "from grading a policy can game, and training optimises toward any hack it "
                "finds (docs/design.md §6.1)"
            ]
        return []

    def record(self) -> dict[str, Any]:
        """What the run's config.json holds: the config's fields and ``RUN_NOTES``."""
        return {**self.to_dict(), "warnings": self.warnings()}


def early_start_problem(config: TrainConfig) -> str | None:
    """Where ``early_start`` changes nothing (its words after "no effect"), or None: it moves
    a GRPO trajectory's backward from its reward to its EpisodeCompleted, which only the
    non-deterministic streaming strategy does (sync and async learn after the batch; OPD's
    pieces start at each turn's teacher score; deterministic streaming already starts every
    trajectory's piece as soon as its tokens are known)."""
    if not config.training_mode().starts_backward_before_step:
        return f"with --mode {config.mode} (only streaming starts backwards before the step)"
    if config.algo != "grpo":
        return "with --algo opd (its turns' gradients already start at each teacher score)"
    if config.deterministic:
        return (
            "with --deterministic (its streaming already starts each trajectory's piece "
            "when its tokens are known)"
        )
    return None
