#!/usr/bin/env bash
# Installs the system packages interlock's build, tests and demo need, only when missing.
# Idempotent; needs root (it is a no-op when everything is present).
set -euo pipefail

packages=(
    iproute2                    # ip netns, veth, bridges
    iptables                    # iptables-restore (nft and legacy flavours)
    nftables                    # nft, used by tests to cross-check what the kernel holds
    containernetworking-plugins # the reference CNI plugins in /usr/lib/cni
    containerd                  # the runtime end-to-end runs use over CRI
    runc
    protobuf-compiler           # protoc for the CRI client
    procps                      # ps/pgrep used by tests
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if ((${#missing[@]} == 0)); then
    exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing packages: ${missing[*]}; run as root (or apt-get install -y ${missing[*]})" >&2
    exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
