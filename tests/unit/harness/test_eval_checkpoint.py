"""``eval --checkpoint`` names what is wrong with the folder before any task runs: a step that
checkpoint rotation removed (and the checkpoints that exist), a run folder given for one of
its checkpoints, a model whose tokenizer has no chat template."""

from __future__ import annotations

import json
import shutil

from thundersync.cli import main


def refused(argv: list[str], capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    return err[0]


def fake_run(tmp_path, keep: int = 2):
    run = tmp_path / "runs" / "streaming"
    for step in (39, 40):
        folder = run / "checkpoints" / f"step-{step:06d}"
        folder.mkdir(parents=True)
        (folder / "config.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"keep_checkpoints": keep, "steps": 40}))
    return run


def test_a_rotated_away_step_says_so_and_lists_the_checkpoints_that_exist(tmp_path, capsys):
    run = fake_run(tmp_path)
    gone = run / "checkpoints" / "step-000020"
    line = refused(["eval", "--env", "thundersync/ToySum-v0", "--checkpoint", str(gone)], capsys)
    assert line.startswith(f"eval: error: --checkpoint {gone}: no such checkpoint"), line
    assert "keeps its 2 newest checkpoint(s) (--keep-checkpoints)" in line
    assert line.endswith(f"{run / 'checkpoints'} holds step-000039, step-000040"), line


def test_a_run_folder_names_its_checkpoints(tmp_path, capsys):
    run = fake_run(tmp_path)
    line = refused(["eval", "--env", "thundersync/ToySum-v0", "--checkpoint", str(run)], capsys)
    assert "a run folder, not a model folder; its checkpoints: step-000039, step-000040" in line
    assert f"--checkpoint {run / 'checkpoints' / 'step-000040'}" in line


def test_a_checkpoint_without_a_chat_template_says_how_to_add_one(
    tiny_model_dirs, tmp_path, capsys
):
    bare = tmp_path / "bare"
    shutil.copytree(tiny_model_dirs["qwen3"], bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    settings = json.loads((bare / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(settings))
    line = refused(["eval", "--env", "thundersync/ToySum-v0", "--checkpoint", str(bare)], capsys)
    assert f"--checkpoint {bare}: its tokenizer has no chat template" in line
    assert "chat_template.jinja" in line


def test_a_checkpoint_that_does_not_exist_says_so(tmp_path, capsys):
    """A typo in the run's name: not "no config.json", which suggests a broken model folder."""
    missing = tmp_path / "runs" / "nothere" / "checkpoints" / "step-000020"
    line = refused(["eval", "--env", "thundersync/ToySum-v0", "--checkpoint", str(missing)], capsys)
    assert line == f"eval: error: --checkpoint {missing}: no such folder", line
    empty = tmp_path / "empty"
    empty.mkdir()
    line = refused(["eval", "--env", "thundersync/ToySum-v0", "--checkpoint", str(empty)], capsys)
    assert line.endswith("not a model folder (no config.json)"), line


def test_a_run_of_lora_adapters_names_its_adapter_checkpoints(tmp_path, capsys):
    run = tmp_path / "runs" / "lora"
    for step in (1, 2):
        folder = run / "checkpoints" / f"step-{step:06d}"
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text("{}")  # a PEFT adapter folder: no config.json
    (run / "config.json").write_text(json.dumps({"keep_checkpoints": 2, "steps": 2}))
    line = refused(["eval", "--env", "thundersync/ToySum-v0", "--checkpoint", str(run)], capsys)
    assert "a run folder, not a model folder; its checkpoints: step-000001, step-000002" in line
