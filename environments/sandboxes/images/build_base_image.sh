#!/usr/bin/env bash
# Build the project's Docker base image (thundersync/base:bookworm) offline, once.
#
# No container registry is reachable, so the image is a debootstrap rootfs imported with
# `docker import`. Idempotent: does nothing when the image already exists. Needs root,
# debootstrap, a running Docker daemon and a reachable Debian mirror (the apt sources').
# Usage: build_base_image.sh [IMAGE]   (default thundersync/base:bookworm; env MIRROR overrides)
set -euo pipefail

IMAGE="${1:-thundersync/base:bookworm}"
SUITE=bookworm
PACKAGES=python3,python3-pytest,git,patch,tmux,procps,coreutils

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    echo "build_base_image: $IMAGE already present"
    exit 0
fi
command -v debootstrap >/dev/null || { echo "build_base_image: debootstrap not installed" >&2; exit 1; }

if [ -z "${MIRROR:-}" ]; then
    # The first Debian mirror named in the apt sources (deb822 or one-line format).
    MIRROR="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
        /etc/apt/sources.list.d/*.list 2>/dev/null | grep -vE '^[[:space:]]*#' \
        | grep -oE 'https?://[^ ]+/debian/?( |$)' | head -n1 | tr -d ' ' || true)"
    MIRROR="${MIRROR:-http://deb.debian.org/debian}"
fi

ROOTFS="$(mktemp -d /tmp/thundersync-rootfs.XXXXXX)"
cleanup() { rm -rf --one-file-system "$ROOTFS"; }
trap cleanup EXIT

echo "build_base_image: debootstrap $SUITE from $MIRROR into $ROOTFS"
debootstrap --variant=minbase --include="$PACKAGES" "$SUITE" "$ROOTFS" "$MIRROR" >/dev/null
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/*
tar -C "$ROOTFS" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["/bin/bash"]' - "$IMAGE" >/dev/null
echo "build_base_image: built $IMAGE"
