#!/usr/bin/env bash
# `make release`: the release files in DIST, from an image build (scripts/image.sh):
#
#   interlock-<version>-<triple>       the agent and CLI, static
#   interlock-cni-<version>-<triple>   the CNI plugin, static (as the image installs it)
#   interlock-<version>-<arch>.oci.tar the image, an OCI archive (`ctr images import`,
#                                      `skopeo copy oci-archive:…`)
#   SHA256SUMS                         `sha256sum -c SHA256SUMS` checks all three
#
#   scripts/release.sh DIST ROOTFS ARCHIVE
#
# The binaries are the image's own (ROOTFS/usr/local/bin), so what is published and what
# the image runs are the same bytes. Files of another version or triple already in DIST
# stay; SHA256SUMS lists what this run wrote.
set -euo pipefail
dist=${1:?usage: scripts/release.sh DIST ROOTFS ARCHIVE}
rootfs=${2:?usage: scripts/release.sh DIST ROOTFS ARCHIVE}
archive=${3:?usage: scripts/release.sh DIST ROOTFS ARCHIVE}
repo=$(cd "$(dirname "$0")/.." && pwd)
version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml")
triple=${INTERLOCK_TARGET:-$(rustc -vV | sed -n 's/^host: //p')}
arch=$(tar -xOf "$archive" index.json | jq -r '.manifests[0].platform.architecture')
[ -n "$arch" ] && [ "$arch" != null ] || { echo "release: $archive names no architecture" >&2; exit 1; }

mkdir -p "$dist"
files=("interlock-$version-$triple" "interlock-cni-$version-$triple" "interlock-$version-$arch.oci.tar")
install -m 0755 "$rootfs/usr/local/bin/interlock" "$dist/${files[0]}"
install -m 0755 "$rootfs/usr/local/bin/interlock-cni" "$dist/${files[1]}"
install -m 0644 "$archive" "$dist/${files[2]}"
(cd "$dist" && sha256sum "${files[@]}" >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
ls -l "$dist"
