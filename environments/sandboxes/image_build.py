"""Offline Docker builds of task images, and aliases from public base images to local ones.

No registry is reachable, so ``FROM ubuntu:24.04`` (what published Harbor and Terminal-Bench
tasks say) cannot be pulled. An image alias ``PUBLIC=LOCAL`` maps a public name to an image the
daemon has, e.g. ``ubuntu:24.04=thundersync/base:bookworm``: ``build_image`` rewrites each
``FROM`` through the aliases before building (the daemon's tags are left alone), and a base
image that is still missing is refused without a pull, naming the alias that would help.

Aliases come from ``thundersync eval --image-alias PUBLIC=LOCAL`` (repeatable; it calls
``use_image_aliases``) and from the environment variable ``THUNDERSYNC_IMAGE_ALIASES``: pairs
separated by commas or white space, e.g.
``THUNDERSYNC_IMAGE_ALIASES="ubuntu:24.04=thundersync/base:bookworm python:3.12-slim=..."``.
Where both name a public image, the command line wins. Names are compared in Docker's short
form: ``docker.io/library/ubuntu:24.04`` is ``ubuntu:24.04``, and a name without a tag is
``:latest``. An alias is applied once (its target is not looked up again).
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from environments.sandboxes.protocol import SandboxError

LABEL = "thundersync"
ALIASES_VARIABLE = "THUNDERSYNC_IMAGE_ALIASES"
LOCAL_BASE_IMAGE = "thundersync/base:bookworm"
"""The image ``environments/sandboxes/images/build_base_image.sh`` builds: what missing public
base images are pointed at in error messages."""
_FROM = re.compile(r"^(\s*FROM\s+)((?:--\S+\s+)*)(\S+)(.*)$", re.IGNORECASE | re.MULTILINE)
_STAGE = re.compile(r"\s+AS\s+(\S+)", re.IGNORECASE)

_configured: dict[str, str] = {}


def normalise_image(name: str) -> str:
    """Docker's short form of an image name: no ``docker.io/`` or ``library/``, a tag."""
    for prefix in ("docker.io/", "index.docker.io/", "registry-1.docker.io/"):
        if name.startswith(prefix):
            name = name[len(prefix) :]
    if name.startswith("library/") and name.count("/") == 1:
        name = name[len("library/") :]
    last = name.rsplit("/", 1)[-1]
    if "@" not in last and ":" not in last:
        name += ":latest"
    return name


def parse_image_aliases(items: Iterable[str], source: str) -> dict[str, str]:
    """``PUBLIC=LOCAL`` strings as a mapping; a ValueError names ``source`` and the bad item."""
    aliases: dict[str, str] = {}
    for item in items:
        public, sep, local = item.strip().partition("=")
        public, local = public.strip(), local.strip()
        if not sep or not public or not local or any(c.isspace() for c in public + local):
            raise ValueError(
                f"{source}: expected PUBLIC=LOCAL (e.g. ubuntu:24.04={LOCAL_BASE_IMAGE}), "
                f"got {item!r}"
            )
        aliases[normalise_image(public)] = local
    return aliases


def use_image_aliases(aliases: Mapping[str, str]) -> None:
    """Set this process's aliases from the command line (they win over the environment)."""
    _configured.clear()
    _configured.update({normalise_image(k): v for k, v in aliases.items()})


@contextmanager
def image_aliases_set(aliases: Mapping[str, str]) -> Iterator[None]:
    """``use_image_aliases`` for one command: the aliases before it are back on every path
    out, so a command run in-process (``main([...])``) leaves none behind for the next."""
    before = dict(_configured)
    use_image_aliases(aliases)
    try:
        yield
    finally:
        use_image_aliases(before)


def image_aliases() -> dict[str, str]:
    """The aliases in effect: ``THUNDERSYNC_IMAGE_ALIASES`` overlaid with the command line's."""
    raw = os.environ.get(ALIASES_VARIABLE, "")
    items = [item for item in re.split(r"[\s,]+", raw) if item]
    return {**parse_image_aliases(items, f"${ALIASES_VARIABLE}"), **_configured}


