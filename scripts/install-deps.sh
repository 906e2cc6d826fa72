#!/usr/bin/env bash
# Installs the system packages interlock's build, tests and demo need, only when missing.
# Idempotent; needs root (it is a no-op when everything is present).
set -euo pipefail

packages=(
    gcc                         # rustc links with cc; ring compiles C
    libc6-dev
    iproute2                    # ip netns, veth, bridges
    iptables                    # iptables-restore (nft and legacy flavours)
    nftables                    # nft, used by tests to cross-check what the kernel holds
    containernetworking-plugins # the reference CNI plugins in /usr/lib/cni
    containerd                  # the runtime end-to-end runs use over CRI
    runc
    protobuf-compiler           # protoc for the CRI client
    procps                      # ps/pgrep used by tests
    umoci                       # make image: packs the OCI image without a daemon
    jq                          # make image: the image's index and the Dockerfile's JSON lines
)

missing=()
for p in "${packages[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

check_toolchain() {
    # The Rust toolchain comes from rustup (no Debian package is new enough); say so
    # plainly instead of failing later with "command not found".
    local cargo_bin="${CARGO:-cargo}"
    if ! command -v "$cargo_bin" >/dev/null 2>&1 && [[ -x "$HOME/.cargo/bin/cargo" ]]; then
        cargo_bin="$HOME/.cargo/bin/cargo"
    fi
    if ! command -v "$cargo_bin" >/dev/null 2>&1; then
        echo "install-deps: no Rust toolchain found: install one with rustup (stable, with rustfmt and clippy)" >&2
        return 1
    fi
    for sub in fmt clippy; do
        if ! "$cargo_bin" "$sub" --version >/dev/null 2>&1; then
            echo "install-deps: cargo $sub is missing: rustup component add $( [[ $sub == fmt ]] && echo rustfmt || echo clippy )" >&2
            return 1
        fi
    done
}

ensure_venv() {
    # A Python with venv and pip: the machine image's python3 has both; a plain Debian
    # needs python3-venv (installed only when venv is missing).
    if python3 -m venv --help >/dev/null 2>&1; then
        return 0
    fi
    echo "install-deps: installing python3-venv"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends python3 python3-venv python3-pip
}

install_kube_python() {
    # The official Python Kubernetes client, a real client the fake API server's tests
    # (testing/testkit-node/tests/it/kubeapi_real_clients.rs) cross-check it with. It lives in its
    # own venv so the system's Python packages are left as they are.
    local venv="${INTERLOCK_KUBE_VENV:-$HOME/.cache/interlock/kube-python}"
    local version=37.0.2
    if "$venv/bin/python" -c "import kubernetes, sys; sys.exit(kubernetes.__version__ != '$version')" 2>/dev/null; then
        return 0
    fi
    echo "install-deps: installing the Python Kubernetes client $version in $venv"
    ensure_venv
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "kubernetes==$version"
}

install_kube_validate() {
    # kubernetes-validate checks `interlock manifests` against the Kubernetes API schemas
    # offline (crates/cli/tests/it/manifests.rs); its own venv, like the client's.
    local venv="${INTERLOCK_KUBE_VALIDATE_VENV:-$HOME/.cache/interlock/kube-validate}"
    local version=1.37.0
    if [[ "$("$venv/bin/kubernetes-validate" --version 2>/dev/null)" == *"$version"* ]]; then
        return 0
    fi
    echo "install-deps: installing kubernetes-validate $version in $venv"
    ensure_venv
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "kubernetes-validate==$version"
}

check_kubectl() {
    # `kubectl kustomize` renders deploy/'s overlays in crates/cli/tests/it/manifests.rs;
    # they use `patches:`, which needs kustomize v3.1 or later (kubectl 1.21+). Debian's
    # kubernetes-client is older, so it is only a last resort and said so.
    if kubectl kustomize --help >/dev/null 2>&1; then
        return 0
    fi
    if [[ $(id -u) -ne 0 ]]; then
        echo "install-deps: kubectl is missing (kubectl kustomize renders deploy/): install kubectl 1.21 or later" >&2
        return 1
    fi
    echo "install-deps: installing kubectl (Debian's kubernetes-client; deploy/'s overlays need kubectl 1.21 or later)"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends kubernetes-client
}

if ((${#missing[@]} == 0)); then
    check_toolchain
    install_kube_python
    install_kube_validate
    check_kubectl
    exit $?
fi

if [[ $(id -u) -ne 0 ]]; then
    echo "install-deps: missing packages: ${missing[*]}; run as root (or apt-get install -y ${missing[*]})" >&2
    exit 1
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
check_toolchain
install_kube_python
install_kube_validate
check_kubectl
