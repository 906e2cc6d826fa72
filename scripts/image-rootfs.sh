#!/usr/bin/env bash
# Lays out the interlock image's filesystem in DIR: both binaries built static, where the
# DaemonSet runs them. The Dockerfile runs exactly this script, so a test of it
# (crates/cli/tests/image.rs) exercises the image build's steps without a container engine.
#
#   scripts/image-rootfs.sh DIR
#
# Static with glibc (-C target-feature=+crt-static on x86_64-unknown-linux-gnu): the image
# has no libc to load, and the plugin the agent copies onto the host must run there
# whatever the host's libc. The plugin is also non-PIE, with the code a pod's ADD runs
# placed first (scripts/plugin-rustflags.sh, as `make plugin-static`: its start-up is on
# every pod's path); the two builds use separate target dirs so neither's flags
# invalidate the other's cache.
set -euo pipefail

out=${1:?usage: scripts/image-rootfs.sh DIR}
cd "$(dirname "$0")/.."
cargo_bin=${CARGO:-cargo}
triple=x86_64-unknown-linux-gnu
static="-C target-feature=+crt-static"
plugin_dir=${INTERLOCK_STATIC_TARGET_DIR:-target/static}
agent_dir=${INTERLOCK_STATIC_AGENT_TARGET_DIR:-target/static-agent}

CARGO=$cargo_bin scripts/plugin-static.sh "$triple" "$plugin_dir" --locked --quiet
RUSTFLAGS="$static" "$cargo_bin" build --locked --quiet \
    --release -p interlock --bin interlock --target "$triple" --target-dir "$agent_dir"

mkdir -p "$out/usr/local/bin" "$out/usr/share/doc/interlock" "$out/etc/interlock" "$out/tmp"
chmod 1777 "$out/tmp"
install -m 0755 "$plugin_dir/$triple/plugin/interlock-cni" "$out/usr/local/bin/interlock-cni"
install -m 0755 "$agent_dir/$triple/release/interlock" "$out/usr/local/bin/interlock"
install -m 0644 LICENSE "$out/usr/share/doc/interlock/LICENSE"
