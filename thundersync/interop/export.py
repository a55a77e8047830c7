"""``thundersync export --format atif``: a run's or an eval's episodes as one ATIF document each.

The source is a folder's ``trajectories.jsonl`` (every episode event in full, token ids and
log-probs included); ``events.jsonl`` holds only token counts, so a folder without the former
cannot give a training-grade export and is refused with the reason. Messages hold text: an
eval's from its ``attempts.jsonl``, a training run's decoded from its ids with the tokenizer
of the model its ``config.json`` names (``TextDecoder``). A ``compare`` folder is
exported run by run (``OUT/<run>/``). Light to import: the ``atif`` package is loaded only when
a document is built. Exit codes: 0 written, 2 bad input (with a one-line reason).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from thundersync.cli_output import WIDTH, HelpFormatter, Progress, fit, print_verdict
from thundersync.interop.atif import AtifError, atif_models, episodes, to_atif
from thundersync.protocol import events as ev
from thundersync.protocol.strict_json import dumps_nulled
from thundersync.training.chat import ChatFormat

if TYPE_CHECKING:
    from thundersync.protocol.episode import EpisodeRecord
    from thundersync.training.chat import ChatFormat

TRAJECTORIES = "trajectories.jsonl"


def add_export_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "export",
        help="write a run's or an eval's episodes as ATIF trajectories",
        description="Write every complete episode of a run folder (eval, train or a compare "
        "folder's runs) as one ATIF document (ATIF-v1.8, validated by the atif package's "
        "models), from the folder's trajectories.jsonl (train, compare and eval --out write "
        "it; a folder from before it existed is refused): each agent "
        "turn's exact prompt and completion token ids, sampling log-probs and policy version, "
        "tool calls and observations, their text (an eval's as it recorded it, a training "
        "run's decoded with the tokenizer of the model its config.json names), the reward and "
        "how it was graded. Needs the interop "
        "extra: pip install 'thundersync[interop]'. Exit 0: written; 2: bad input.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "folder", metavar="RUN_OR_EVAL_DIR", help="an eval, train or compare --out folder"
    )
    parser.add_argument("--format", choices=["atif"], default="atif", help="the output format")
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="output folder (default: RUN_OR_EVAL_DIR/atif)"
    )
    parser.set_defaults(func=run_export_command)


def run_export_command(args: argparse.Namespace) -> int:

    folder = Path(args.folder)
    out = Path(args.out) if args.out else folder / "atif"
    try:
        atif_models()
        runs = run_folders(folder)
        sources = [(name, run, read_trajectories(run)) for name, run in runs]
    except AtifError as exc:
        return _error(str(exc))
    total = sum(len(events) for _, _, events in sources)
    written = skipped = 0
    with Progress("export", total, "events") as progress:
        for name, run, events in sources:
            try:
                done, incomplete = export_run(run, events, out / name)
            except (AtifError, OSError) as exc:
                return _error(str(exc))
            written, skipped = written + done, skipped + len(incomplete)
            progress.advance(len(events))
    if written == 0:
        return _error(f"{folder}: no complete episode to export (nothing is not a pass)")
    left = f", {skipped} unfinished left out" if skipped else ""
    print(f"export: one <episode id>.json per episode in {out}")
    print_verdict(f"export: {written} episodes as ATIF-v1.8 documents{left}")
    return 0


def run_folders(path: Path) -> list[tuple[str, Path]]:
    """(name, folder) of each run in ``path``: the folder itself, or a compare folder's runs."""

    if not path.is_dir():
        raise AtifError(f"{path}: no such folder")
    if (path / "events.jsonl").is_file():
        return [("", path)]
    runs = sorted(p for p in path.glob("runs/*") if (p / "events.jsonl").is_file())
    if runs:
        return [(run.name, run) for run in runs]
    raise AtifError(
        f"{path}: not a run folder (no events.jsonl nor runs/*/events.jsonl): give a folder "
        "that train, compare or eval wrote with --out"
    )


