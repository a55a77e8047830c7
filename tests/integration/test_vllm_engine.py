"""``VLLMEngine`` against the protocol and against ``HFEngine`` on the same tiny model: stop ids
and limits, tokens independent of the batch, log-probs of the sampling distribution, in-place
weight loads, a clean close, and ``thundersync train --engine vllm`` and ``thundersync eval
--engine vllm`` end to end.

Needs vLLM (``make test-vllm`` runs these in .venv-vllm); skipped without it. The model has
head_dim 32, which vLLM's CPU attention supports (16 is not)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from thundersync.training.engines.engine import GenerationRequest, SamplingParams

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vLLM missing: `make test-vllm` installs it in .venv-vllm",
    ),
]

# Where vLLM and torch.compile write caches and sockets: under the tests' temporary folder
# (with the hub offline, no usage report and loopback only; subprocesses inherit all of it).
CACHE_VARIABLES = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "VLLM_RPC_BASE_PATH")


@pytest.fixture(scope="module", autouse=True)
def _vllm_stays_local(tmp_path_factory) -> Iterator[None]:
    root = tmp_path_factory.mktemp("vllm-cache")
    settings = {name: str(root / name.lower()) for name in CACHE_VARIABLES}
    settings |= {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_HOST_IP": "127.0.0.1"}
    # torch's inductor makes /tmp/torchinductor_$USER when vLLM imports it, and vLLM's
    # rendezvous file goes to the temporary folder: both under root instead.
    settings["TMPDIR"] = str(root)
    previous = {name: os.environ.get(name) for name in settings}
    previous_tempdir, tempfile.tempdir = tempfile.tempdir, str(root)
    os.environ.update(settings)
    yield
    tempfile.tempdir = previous_tempdir
    for name, value in previous.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from thundersync.models import build_tiny_model

    folder = tmp_path_factory.mktemp("vllm-model") / "qwen3"
    return build_tiny_model(folder, "qwen3", hidden_size=64, num_heads=2, max_positions=512)


@pytest.fixture(scope="module")
def children_at_start() -> set[int]:
    return child_pids()


@pytest.fixture(scope="module")
def engine(model_dir, children_at_start):
    """One engine for the module (the last engine test loads new weights and closes it)."""
    from thundersync.training.engines.vllm import VLLMEngine

    engine = VLLMEngine(model_dir, seed=0)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def hf(model_dir):
    from thundersync.training.engines.hf import HFEngine

    return HFEngine(model_dir)


def requests(
    n: int, *, max_new: int = 12, temperature: float = 1.0, stop: tuple[int, ...] = ()
) -> list[GenerationRequest]:
    return [
        GenerationRequest(
            tuple(range(5, 8 + i)),
            SamplingParams(max_new, temperature=temperature, stop_ids=stop),
            seed=1000 + i,
        )
        for i in range(n)
    ]


def teacher_forced_logprobs(hf, request: GenerationRequest, tokens: tuple[int, ...]) -> list:
    """log softmax(logits / T) of ``tokens`` after the prompt, from HFEngine's model."""
    ids = torch.tensor([list(request.prompt_ids) + list(tokens)])
    with torch.no_grad():
        logits = hf.model(input_ids=ids).logits[0, :-1].float()
    temperature = request.params.temperature or 1.0
    logp = torch.log_softmax(logits / temperature, dim=-1)
    start = len(request.prompt_ids) - 1
    return [float(logp[start + i, t]) for i, t in enumerate(tokens)]


def test_generation_from_ids_stops_at_a_stop_id_or_the_token_limit(engine):
    request = requests(1, max_new=10)[0]
    completion = engine.generate([request])[0]
    assert len(completion.token_ids) == 10 and completion.finish_reason == "length"
    assert len(completion.logprobs) == 10 and completion.policy_version == 0
    first = completion.token_ids[0]
    stopped = engine.generate([requests(1, max_new=10, stop=(first,))[0]])[0]
    assert stopped.token_ids == (first,) and stopped.finish_reason == "stop"
    with pytest.raises(ValueError, match="exceed the context"):
        engine.generate([requests(1, max_new=engine.max_context)[0]])
    with pytest.raises(ValueError, match="at least one prompt token"):
        engine.generate([GenerationRequest((), SamplingParams(4), seed=0)])


