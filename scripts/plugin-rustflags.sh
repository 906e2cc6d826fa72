#!/usr/bin/env bash
# Prints the RUSTFLAGS of the shipped plugin build (`make plugin-static`, and
# scripts/image-rootfs.sh for the image), for target triple $1:
#   static glibc, non-PIE: the runtime starts the plugin once per pod, and dynamic loading
#   and relocation would be a large share of every ADD (docs/performance.md);
#   and, where the toolchain ships its own lld (rust-lld), glibc's start-up and the
#   functions a pod's ADD and DEL run placed first in the text, and the small .bss objects
#   first in .bss (crates/plugin/hot-text.order, made by scripts/plugin-hot-text.sh): the
#   kernel maps an executable's text 64 KiB around each page fault, so code that runs
#   together costs fewer faults. Without rust-lld the order is left out; the build is
#   otherwise the same.
set -euo pipefail
triple=${1:-}  # empty (no rustc yet): the base flags only
repo=$(cd "$(dirname "$0")/.." && pwd)
flags="-C target-feature=+crt-static -C relocation-model=static"
# v0 symbol names carry no per-function hash, so the order file's names survive edits to
# the code (legacy names changed with every change to a crate the plugin uses).
flags+=" -C symbol-mangling-version=v0"
order="$repo/crates/plugin/hot-text.order"
rustc_bin=${RUSTC:-rustc}
sysroot=$("$rustc_bin" --print sysroot 2>/dev/null || true)
gcc_ld="$sysroot/lib/rustlib/$triple/bin/gcc-ld"
if [[ -n $triple && -n $sysroot && -x $gcc_ld/ld.lld && -f $order ]]; then
    flags+=" -C link-arg=-fuse-ld=lld -C link-arg=-B$gcc_ld"
    flags+=" -C link-arg=-Wl,--symbol-ordering-file=$order -C link-arg=-Wl,--no-warn-symbol-ordering"
fi
echo "$flags"
