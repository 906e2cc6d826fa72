#!/usr/bin/env bash
# Packs an image filesystem (laid out by scripts/image-rootfs.sh) into an OCI image
# archive with umoci, no container engine or daemon: one layer, the Dockerfile's final
# stage's ENV, ENTRYPOINT and CMD (read from the Dockerfile itself, so the two cannot
# drift apart), and the OCI labels org.opencontainers.image.{source,revision,version,
# created,licenses,title}.
#
#   scripts/image-oci.sh ROOTFS ARCHIVE
#
# Reproducible: every timestamp (file mtimes in the layer, the config's `created`, the
# history, the archive's own entries) is SOURCE_DATE_EPOCH, by default the commit time of
# HEAD, and files are owned by 0:0 in name order, so the same rootfs gives the same bytes.
# The archive is an OCI image layout (oci-layout, index.json, blobs/) whose index names
# the image twice: `org.opencontainers.image.ref.name` (the tag, for skopeo/podman's
# `oci-archive:`) and `io.containerd.image.name` (the full reference, so a plain
# `ctr -n k8s.io images import ARCHIVE` tags it as the manifests pull it).
#
# Environment:
#   INTERLOCK_IMAGE          the reference (default ghcr.io/interlock-dev/interlock:v<version>,
#                            what `interlock manifests` renders by default)
#   INTERLOCK_IMAGE_SOURCE   the source label (default https://github.com/interlock-dev/interlock)
#   INTERLOCK_TARGET         the binaries' target triple (default: rustc's host triple);
#                            it gives the image's architecture
#   SOURCE_DATE_EPOCH        as above
# The revision label is HEAD's full commit, with "-dirty" when the work tree has changes
# not committed or untracked files (scripts/image.sh refuses to build from such a tree;
# the tests pack what they built from the work tree as it is).
set -euo pipefail

rootfs=${1:?usage: scripts/image-oci.sh ROOTFS ARCHIVE}
archive=${2:?usage: scripts/image-oci.sh ROOTFS ARCHIVE}
repo=$(cd "$(dirname "$0")/.." && pwd)
for tool in umoci jq; do
    command -v "$tool" >/dev/null || { echo "image-oci: $tool not found (make deps installs it)" >&2; exit 1; }
done
[ -x "$rootfs/usr/local/bin/interlock" ] || { echo "image-oci: $rootfs has no usr/local/bin/interlock: lay it out with scripts/image-rootfs.sh first" >&2; exit 1; }

version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' "$repo/Cargo.toml")
[ -n "$version" ] || { echo "image-oci: no version in $repo/Cargo.toml [workspace.package]" >&2; exit 1; }
license=$(sed -n '/^\[workspace.package\]/,/^\[/s/^license = "\(.*\)"/\1/p' "$repo/Cargo.toml")
image=${INTERLOCK_IMAGE:-ghcr.io/interlock-dev/interlock:v$version}
tag=${image##*:}
[[ $tag != */* && $tag != "$image" ]] || { echo "image-oci: INTERLOCK_IMAGE=$image has no tag" >&2; exit 1; }
source_url=${INTERLOCK_IMAGE_SOURCE:-https://github.com/interlock-dev/interlock}
revision=$(git -C "$repo" rev-parse HEAD)
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=normal)" ]; then
    revision="$revision-dirty"
fi
epoch=${SOURCE_DATE_EPOCH:-$(git -C "$repo" log -1 --format=%ct HEAD)}
created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
triple=${INTERLOCK_TARGET:-$(rustc -vV | sed -n 's/^host: //p')}
case ${triple%%-*} in
    x86_64) arch=amd64 ;;
    aarch64) arch=arm64 ;;
    i?86) arch=386 ;;
    armv7*) arch=arm ;;
    powerpc64le) arch=ppc64le ;;
    riscv64gc | riscv64) arch=riscv64 ;;
    s390x) arch=s390x ;;
    *) echo "image-oci: no OCI architecture known for $triple" >&2; exit 1 ;;
esac

# The Dockerfile's final stage (after its last FROM): ENV k=v, ENTRYPOINT and CMD in JSON
# form. Anything else there (a LABEL, USER, …) this packer would not reproduce: refuse.
dockerfile="$repo/Dockerfile"
final=$(awk '/^FROM /{buf=""} {buf=buf $0 "\n"} END{printf "%s", buf}' "$dockerfile" \
    | grep -v -e '^#' -e '^[[:space:]]*$' | tail -n +2)
config_args=()
while IFS= read -r line; do
    case $line in
        "ENV "*=*) config_args+=(--config.env "${line#ENV }") ;;
        "ENTRYPOINT ["*)
            config_args+=(--clear=config.entrypoint)
            while IFS= read -r a; do config_args+=(--config.entrypoint "$a"); done \
                < <(jq -r '.[]' <<<"${line#ENTRYPOINT }") ;;
        "CMD ["*)
            config_args+=(--clear=config.cmd)
            while IFS= read -r a; do config_args+=(--config.cmd "$a"); done \
                < <(jq -r '.[]' <<<"${line#CMD }") ;;
        "COPY "*) ;;
        *) echo "image-oci: the Dockerfile's final stage has \"$line\", which this packer does not reproduce" >&2; exit 1 ;;
    esac
done <<<"$final"

work=$(mktemp -d "${TMPDIR:-/tmp}/interlock-image.XXXXXX")
trap 'rm -rf "$work"' EXIT
layout="$work/layout"
rootless=()
[ "$(id -u)" -eq 0 ] || rootless=(--rootless)
umoci init --layout "$layout"
umoci new --image "$layout:$tag"
umoci unpack "${rootless[@]}" --image "$layout:$tag" "$work/bundle"
cp -a "$rootfs/." "$work/bundle/rootfs/"
[ "$(id -u)" -ne 0 ] || chown -R -h 0:0 "$work/bundle/rootfs"
find "$work/bundle/rootfs" -exec touch -h -d "@$epoch" {} +
umoci repack "${rootless[@]}" --image "$layout:$tag" --history.created "$created" \
    --history.created_by "scripts/image-rootfs.sh" "$work/bundle"
# Docker's default PATH for an image that sets none (the scratch base sets none).
umoci config --image "$layout:$tag" --no-history --created "$created" \
    --architecture "$arch" --os linux \
    --config.env "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    "${config_args[@]}" \
    --config.label "org.opencontainers.image.title=interlock" \
    --config.label "org.opencontainers.image.source=$source_url" \
    --config.label "org.opencontainers.image.revision=$revision" \
    --config.label "org.opencontainers.image.version=$version" \
    --config.label "org.opencontainers.image.created=$created" \
    --config.label "org.opencontainers.image.licenses=$license"
umoci gc --layout "$layout"
jq -c --arg name "$image" --arg arch "$arch" \
    '.manifests[0].annotations["io.containerd.image.name"] = $name
     | .manifests[0].platform = {architecture: $arch, os: "linux"}' \
    "$layout/index.json" >"$work/index.json"
mv "$work/index.json" "$layout/index.json"

mkdir -p "$(dirname "$archive")"
find "$layout" -exec touch -h -d "@$epoch" {} +
tar --sort=name --format=ustar --owner=0 --group=0 --numeric-owner --mode=a+rX --mtime="@$epoch" \
    -C "$layout" -cf "$archive.tmp" oci-layout index.json blobs
mv "$archive.tmp" "$archive"
echo "$image ($arch, revision $revision): $archive"
