"""The families of ``thundersync/TerminalGen-v0``'s generated tasks (``generated.py``): task
``index`` as a pure function of the index (``task_spec``), before it is written as a folder."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

GENERATOR_VERSION = "1"
"""Part of the cache folder's name: bump it whenever a task's files change for an index."""
ANSWER_FILE = "answer.txt"

WORDS = (
    "apple",
    "banana",
    "cherry",
    "grape",
    "lemon",
    "mango",
    "olive",
    "peach",
    "walnut",
    "tomato",
    "carrot",
    "pepper",
    "onion",
    "radish",
    "garlic",
    "celery",
)
"""The text vocabulary: no word is a substring of another, so ``grep WORD`` matches exactly the
lines holding the word."""
EXTENSIONS = ("log", "txt", "csv", "json", "md")
CONFIG_KEYS = ("port", "timeout", "retries", "workers", "threads", "backlog", "buffer", "depth")
"""Config keys: none is a prefix of another followed by '=' (``grep '^KEY='`` is exact)."""


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One generated task before it is written: its id, family, prompt, files and answer."""

    task_id: str
    family: str
    instruction: str
    files: tuple[tuple[str, str], ...]
    """(path relative to /app, text) of the files the Dockerfile copies in."""
    command: str
    """The command (run in /app) whose output is the answer."""
    answer: str


def _lines_of_words(rng: random.Random, num_lines: int, word: str) -> list[list[str]]:
    """Lines of 3..6 vocabulary words; at least one line holds ``word`` and one does not."""
    while True:
        lines = [rng.choices(WORDS, k=rng.randint(3, 6)) for _ in range(num_lines)]
        holding = sum(word in line for line in lines)
        if 0 < holding < num_lines:
            return lines


def _text(lines: list[list[str]]) -> str:
    return "".join(" ".join(line) + "\n" for line in lines)


def _count_lines(rng: random.Random) -> tuple[str, dict[str, str], str, str]:
    word = rng.choice(WORDS)
    lines = _lines_of_words(rng, rng.randint(6, 14), word)
    answer = sum(word in line for line in lines)
    prompt = f"How many lines of /app/notes.txt contain the word {word}?"
    return prompt, {"notes.txt": _text(lines)}, f"grep -c {word} notes.txt", str(answer)


def _count_word(rng: random.Random) -> tuple[str, dict[str, str], str, str]:
    word = rng.choice(WORDS)
    lines = _lines_of_words(rng, rng.randint(4, 10), word)
    answer = sum(line.count(word) for line in lines)
    prompt = f"How many times does the word {word} occur in /app/notes.txt?"
    return prompt, {"notes.txt": _text(lines)}, f"grep -o {word} notes.txt | wc -l", str(answer)


def _first_line(rng: random.Random) -> tuple[str, dict[str, str], str, str]:
    word = rng.choice(WORDS)
    lines = _lines_of_words(rng, rng.randint(6, 14), word)
    answer = next(n for n, line in enumerate(lines, 1) if word in line)
    prompt = f"On which line of /app/notes.txt does the word {word} first appear?"
    command = f"grep -n -m1 {word} notes.txt | cut -d: -f1"
    return prompt, {"notes.txt": _text(lines)}, command, str(answer)


def _sum_column(rng: random.Random) -> tuple[str, dict[str, str], str, str]:
    column = rng.randint(2, 4)
    rows = [
        [rng.choice(WORDS), *(str(rng.randint(1, 99)) for _ in range(3))]
        for _ in range(rng.randint(4, 9))
    ]
    answer = sum(int(row[column - 1]) for row in rows)
    prompt = f"What is the sum of column {column} of the comma-separated file /app/data.csv?"
    command = f"awk -F, '{{s+=${column}}} END {{print s}}' data.csv"
    text = "".join(",".join(row) + "\n" for row in rows)
    return prompt, {"data.csv": text}, command, str(answer)


def _count_files(rng: random.Random) -> tuple[str, dict[str, str], str, str]:
    extension = rng.choice(EXTENSIONS)
    while True:
        names = {
            f"logs/{rng.choice(WORDS)}{rng.randint(1, 99)}.{rng.choice(EXTENSIONS)}"
            for _ in range(rng.randint(5, 12))
        }
        answer = sum(name.endswith(f".{extension}") for name in names)
        if answer:
            break
    files = {name: f"{name}\n" for name in sorted(names)}
    prompt = f"How many files in /app/logs have the extension .{extension}?"
    return prompt, files, f"ls logs/*.{extension} | wc -l", str(answer)


