"""Image aliases: public base images (``FROM ubuntu:24.04``) mapped to local ones, in the Docker
build and in the bubblewrap rule, and missing images refused with the alias that would help."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from environments.sandboxes import image_build
from environments.sandboxes.image_build import (
    ALIASES_VARIABLE,
    build_image,
    image_aliases,
    parse_image_aliases,
    rewrite_base_images,
    use_image_aliases,
)
from environments.sandboxes.protocol import NeedsDockerError, SandboxError
from environments.terminal_bench import load_tasks
from environments.terminal_bench.dockerfile import BASE_IMAGE

FIXTURES = Path(__file__).resolve().parents[4] / "environments" / "fixtures" / "terminal_bench"
UBUNTU_TASK = FIXTURES / "published" / "ubuntu-word-count"
ALIAS = f"ubuntu:24.04={BASE_IMAGE}"


@pytest.fixture(autouse=True)
def no_aliases(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv(ALIASES_VARIABLE, raising=False)
    use_image_aliases({})
    yield
    use_image_aliases({})


class ImageNotFound(Exception):
    """Named like docker.errors.ImageNotFound, which is what build_image recognises."""


class FakeImages:
    def __init__(self, present: set[str]) -> None:
        self.present = set(present)
        self.builds: list[dict[str, Any]] = []

    def get(self, name: str) -> object:
        if name not in self.present:
            raise ImageNotFound(name)
        return object()

    def build(self, **kwargs: Any) -> None:
        dockerfile = kwargs.get("dockerfile")
        path = Path(dockerfile) if dockerfile else Path(kwargs["path"]) / "Dockerfile"
        self.builds.append({**kwargs, "text": path.read_text()})
        self.present.add(kwargs["tag"])


class FakeClient:
    def __init__(self, present: set[str]) -> None:
        self.images = FakeImages(present)


def test_aliases_parse_from_the_command_line_and_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert parse_image_aliases([ALIAS, " python:3.12-slim = py:local "], "--image-alias") == {
        "ubuntu:24.04": BASE_IMAGE,
        "python:3.12-slim": "py:local",
    }
    monkeypatch.setenv(ALIASES_VARIABLE, "docker.io/library/ubuntu:24.04=a:1, debian=b:2\nx=y")
    assert image_aliases() == {"ubuntu:24.04": "a:1", "debian:latest": "b:2", "x:latest": "y"}
    use_image_aliases({"ubuntu:24.04": "c:3"})
    assert image_aliases()["ubuntu:24.04"] == "c:3"  # the command line wins


@pytest.mark.parametrize("item", ["ubuntu", "=x", "ubuntu:24.04=", "a b=c", "ubuntu:24.04 = x y"])
def test_a_malformed_alias_names_its_source_and_item(item: str) -> None:
    with pytest.raises(ValueError, match=r"--image-alias: expected PUBLIC=LOCAL .*got"):
        parse_image_aliases([item], "--image-alias")


def test_from_lines_are_rewritten_except_stages_scratch_and_arguments() -> None:
    text = (
        "ARG BASE=debian\nFROM --platform=linux/amd64 ubuntu:24.04 AS build\nRUN make\n"
        "FROM build\nFROM scratch AS empty\nFROM ${BASE}\nfrom python:3.12-slim\n"
    )
    aliases = {"ubuntu:24.04": BASE_IMAGE, "python:3.12-slim": "py:local"}
    rewritten, bases = rewrite_base_images(text, aliases)
    assert rewritten == (
        f"ARG BASE=debian\nFROM --platform=linux/amd64 {BASE_IMAGE} AS build\nRUN make\n"
        "FROM build\nFROM scratch AS empty\nFROM ${BASE}\nfrom py:local\n"
    )
    assert bases == [("ubuntu:24.04", BASE_IMAGE), ("python:3.12-slim", "py:local")]


def test_a_missing_base_image_is_refused_naming_the_alias_that_would_help() -> None:
    client = FakeClient({BASE_IMAGE})
    with pytest.raises(SandboxError) as caught:
        build_image(client, UBUNTU_TASK / "environment")
    assert (
        f"no local image ubuntu:24.04 and no registry to pull it from: pass --image-alias "
        f"{ALIAS}" in str(caught.value)
    )
    assert client.images.builds == []


def test_an_aliased_base_image_is_built_from_the_local_image() -> None:
    use_image_aliases(parse_image_aliases([ALIAS], "--image-alias"))
    context = UBUNTU_TASK / "environment"
    client = FakeClient({BASE_IMAGE})
    tag = build_image(client, context)
    (build,) = client.images.builds
    assert build["text"].startswith(f"FROM {BASE_IMAGE}\n")
    assert not Path(build["dockerfile"]).is_relative_to(context)  # the task folder is untouched
    assert (context / "Dockerfile").read_text().startswith("FROM ubuntu:24.04\n")
    assert build["pull"] is False and build["network_mode"] == "none" and build["tag"] == tag
    use_image_aliases({"ubuntu:24.04": "missing:1"})
    with pytest.raises(SandboxError, match=r"image alias ubuntu:24.04=missing:1: no local image"):
        build_image(client, context)
    assert image_build.resolve_image("ubuntu:24.04") == "missing:1"


def test_bubblewrap_runs_a_public_base_image_only_through_an_alias(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    task = load_tasks(UBUNTU_TASK).get("ubuntu-word-count")
    with pytest.raises(NeedsDockerError) as caught:
        task.sandbox_spec("bwrap")
    assert f"pass --image-alias {ALIAS} (or set {ALIASES_VARIABLE})" in str(caught.value)
    assert task.sandbox_spec(None).build_context == UBUNTU_TASK / "environment"
    monkeypatch.setenv(ALIASES_VARIABLE, ALIAS)
    assert task.needs_docker_reason is None
    spec = task.sandbox_spec("bwrap")
    assert spec.image == BASE_IMAGE and (spec.files / "words.txt").is_file()
    monkeypatch.setenv(ALIASES_VARIABLE, "ubuntu:24.04=other:1")
    assert "aliased to 'other:1'" in (task.needs_docker_reason or "")


def test_a_prebuilt_public_image_is_staged_for_the_alias_too(tmp_path: Path) -> None:
    task_dir = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / "harbor" / "sales-report", task_dir)
    shutil.rmtree(task_dir / "environment")
    toml = task_dir / "task.toml"
    toml.write_text(
        toml.read_text().replace(
            "[environment]", '[environment]\ndocker_image = "python:3.12-slim"'
        )
    )
    task = load_tasks(task_dir).get("sales-report")
    context = task.sandbox_spec("docker").build_context
    with pytest.raises(SandboxError, match="pass --image-alias python:3.12-slim="):
        build_image(FakeClient({BASE_IMAGE}), context)
    use_image_aliases({"python:3.12-slim": BASE_IMAGE})
    assert task.needs_docker_reason is None
    assert task.sandbox_spec("bwrap").workdir == "/app"
