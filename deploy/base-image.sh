#!/bin/sh
# Build a Debian base image from Debian's archive, for a site that cannot pull from a public
# container registry: debootstrap a minimal bookworm and import it.
#   deploy/base-image.sh [IMAGE] (default localhost/debian:bookworm)
# Needs root, debootstrap and podman (or docker: CONTAINER=docker). The mirror is the one apt uses
# here unless DEBIAN_MIRROR is set.
set -eu
image="${1:-localhost/debian:bookworm}"
engine="${CONTAINER:-podman}"
if "$engine" image exists "$image" 2>/dev/null || "$engine" image inspect "$image" >/dev/null 2>&1; then
    echo "$image exists"
    exit 0
fi
mirror="${DEBIAN_MIRROR:-$(grep -rhoE '^(URIs:|deb) +https?://[^ ]+debian/?' /etc/apt/sources.list.d /etc/apt/sources.list 2>/dev/null | head -n1 | awk '{print $2}')}"
mirror="${mirror:-http://deb.debian.org/debian}"
rootfs="$(mktemp -d)"
trap 'rm -rf "$rootfs"' EXIT
echo "debootstrap bookworm from $mirror (about a minute and a half)"
debootstrap --variant=minbase bookworm "$rootfs" "$mirror" >/dev/null
# Security updates as well as the release: the image is a server's base.
printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s-security bookworm-security main\n' \
    "$mirror" "$mirror" "$mirror" >"$rootfs/etc/apt/sources.list"
rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
tar -C "$rootfs" -c . | "$engine" import --change 'CMD ["/bin/bash"]' - "$image" >/dev/null
echo "$image built"
