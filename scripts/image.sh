#!/usr/bin/env bash
# `make image`: the interlock image as an OCI archive, without a Docker daemon: the
# filesystem the Dockerfile's build stage lays out (scripts/image-rootfs.sh, both
# binaries static, for the host's target triple), packed by scripts/image-oci.sh.
#
#   scripts/image.sh [OUT_DIR]      # default target/image
#
# Writes OUT_DIR/interlock-<version>.oci.tar and OUT_DIR/rootfs. Built from tracked files
# only: it refuses a work tree with changes not committed or untracked files that are
# not ignored (git status), because the image's revision label names the commit and the
# image must hold exactly that commit's code. Set INTERLOCK_IMAGE_ALLOW_DIRTY=1 to build
# such a tree anyway; the revision label then ends in "-dirty".
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$repo/target/image}
cd "$repo"

dirty=$(git status --porcelain --untracked-files=normal)
if [ -n "$dirty" ] && [ "${INTERLOCK_IMAGE_ALLOW_DIRTY:-}" != 1 ]; then
    {
        echo "image: refusing to build: the work tree differs from commit $(git rev-parse --short=12 HEAD),"
        echo "and the image's revision label would name a commit it does not hold:"
        sed 's/^/    /' <<<"$dirty"
        echo "Commit or stash these (or remove the untracked files), or set INTERLOCK_IMAGE_ALLOW_DIRTY=1."
    } >&2
    exit 1
fi

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)
rm -rf "$out/rootfs"
mkdir -p "$out"
scripts/image-rootfs.sh "$out/rootfs"
scripts/image-oci.sh "$out/rootfs" "$out/interlock-$version.oci.tar"
