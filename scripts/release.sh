#!/usr/bin/env bash
# `make release`: the release files in DIST, from an image build (scripts/image.sh):
#
#   interlock-<version>-<triple>       the agent and CLI, static
#   interlock-cni-<version>-<triple>   the CNI plugin, static (as the image installs it)
#   interlock-<version>-<arch>.oci.tar the image, an OCI archive (`ctr images import`,
#                                      `skopeo copy oci-archive:…`)
#   SHA256SUMS                         `sha256sum -c SHA256SUMS` checks all three
#   interlock.1                        the man page (`man -l interlock.1`)
#   completions/interlock.bash, completions/_interlock, completions/interlock.fish
#                                      shell completions (bash, zsh, fish)
#
# The man page and completions are generated from the CLI's definition by the released
# binary (`interlock man`, `interlock completions SHELL`); when it cannot run here (built
# for another architecture) they are left out, with a note.
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
cli="$dist/${files[0]}"
if "$cli" --version >/dev/null 2>&1; then
  mkdir -p "$dist/completions"
  "$cli" man >"$dist/interlock.1.tmp" && mv "$dist/interlock.1.tmp" "$dist/interlock.1"
  for sh in bash:interlock.bash zsh:_interlock fish:interlock.fish; do
    "$cli" completions "${sh%%:*}" >"$dist/completions/${sh#*:}.tmp"
    mv "$dist/completions/${sh#*:}.tmp" "$dist/completions/${sh#*:}"
  done
else
  echo "release: $cli does not run here (another architecture): no man page or completions" >&2
fi
(cd "$dist" && sha256sum "${files[@]}" >SHA256SUMS.tmp && mv SHA256SUMS.tmp SHA256SUMS)
ls -l "$dist"
