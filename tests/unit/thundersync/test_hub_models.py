"""``--model`` / ``--checkpoint`` take a Hugging Face hub id, resolved in the local cache only:
a tiny model placed in a test cache laid out as the hub's (``models--org--name/snapshots/REV``
and ``refs/main``), offline, and one line saying how to download an id that is not there."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from thundersync.cli_output import without_startup_lines
from thundersync.models import model_folder
from thundersync.training.checks import with_model_folders
from thundersync.training.config import TrainConfig

ROOT = Path(__file__).resolve().parents[3]
REVISION = "0123456789abcdef0123456789abcdef01234567"
HUB_ID = "testorg/tiny-qwen3"


@pytest.fixture
def hub_cache(tmp_path, tiny_model_dirs, monkeypatch):
    """HF_HOME with HUB_ID cached as the hub lays it out; the library pointed at it, offline."""
    home = tmp_path / "hf-home"
    repo = home / "hub" / "models--testorg--tiny-qwen3"
    shutil.copytree(tiny_model_dirs["qwen3"], repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return home


def test_a_cached_hub_id_resolves_to_its_snapshot(hub_cache):
    folder = Path(model_folder(HUB_ID))
    assert folder == hub_cache / "hub" / "models--testorg--tiny-qwen3" / "snapshots" / REVISION
    assert (folder / "config.json").is_file()


def test_a_folder_is_taken_as_given(tiny_model_dirs, hub_cache):
    assert model_folder(str(tiny_model_dirs["qwen3"])) == str(tiny_model_dirs["qwen3"])


def test_an_uncached_hub_id_says_how_to_download_it_and_downloads_nothing(hub_cache):
    with pytest.raises(ValueError) as caught:
        model_folder("Qwen/Qwen2.5-0.5B-Instruct")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("--model Qwen/Qwen2.5-0.5B-Instruct: no such folder, and no model")
    assert "`hf download Qwen/Qwen2.5-0.5B-Instruct`" in message
    assert "`huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct`" in message
    assert not (hub_cache / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct").exists()


def test_a_train_config_names_the_snapshot_it_trains_from(hub_cache, tmp_path):
    config = with_model_folders(TrainConfig(model=HUB_ID, out=str(tmp_path / "run")))
    assert config.model.endswith(f"snapshots/{REVISION}")


def _cli(hub_home: Path, *argv: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HOME=str(hub_home), HF_HUB_OFFLINE="1")
    env.pop("HF_HUB_CACHE", None)
    return subprocess.run(
        [sys.executable, "-m", "thundersync.cli", *argv],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_eval_takes_a_hub_id_as_its_checkpoint_offline(hub_cache):
    done = _cli(
        hub_cache,
        "eval",
        "--env",
        "thundersync/ToySum-v0",
        "--env-kwargs",
        '{"tools": "python"}',
        "--checkpoint",
        HUB_ID,
        "--tasks",
        "1",
        "--max-new-tokens",
        "4",
        "--json",
        "--no-leaderboard",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["agent"] == "policy" and report["num_attempts"] == 1


def test_train_with_an_uncached_hub_id_is_one_line_and_exit_2(hub_cache, tmp_path):
    done = _cli(hub_cache, "train", "--model", "nobody/not-cached", "--out", str(tmp_path / "r"))
    assert done.returncode == 2
    assert without_startup_lines(done.stderr).strip().splitlines() == [
        "train: error: config field 'model': nobody/not-cached: no such folder, and no model "
        f"nobody/not-cached in the local Hugging Face cache ({hub_cache / 'hub'}); download it "
        "first with `hf download nobody/not-cached` (or `huggingface-cli download "
        "nobody/not-cached`): ThunderSync never downloads"
    ]


def test_a_missing_local_folder_is_not_sent_to_the_hub(hub_cache, tmp_path, monkeypatch):
    """``runs/warm`` reads as an ``org/name`` id too, but ``runs/`` is a folder here: the user
    meant the folder, which does not exist; `hf download runs/warm` would be no help."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "first-hour").mkdir(parents=True)
    with pytest.raises(ValueError) as caught:
        model_folder("runs/warm")
    message = str(caught.value)
    assert "\n" not in message and "hf download" not in message, message
    assert message.startswith("--model runs/warm: no such folder"), message
    assert "runs/ holds first-hour" in message, message
