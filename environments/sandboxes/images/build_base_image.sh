#!/usr/bin/env bash
# Build the project's Docker base image (thundersync/base:bookworm) offline, once.
#
# No container registry is reachable, so the image is a debootstrap rootfs imported with
# `docker import`. Idempotent: does nothing when the image already exists. Needs root,
# debootstrap, a running Docker daemon and a reachable Debian mirror: the one this machine's
# apt configuration uses for bookworm (and its proxy), unless MIRROR names another.
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

# The package mirror: $MIRROR if set, else the one this machine's own apt configuration uses
# for the suite (apt resolves deb822 and one-line sources, mirrors with any path, and its
# index targets name the repository of each suite), else the first Debian repository named in
# the sources. There is no hard-coded fallback: a machine without one must say MIRROR=...
apt_mirror() {
    if command -v apt-get >/dev/null; then
        apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null \
            | awk -v suite="$SUITE" '$2 == suite { print $1; exit }'
    fi
}
sources_mirror() {
    {
        cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null | awk -v s="$SUITE" '
            $1 == "deb" { i = 2
                if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }
                if ($(i + 1) == s) { print $i; exit } }'
        cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk -v s="$SUITE" 'BEGIN { RS = "" }
            { uri = ""; ok = 0; off = 0; n = split($0, line, "\n")
              for (j = 1; j <= n; j++) {
                  m = split(line[j], w, " ")
                  if (w[1] == "URIs:") uri = w[2]
                  if (w[1] == "Enabled:" && w[2] == "no") off = 1
                  if (w[1] == "Suites:") for (k = 2; k <= m; k++) if (w[k] == s) ok = 1
              }
              if (ok && !off && uri != "") { print uri; exit } }'
    } | head -n1
}
if [ -z "${MIRROR:-}" ]; then
    MIRROR="$(apt_mirror || true)"
    MIRROR="${MIRROR:-$(sources_mirror || true)}"
fi
if [ -z "${MIRROR:-}" ]; then
    echo "build_base_image: no Debian mirror for $SUITE in the apt configuration; set MIRROR=URL" >&2
    exit 1
fi
# apt's own proxy setting, which debootstrap (plain wget) would not otherwise see.
if [ -z "${http_proxy:-}" ] && command -v apt-config >/dev/null; then
    eval "$(apt-config shell http_proxy Acquire::http::Proxy)"
    [ -n "${http_proxy:-}" ] && export http_proxy
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
