#!/usr/bin/env bash
# Builds interlock-cni as it ships: static glibc, non-PIE, its own start-up (feature
# lean-start, crates/lean-start), portable SHA-256 (feature soft-sha256), and the hot-text
# order where the toolchain has rust-lld (the flags come from scripts/plugin-rustflags.sh).
# INTERLOCK_PLUGIN_FEATURES replaces the feature list (soft-sha256 alone: the same build
# with glibc's own start-up, which the tests run too). lean-start mirrors glibc's x86-64
# start-up only, so other triples get soft-sha256 alone by default. The one place
# the shipped build is spelled out: `make plugin-static`, scripts/image-rootfs.sh,
# scripts/plugin-hot-text.sh and testing/bench/tests/it/shipped_plugin.rs all run it.
#
#   scripts/plugin-static.sh TRIPLE TARGET_DIR [more cargo build arguments]
#
# The binary is TARGET_DIR/TRIPLE/plugin/interlock-cni.
set -euo pipefail
triple=${1:?usage: scripts/plugin-static.sh TRIPLE TARGET_DIR [cargo args]}
target_dir=${2:?usage: scripts/plugin-static.sh TRIPLE TARGET_DIR [cargo args]}
shift 2
repo=$(cd "$(dirname "$0")/.." && pwd)
case $triple in
    x86_64-*) default_features=soft-sha256,lean-start ;;
    *) default_features=soft-sha256 ;;
esac
RUSTFLAGS="$("$repo/scripts/plugin-rustflags.sh" "$triple")" "${CARGO:-cargo}" build \
    --manifest-path "$repo/Cargo.toml" --profile plugin -p interlock-cni \
    --features "${INTERLOCK_PLUGIN_FEATURES-$default_features}" --target "$triple" \
    --target-dir "$target_dir" "$@"