def read_trajectories(run: Path) -> list[ev.Event]:
    """The episode events of ``run/trajectories.jsonl``, checked line by line."""

    path = run / TRAJECTORIES
    if not path.is_file():
        raise AtifError(
            f"{run}: no {TRAJECTORIES}: its events.jsonl holds token counts, not token ids, "
            "and an export without the sampled ids and log-probs cannot be trained on "
            "(train, compare and eval --out write it; this folder is older or not a run)"
        )
    events = []
    with path.open(encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                events.append(ev.from_dict(json.loads(line)))
            except (json.JSONDecodeError, ValueError, TypeError) as exc:
                truncated = " (a truncated file?)" if not line.endswith("\n") else ""
                raise AtifError(f"{path}:{number}: not an event line{truncated}: {exc}") from exc
    return events


def export_run(run: Path, events: list[ev.Event], out: Path) -> tuple[int, list[str]]:
    """Write the run's complete episodes to ``out``; (how many, the incomplete ones' ids)."""

    done, incomplete = episodes(events)
    texts = _conversations(run)
    decoder = None if texts else TextDecoder.of_run(run)
    version, agent = _version(), _agent(run)
    out.mkdir(parents=True, exist_ok=True)
    names: set[str] = set()
    for episode in done:
        episode_id = episode.known_start.episode_id
        recorded = texts.get(episode_id)
        decoded_with = None
        if decoder is not None and recorded is None:
            recorded, decoded_with = decoder.texts(episode), decoder.folder
        doc = to_atif(
            episode,
            session_id=run.name,
            texts=recorded,
            version=version,
            agent=agent,
            decoded_with=decoded_with,
        ).to_json_dict()
        name = re.sub(r"[^A-Za-z0-9._-]", "_", episode_id)
        while name in names:
            name += "_"
        names.add(name)
        text = dumps_nulled(doc, indent=1) + "\n"  # strict JSON: a NaN reward is null
        (out / f"{name}.json").write_text(text, encoding="utf-8")
    return len(done), incomplete


def _conversations(run: Path) -> dict[str, list[str]]:
    """Each attempt's conversation as text (eval's ``attempts.jsonl``), by episode id."""
    path = run / "attempts.jsonl"
    if not path.is_file():
        return {}
    out: dict[str, list[str]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record: Any = json.loads(line)
            out[record["episode_id"]] = [str(content) for _, content in record["conversation"]]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            continue  # text is a courtesy: the ids are the trajectory
    return out


class TextDecoder:
    """The text of a run's token ids, for a run that recorded ids only (``train``): the
    run's own tokenizer decodes them, and its chat template's wrapping (role headers,
    end-of-turn markers) is taken off the prompt and each observation, so that a message holds
    what an eval's export holds: the instruction, the action, the tool's output."""

    def __init__(self, folder: Path, chat: ChatFormat) -> None:
        self.folder, self.chat = folder, chat
        self._prompt = _wrapping(chat, chat.prompt_ids)
        self._observation = _wrapping(chat, chat.observation_ids)

    @classmethod
    def of_run(cls, run: Path) -> TextDecoder | None:
        """The decoder of the tokenizer the run names (its model, its initial tiny model or a
        checkpoint), or None when none loads: the ids are the trajectory, text a courtesy."""
        folder = _tokenizer_folder(run)
        if folder is None:
            return None
        try:
            from transformers import AutoTokenizer
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
            return cls(folder, ChatFormat(AutoTokenizer.from_pretrained(folder)))
        except (ImportError, OSError, ValueError, KeyError, TypeError) as exc:
            print(f"export: no text for {run}'s ids ({folder}: {exc})", file=sys.stderr)
            return None

    def texts(self, episode: EpisodeRecord) -> list[str]:
        """The prompt's content, then each turn's action and tool output."""
        out = [self._content(episode.known_start.prompt_ids, self._prompt)]
        for k, turn in enumerate(episode.turns):
            tool = episode.tools.get(k)
            out.append(self.chat.action_text(tuple(turn.action_ids)))
            out.append(self._content(tool.observation_ids, self._observation) if tool else "")
        return out

    def _content(
        self, ids: Sequence[int], wrapping: tuple[tuple[int, ...], tuple[int, ...]]
    ) -> str:
        head, tail = wrapping
        ids = tuple(ids)
        wrapped = len(ids) >= len(head) + len(tail) and ids[: len(head)] == head
        if wrapped and ids[len(ids) - len(tail) :] == tail:
            # content was encoded with special-token strings split as text: decode it whole
            middle = list(ids[len(head) : len(ids) - len(tail)])
            return self.chat.tokenizer.decode(middle, skip_special_tokens=False)
        return self.chat.tokenizer.decode(list(ids), skip_special_tokens=True)


def _wrapping(
    chat: ChatFormat, wrap: Callable[[str], tuple[int, ...]]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids ``wrap`` (``prompt_ids`` or ``observation_ids``) puts before and after a
    message's content, found by wrapping nothing and a probe."""
    empty, probe = tuple(wrap("")), "x"
    wrapped, content = tuple(wrap(probe)), tuple(chat.content_ids(probe))
    for cut in range(len(empty) + 1):
        if wrapped == empty[:cut] + content + empty[cut:]:
            return empty[:cut], empty[cut:]
    return (), ()


def _tokenizer_folder(run: Path) -> Path | None:
    """A folder with the run's tokenizer: the model ``config.json`` names, the tiny model a
    run without one built, else its newest checkpoint (every checkpoint saves it)."""
    try:
        config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        config = {}
    named = [config.get(k) for k in ("model", "checkpoint")] if isinstance(config, dict) else []
    candidates = [Path(str(p)) for p in named if p]
    candidates.append(run / "init-model")
    candidates += sorted((run / "checkpoints").glob("step-*"), reverse=True)
    return next((p for p in candidates if (p / "tokenizer_config.json").is_file()), None)


AGENT_SETTINGS = ("agent", "mode", "algo", "env", "suite", "strict", "temperature", "seed")
"""The run's settings (``config.json``) that say who acted and how it was graded."""


def _agent(run: Path) -> dict[str, Any]:
    """The model (eval's checkpoint, train's initial model) and ``AGENT_SETTINGS``."""
    try:
        config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    if not isinstance(config, dict):
        return {}
    agent = {key: config[key] for key in AGENT_SETTINGS if key in config}
    if config.get("lora") is not None:  # train --lora: the policy is adapters on the model
        agent["lora"] = config["lora"]
    model = config.get("checkpoint") or config.get("model")
    base = _adapter_base(Path(str(model))) if model else None
    if base is not None:  # eval of a LoRA adapter checkpoint: the base it runs on
        agent["base_model"] = base
    return {**agent, "model": str(model)} if model else agent


def _adapter_base(folder: Path) -> str | None:
    """The base model a LoRA adapter folder names (``adapter_config.json``), else None."""
    try:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    base = config.get("base_model_name_or_path") if isinstance(config, dict) else None
    return base if isinstance(base, str) else None


def _version() -> str:

    try:
        return version("thundersync")
    except PackageNotFoundError:
        return "unknown"


def _error(message: str) -> int:
    print(fit(f"export: error: {message}", 10 * WIDTH), file=sys.stderr)
    return 2