def test_tokens_depend_on_the_seed_not_on_the_batch(engine):
    reqs = requests(8)
    alone = [engine.generate([r])[0] for r in reqs]
    together = engine.generate(reqs)
    reversed_ = engine.generate(reqs[::-1])[::-1]
    tokens = [c.token_ids for c in alone]
    assert [c.token_ids for c in together] == tokens
    assert [c.token_ids for c in reversed_] == tokens
    reseeded = engine.generate([GenerationRequest(reqs[0].prompt_ids, reqs[0].params, 99)])
    assert reseeded[0].token_ids != tokens[0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_are_the_sampling_distributions_and_agree_with_hf(engine, hf, temperature):
    reqs = requests(4, max_new=16, temperature=temperature)
    gaps = []
    for request, completion in zip(reqs, engine.generate(reqs)):
        expected = teacher_forced_logprobs(hf, request, completion.token_ids)
        gaps += [abs(a - b) for a, b in zip(expected, completion.logprobs)]
    print(
        f"T={temperature}: |Δlogprob| vLLM vs HF mean {sum(gaps) / len(gaps):.2e}, "
        f"max {max(gaps):.2e} over {len(gaps)} tokens"
    )
    assert max(gaps) < 1e-5


def test_greedy_tokens_and_logprobs_match_hf(engine, hf):
    reqs = requests(4, max_new=12, temperature=0.0)
    ours, theirs = engine.generate(reqs), hf.generate(reqs)
    assert [c.token_ids for c in ours] == [c.token_ids for c in theirs]
    for a, b in zip(ours, theirs):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5


def test_loaded_weights_change_the_output_to_hfs_with_the_same_weights_and_close_is_clean(
    engine, model_dir, children_at_start
):
    from thundersync.training.engines.hf import HFEngine

    hf = HFEngine(model_dir)
    reqs = requests(8, max_new=12, temperature=0.0)
    before = engine.generate(reqs)
    flat = torch.cat([p.detach().reshape(-1) for p in hf.params])
    torch.manual_seed(0)
    new = flat + 0.5 * torch.randn_like(flat)
    engine.load_weights(new, policy_version=3)
    hf.load_weights(new, policy_version=3)
    after, expected = engine.generate(reqs), hf.generate(reqs)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    assert [c.token_ids for c in after] == [c.token_ids for c in expected]
    assert {c.policy_version for c in after} == {3} and before[0].policy_version == 0
    with pytest.raises(ValueError, match="values for"):
        engine.load_weights(flat[:-1], policy_version=4)
    engine.close()
    engine.close()  # safe twice
    with pytest.raises(RuntimeError, match="closed"):
        engine.generate(reqs)
    assert child_pids() <= children_at_start, "the engine left a process behind"


def child_pids() -> set[int]:
    """Live child processes of this process."""
    return {pid for pid, fields in live_processes() if int(fields[1]) == os.getpid()}


def live_processes() -> Iterator[tuple[int, list[str]]]:
    """(pid, the fields of /proc/PID/stat after the command name) of every live process."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z":
            yield int(name), fields


def test_train_with_the_vllm_engine_in_sync_and_streaming_mode_and_under_ray(model_dir, tmp_path):
    """Two deterministic steps each: sync, streaming, and streaming with the engine in a Ray
    actor (``--backend ray``, weights through the object store) roll out the same tokens and
    take the same update (in-process tools, no sandbox)."""
    common = [
        "--engine",
        "vllm",
        "--model",
        str(model_dir),
        "--steps",
        "2",
        "--tasks-per-step",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "8",
        "--env",
        "thundersync/ToySum-v0",
        "--env-kwargs",
        '{"tools": "python"}',
        "--deterministic",
        "--seed",
        "1",
        "--lr",
        "1e-2",
    ]
    runs = {"sync": ["--mode", "sync"], "streaming": ["--mode", "streaming"]}
    if importlib.util.find_spec("ray") is not None:
        runs["ray"] = ["--mode", "streaming", "--backend", "ray"]
    for name, args in runs.items():
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "thundersync.cli",
                "train",
                *args,
                "--out",
                str(tmp_path / name),
                *common,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        steps = [
            json.loads(line)["step"]
            for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        ]
        assert steps == [1, 2]
    a = final_weights(tmp_path / "sync")
    for name in list(runs)[1:]:
        assert turns(tmp_path / "sync") == turns(tmp_path / name), name
        b = final_weights(tmp_path / name)
        assert all(torch.equal(a[k], b[k]) for k in a), name


def test_train_with_vllm_and_with_hf_samples_the_same_greedy_tokens_and_reports_mismatch(
    model_dir, tmp_path
):
    """Greedy decoding, where the two engines' numerics agree (log-probs within ~1e-6):
    ``train --engine vllm`` and ``--engine hf`` from the same weights and seed take the same
    actions — every episode's turns, action lengths and rewards — and both report the
    sampler-vs-learner log-prob mismatch, small for both. (On-policy distillation, so that
    every action token is trained and compared: greedy GRPO groups have no spread.)"""
    common = [
        "--model",
        str(model_dir),
        "--steps",
        "1",
        "--tasks-per-step",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "8",
        "--temperature",
        "0",
        "--algo",
        "opd",
        "--teacher",
        str(model_dir),
        "--env",
        "thundersync/ToySum-v0",
        "--env-kwargs",
        '{"tools": "python"}',
        "--seed",
        "1",
        "--mode",
        "sync",
    ]
    for engine in ("hf", "vllm"):
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "thundersync.cli",
                "train",
                "--engine",
                engine,
                "--out",
                str(tmp_path / engine),
                *common,
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    assert turns(tmp_path / "hf") == turns(tmp_path / "vllm")
    assert rewards(tmp_path / "hf") == rewards(tmp_path / "vllm")
    for engine in ("hf", "vllm"):
        (record,) = [
            json.loads(line)
            for line in (tmp_path / engine / "metrics.jsonl").read_text().splitlines()
        ]
        mismatch = record["learner"]["logprob_mismatch_max"]
        assert mismatch is not None and mismatch < 1e-4, (engine, record["learner"])


def test_eval_with_vllm_and_with_hf_takes_the_same_greedy_actions_records_and_leaks_nothing(
    model_dir, tmp_path
):
    """``thundersync eval --checkpoint --engine vllm`` (no oracle: the policy alone) writes its
    report and a leaderboard row naming the engine, and, greedy, takes the same actions as
    ``--engine hf`` — every attempt's turns, action lengths, conversation and reward (as
    ``train`` does above). Each run is its own session: once it exits, no process of it is
    left (the engine was closed on the way out)."""
    from leaderboard.store import Store

    common = ["--env", "thundersync/ToySum-v0", "--env-kwargs", '{"tools": "python"}']
    common += ["--checkpoint", str(model_dir), "--tasks", "3", "-k", "2", "--seed", "1"]
    common += ["--max-new-tokens", "8", "--temperature", "0", "--db", str(tmp_path / "db")]
    for engine in ("hf", "vllm"):
        child = subprocess.Popen(
            [sys.executable, "-m", "thundersync.cli", "eval", "--engine", engine, *common]
            + ["--out", str(tmp_path / engine)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        output, _ = child.communicate(timeout=600)
        assert child.returncode == 0, output
        assert f"agent policy ({engine})" in output, output
        # vLLM's own start-up line: the run did generate with vLLM, not with transformers
        assert ("Initializing a V1 LLM engine" in output) == (engine == "vllm"), output
        assert session_pids(child.pid) == set(), f"eval --engine {engine} left a process behind"
    reports = {e: json.loads((tmp_path / e / "results.json").read_text()) for e in ("hf", "vllm")}
    assert reports["vllm"]["engine"] == "vllm" and reports["vllm"]["num_attempts"] == 6
    assert turns(tmp_path / "hf") == turns(tmp_path / "vllm")
    assert all(length > 0 for *_, length in turns(tmp_path / "vllm"))
    assert rewards(tmp_path / "hf") == rewards(tmp_path / "vllm")
    assert attempts(tmp_path / "hf") == attempts(tmp_path / "vllm")
    with Store(tmp_path / "db", read_only=True) as store:
        rows = store.entries(kind="eval")
    assert [row.config["engine"] for row in rows] == ["hf", "vllm"]
    assert rows[0].metrics == rows[1].metrics


def session_pids(session: int) -> set[int]:
    """Live processes of the session ``session`` (whose leader was that process)."""
    return {pid for pid, fields in live_processes() if int(fields[3]) == session}


def attempts(out: Path) -> list[tuple]:
    records = [json.loads(line) for line in (out / "attempts.jsonl").read_text().splitlines()]
    return sorted((r["episode_id"], r["reward"], r["conversation"]) for r in records)


def rewards(out: Path) -> list[tuple]:
    from thundersync.protocol.events import read_jsonl

    return sorted(
        (r["episode_id"], r["reward"])
        for r in read_jsonl(out / "events.jsonl")
        if r["event"] == "RewardReady"
    )


def turns(out: Path) -> list[tuple]:
    from thundersync.protocol.events import read_jsonl

    records = read_jsonl(out / "events.jsonl")
    return sorted(
        (r["episode_id"], r["turn"], r["action_ids_len"])
        for r in records
        if r["event"] == "TurnCompleted"
    )


def final_weights(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    last = sorted((out / "checkpoints").glob("step-*"))[-1]
    return load_file(last / "model.safetensors")


def test_an_evaluator_on_vllm_loads_a_later_checkpoint_as_hf_does(model_dir, tmp_path):
    """What ``compare`` does for a run trained with vLLM: one evaluator on the vLLM engine,
    each checkpoint's weights loaded in place (the learner's order from the checkpoint)."""
    from harness.policy_eval import PolicyEvaluator
    from thundersync.models import load_model
    from thundersync.training.engines.hf import HFEngine

    later = tmp_path / "later"
    model = load_model(model_dir, dtype=torch.float32)
    torch.manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))
    model.save_pretrained(later)
    load_tokenizer_into(model_dir, later)
    reqs = requests(4, max_new=10, temperature=0.0)
    with PolicyEvaluator(model_dir, engine="vllm", max_new_tokens=10) as judge:
        before = judge.engine.generate(reqs)
        judge.load(later)
        after = judge.engine.generate(reqs)
    expected = HFEngine(later).generate(reqs)
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    assert [c.token_ids for c in after] == [c.token_ids for c in expected]


def load_tokenizer_into(source: Path, folder: Path) -> None:
    from thundersync.models import load_tokenizer

    load_tokenizer(source).save_pretrained(folder)