def _unique_words(rng: random.Random) -> tuple[str, dict[str, str], str, str]:
    chosen = rng.sample(WORDS, rng.randint(3, 10))
    words = chosen + rng.choices(chosen, k=rng.randint(2, 8))
    rng.shuffle(words)
    prompt = "How many distinct words does /app/words.txt hold (one word per line)?"
    text = "".join(f"{word}\n" for word in words)
    return prompt, {"words.txt": text}, "sort -u words.txt | wc -l", str(len(chosen))


def _max_number(rng: random.Random) -> tuple[str, dict[str, str], str, str]:
    numbers = rng.sample(range(1, 1000), rng.randint(5, 12))
    prompt = "What is the largest number in /app/numbers.txt (one number per line)?"
    text = "".join(f"{n}\n" for n in numbers)
    return prompt, {"numbers.txt": text}, "sort -n numbers.txt | tail -1", str(max(numbers))


def _config_value(rng: random.Random) -> tuple[str, dict[str, str], str, str]:
    keys = rng.sample(CONFIG_KEYS, rng.randint(3, 6))
    values = {key: rng.randint(1, 999) for key in keys}
    key = rng.choice(keys)
    prompt = f"What is the value of {key} in the config file /app/app.conf?"
    text = "".join(f"{k}={v}\n" for k, v in values.items())
    command = f"grep ^{key}= app.conf | cut -d= -f2"
    return prompt, {"app.conf": text}, command, str(values[key])


def _find_file(rng: random.Random) -> tuple[str, dict[str, str], str, str]:
    word = rng.choice(WORDS)
    others = [w for w in WORDS if w != word]
    numbers = rng.sample(range(1, 100), rng.randint(3, 7))
    target = rng.choice(numbers)
    files = {}
    for n in numbers:
        line = rng.choices(others, k=rng.randint(3, 6))
        if n == target:
            line.insert(rng.randint(0, len(line)), word)
        files[f"docs/note{n}.txt"] = " ".join(line) + "\n"
    prompt = f"Which file in /app/docs contains the word {word}? Answer with its path, docs/NAME."
    return prompt, files, f"grep -l {word} docs/*", f"docs/note{target}.txt"


Family = Callable[[random.Random], tuple[str, dict[str, str], str, str]]
FAMILIES: tuple[tuple[str, Family], ...] = (
    ("count-lines", _count_lines),
    ("count-word", _count_word),
    ("first-line", _first_line),
    ("sum-column", _sum_column),
    ("count-files", _count_files),
    ("unique-words", _unique_words),
    ("max-number", _max_number),
    ("config-value", _config_value),
    ("find-file", _find_file),
)


FAMILY_NAMES: tuple[str, ...] = tuple(name for name, _ in FAMILIES)
_MAKERS: dict[str, Family] = dict(FAMILIES)


def check_families(families: object) -> tuple[str, ...]:
    """``families`` as a tuple of distinct known family names (None: every family, in order)."""
    if families is None:
        return FAMILY_NAMES
    if isinstance(families, str) or not isinstance(families, list | tuple):
        raise ValueError(f"families: expected a list of family names, got {families!r}")
    names = tuple(families)
    unknown = [n for n in names if n not in _MAKERS]
    if not names or unknown or len(set(names)) != len(names):
        raise ValueError(
            f"families: expected distinct names of {list(FAMILY_NAMES)}, got {list(names)!r}"
        )
    return names


def task_id_of(index: int, families: tuple[str, ...] = FAMILY_NAMES) -> str:
    """Task ``index``'s id (its folder's name) without generating it: its family is
    ``families[index % len(families)]``."""
    return f"gen-{families[index % len(families)]}-{index:06d}"


def task_spec(index: int, families: tuple[str, ...] = FAMILY_NAMES) -> TaskSpec:
    """Task ``index``: a pure function of the index and its family (its own seeded generator,
    seeded by the index alone, so a (family, index) pair is the same task under any
    ``families``, and the cache folder named by its id is shared)."""
    if isinstance(index, bool) or not isinstance(index, int | np.integer) or index < 0:
        raise ValueError(f"task index: expected an integer >= 0, got {index!r}")
    index = int(index)
    family = families[index % len(families)]
    rng = random.Random(f"terminal-gen/{GENERATOR_VERSION}/{index}")
    question, files, command, answer = _MAKERS[family](rng)
    instruction = (
        f"{question}\nWrite only the answer to /app/{ANSWER_FILE} (one line), then submit.\n"
    )
    return TaskSpec(
        task_id=task_id_of(index, families),
        family=family,
        instruction=instruction,
        files=tuple(sorted(files.items())),
        command=command,
        answer=answer,
    )
