"""Offline Docker builds of task images, cached by the content of their build context."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from environments.sandboxes.protocol import SandboxError

LABEL = "thundersync"


def build_image(client: Any, context: Path) -> str:
    """Build the Dockerfile in ``context`` offline (cached by content hash); returns its tag."""
    if not (context / "Dockerfile").is_file():
        raise SandboxError(f"SandboxSpec.build_context {context} has no Dockerfile")
    digest = hashlib.sha256()
    for path in sorted(p for p in context.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(context)).encode() + b"\0" + path.read_bytes())
    tag = f"thundersync/build:{digest.hexdigest()[:16]}"
    try:
        client.images.get(tag)
        return tag
    except Exception:
        pass  # not built yet
    try:
        client.images.build(
            path=str(context), tag=tag, rm=True, forcerm=True, pull=False,
            network_mode="none", labels={LABEL: "1"},
        )  # fmt: skip
    except Exception as exc:
        log = "".join(str(c.get("stream", "")) for c in getattr(exc, "build_log", []) or [])
        raise SandboxError(f"docker build of {context} failed: {exc}\n{log[-2000:]}") from exc
    return tag