def resolve_image(image: str, aliases: Mapping[str, str] | None = None) -> str:
    """The local image ``image`` stands for: its alias's target, else ``image`` itself."""
    aliases = image_aliases() if aliases is None else aliases
    return aliases.get(normalise_image(image), image)


def missing_image_message(image: str, local: str) -> str:
    """Why ``image`` (built as ``local``) cannot be used, and which alias would help."""
    if normalise_image(image) != normalise_image(local):
        return f"image alias {image}={local}: no local image {local} (see `docker images`)"
    return (
        f"no local image {image} and no registry to pull it from: pass "
        f"--image-alias {image}={LOCAL_BASE_IMAGE} (or set "
        f"{ALIASES_VARIABLE}={image}={LOCAL_BASE_IMAGE}) to build on the local base image, "
        f"if the task needs nothing else from {image}"
    )


def rewrite_base_images(text: str, aliases: Mapping[str, str]) -> tuple[str, list[tuple[str, str]]]:
    """A Dockerfile's text with every ``FROM`` image mapped through ``aliases``, and each base
    image as (written, used); references to earlier stages, ``scratch`` and images named by
    build arguments are left alone."""
    stages: set[str] = set()
    bases: list[tuple[str, str]] = []

    def mapped(match: re.Match[str]) -> str:
        image, rest = match.group(3), match.group(4)
        stage = _STAGE.match(rest)
        known = image.lower() in stages or image == "scratch" or "$" in image
        if stage:
            stages.add(stage.group(1).lower())
        if known:
            return match.group(0)
        local = resolve_image(image, aliases)
        bases.append((image, local))
        return f"{match.group(1)}{match.group(2)}{local}{rest}"

    return _FROM.sub(mapped, text), bases


def require_local_image(client: Any, image: str, local: str) -> None:
    """SandboxError naming the alias that would help when the daemon lacks ``local``."""
    try:
        client.images.get(local)
    except Exception as exc:
        if type(exc).__name__ != "ImageNotFound":
            raise SandboxError(f"cannot look up image {local}: {exc}") from exc
        raise SandboxError(missing_image_message(image, local)) from None


def build_image(client: Any, context: Path) -> str:
    """Build the Dockerfile in ``context`` offline, its ``FROM`` lines mapped through the image
    aliases (cached by content hash); returns its tag."""
    if not (context / "Dockerfile").is_file():
        raise SandboxError(f"SandboxSpec.build_context {context} has no Dockerfile")
    text = (context / "Dockerfile").read_text(encoding="utf-8", errors="replace")
    rewritten, bases = rewrite_base_images(text, image_aliases())
    digest = hashlib.sha256(rewritten.encode() + b"\0")
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(context)).encode() + b"\0" + path.read_bytes())
    tag = f"thundersync/build:{digest.hexdigest()[:16]}"
    try:
        client.images.get(tag)
        return tag
    except Exception:
        pass  # not built yet
    for image, local in bases:
        require_local_image(client, image, local)
    with tempfile.TemporaryDirectory(prefix="thundersync-dockerfile-") as tmp:
        dockerfile = None
        if rewritten != text:  # outside the context: docker-py sends it along with the context
            dockerfile = str(Path(tmp) / "Dockerfile")
            Path(dockerfile).write_text(rewritten, encoding="utf-8")
        try:
            client.images.build(
                path=str(context),
                dockerfile=dockerfile,
                tag=tag,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode="none",
                labels={LABEL: "1"},
            )
        except Exception as exc:
            log = "".join(str(c.get("stream", "")) for c in getattr(exc, "build_log", []) or [])
            raise SandboxError(f"docker build of {context} failed: {exc}\n{log[-2000:]}") from exc
    return tag
