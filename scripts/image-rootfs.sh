#!/usr/bin/env bash
# Lays out the interlock image's filesystem in DIR: both binaries built static, where the
# DaemonSet runs them. The Dockerfile runs exactly this script, so a test of it
# (crates/cli/tests/it/image.rs) exercises the image build's steps without a container engine.
#
#   scripts/image-rootfs.sh DIR
#
# For the host's target triple (from `rustc -vV`; INTERLOCK_TARGET names another, which
# then needs that target's toolchain and linker). Static with glibc (-C
# target-feature=+crt-static): the image has no libc to load, and the plugin the agent copies onto the host must run there
# whatever the host's libc. The plugin is also non-PIE, with the code a pod's ADD runs
# placed first (scripts/plugin-rustflags.sh, as `make plugin-static`: its start-up is on
# every pod's path); the two builds use separate target dirs so neither's flags
# invalidate the other's cache.
#
# The one thing not static: Debian's iptables-legacy tools (xtables-legacy-multi, its
# extensions and the shared libraries they load, at the paths they have on Debian). On a
# node whose rules are legacy iptables the plugin records that backend, and the agent's
# audit reads a pod's rules back and repairs them with the same tools, which the host's
# tools cannot do from inside the agent's container. Their copyright files go along.
set -euo pipefail

out=${1:?usage: scripts/image-rootfs.sh DIR}
cd "$(dirname "$0")/.."
cargo_bin=${CARGO:-cargo}
triple=${INTERLOCK_TARGET:-$("${RUSTC:-rustc}" -vV | sed -n 's/^host: //p')}
[ -n "$triple" ] || { echo "image-rootfs: no target triple (rustc -vV printed no host)" >&2; exit 1; }
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

# iptables-legacy, for the audit and repair on legacy nodes (see above).
multi=$(command -v xtables-legacy-multi || true)
[ -n "$multi" ] || { echo "image-rootfs: xtables-legacy-multi not found (install iptables)" >&2; exit 1; }
multi=$(readlink -f "$multi")
xt_dir=$(dirname "$(find /usr/lib /lib -name libxt_REDIRECT.so -print -quit)")
[ -d "$xt_dir" ] || { echo "image-rootfs: the xtables extensions dir was not found" >&2; exit 1; }
install -D -m 0755 "$multi" "$out/usr/sbin/xtables-legacy-multi"
for fam in iptables ip6tables; do
    for t in "" -save -restore; do
        ln -sf xtables-legacy-multi "$out/usr/sbin/$fam-legacy$t"
    done
done
mkdir -p "$out$xt_dir"
cp -a "$xt_dir/." "$out$xt_dir/"
# Every shared library the tool and its extensions load, at the same path.
for f in "$multi" "$xt_dir"/*.so; do
    ldd "$f" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'
done | sort -u | while read -r lib; do
    install -D -m 0644 "$lib" "$out$lib"
done
chmod 0755 "$out"/lib64/ld-linux-*.so.* 2>/dev/null || true
for pkg in iptables libxtables12 libip4tc2 libip6tc2 libc6; do
    if [ -f "/usr/share/doc/$pkg/copyright" ]; then
        install -D -m 0644 "/usr/share/doc/$pkg/copyright" "$out/usr/share/doc/$pkg/copyright"
    fi
done
