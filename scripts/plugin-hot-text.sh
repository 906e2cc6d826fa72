#!/usr/bin/env bash
# Regenerates crates/plugin/hot-text.order: the functions the shipped plugin runs for a
# pod's ADD (first a pod that is not meshed, then a meshed one) and DEL, in that order,
# which the static build places first in its text (scripts/plugin-rustflags.sh).
#
#   sudo scripts/plugin-hot-text.sh        (or: make plugin-hot-text)
#
# It runs the plugin under valgrind's callgrind, which lists every function executed, in
# two throwaway network namespaces of its own (a node with a bridge and a pod behind a
# veth, IPv4 and IPv6), removed on exit. The plugin's own start-up (feature lean-start)
# leaves glibc's CPU feature table empty, so its string functions resolve to the same
# baseline (SSE2) variants under valgrind as on any host: only those are listed, not the
# AVX2/EVEX/AVX-512 ones no run of this build ever calls. The build uses v0 symbol
# names, which survive edits to the code; they change with the toolchain, a dependency
# or the plugin's features. Stale names are harmless (the linker skips them; the order
# only decays), but regenerate after such an upgrade:
# crates/cli/tests/it/image.rs fails when fewer than three quarters of the names are still
# in the binary.
#
# Two lists come from the binary, not from callgrind:
# - the start-up and glibc's exit code, which run before and after main on every host,
#   and every IRELATIVE resolver (the start-up calls all of them); placed first, they
#   share the text pages the start faults in anyway;
# - the small .bss objects (under 4 KiB each), listed last: the linker puts them at the
#   start of .bss, before the large buffers (the netlink receive buffer, 64 KiB; glibc's
#   key table, 16 KiB) that otherwise spread the start-up's scattered writes over more
#   pages.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ $(id -u) != 0 ]]; then
    echo "plugin-hot-text: needs root (it makes throwaway network namespaces)" >&2
    exit 1
fi
if ! command -v valgrind >/dev/null; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind
fi
triple=$(rustc -vV | sed -n 's/^host: //p')
scripts/plugin-static.sh "$triple" target/static --quiet
plugin=$PWD/target/static/$triple/plugin/interlock-cni

tag=ilhot-$$
node=$tag-node pod=$tag-pod
work=$(mktemp -d)
cleanup() {
    [[ -n ${agent:-} ]] && kill "$agent" 2>/dev/null || true
    ip netns del "$pod" 2>/dev/null || true
    ip netns del "$node" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT
# A stand-in for the agent's socket: an Istio pod is decided with its spec's facts, which
# the plugin asks the agent for (the lookup doubles as the ADD's note). It answers every
# lookup with the facts of a pod as Istio's injector writes it (UID/GID 1337).
mkdir -m 0700 "$work/state"
python3 - "$work/state/agent.sock" <<'PY' &
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(8)
facts = {"containers": [{"name": "istio-validation", "init": True}, {"name": "app"},
         {"name": "istio-proxy", "runAsUser": 1337, "runAsGroup": 1337,
          "args": ["proxy", "sidecar"]}]}
while True:
    c, _ = s.accept()
    req = json.loads(c.makefile().readline() or "{}")
    if req.get("op") == "pod":
        ans = {"v": 1, "status": "found", "annotations": {}, "facts": facts,
               "noted": "add" in req}
    else:
        ans = {"v": 1, "status": "noted"}
    c.sendall((json.dumps(ans) + "\n").encode())
    c.close()
PY
agent=$!
for _ in $(seq 100); do [[ -S $work/state/agent.sock ]] && break; sleep 0.05; done
ip netns add "$node"
ip netns add "$pod"
ip -n "$node" -batch - <<B
link set lo up
link add ilhotbr0 type bridge
addr add 10.251.0.1/24 dev ilhotbr0
addr add fd00:251::1/64 dev ilhotbr0 nodad
link set ilhotbr0 up
link add ilhotv0 type veth peer name eth0 netns $pod
link set ilhotv0 master ilhotbr0 up
B
ip -n "$pod" -batch - <<B
link set lo up
addr add 10.251.0.2/24 dev eth0
addr add fd00:251::2/64 dev eth0 nodad
link set eth0 up
route add default via 10.251.0.1
route add default via fd00:251::1
B

# The stdin of a chained ADD: the plugin's entry, the runtime's annotations, the bridge
# plugin's result. $1: the pod annotations; $2: extra settings of the entry.
stdin() {
    cat <<J
{"cniVersion":"1.0.0","name":"ilhot","type":"interlock-cni","stateDir":"$work/state",$2
 "logFile":"$work/state/interlock-cni.log","excludeNamespaces":["kube-system"],
 "capabilities":{"io.kubernetes.cri.pod-annotations":true},
 "runtimeConfig":{"io.kubernetes.cri.pod-annotations":$1},
 "prevResult":{"cniVersion":"1.0.0",
  "interfaces":[{"name":"ilhotbr0","mac":"02:00:00:00:00:01"},{"name":"ilhotv0","mac":"02:00:00:00:00:02"},
                {"name":"eth0","mac":"02:00:00:00:00:03","sandbox":"/var/run/netns/$pod"}],
  "ips":[{"address":"10.251.0.2/24","gateway":"10.251.0.1","interface":2},
         {"address":"fd00:251::2/64","gateway":"fd00:251::1","interface":2}],
  "routes":[{"dst":"0.0.0.0/0","gw":"10.251.0.1"},{"dst":"::/0","gw":"fd00:251::1"}],"dns":{}}}
J
}
plain='{"kubernetes.io/config.source":"api"}'
istio='{"sidecar.istio.io/status":"{\"initContainers\":[\"istio-init\"],\"containers\":[\"istio-proxy\"],\"revision\":\"default\"}","kubectl.kubernetes.io/default-container":"app"}'

# run N COMMAND CONTAINER ANNOTATIONS [SETTINGS]: one plugin call under callgrind into
# $work/cg.N; it must succeed (an ADD also prints its result).
run() {
    if ! stdin "$4" "${5:-}" | env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin CNI_COMMAND="$2" \
        CNI_CONTAINERID="$3" CNI_NETNS=/var/run/netns/"$pod" CNI_IFNAME=eth0 \
        CNI_ARGS="K8S_POD_NAMESPACE=default;K8S_POD_NAME=$3;K8S_POD_INFRA_CONTAINER_ID=$3" \
        CNI_PATH=/usr/lib/cni \
        valgrind -q --tool=callgrind --demangle=no --callgrind-out-file="$work/cg.$1" \
        "$plugin" >"$work/out.$1" ||
        { [[ $2 == ADD ]] && ! grep -q '"ips"' "$work/out.$1"; }; then
        echo "plugin-hot-text: $2 of $3 failed:" >&2
        cat "$work/out.$1" >&2
        exit 1
    fi
}
# The first entry names its backend (as the bench's and some operators' do), the second
# lets the plugin detect it (the default): both parsers are on the list.
run 1 ADD plain "$plain" '"backend":"nftables",'
run 2 ADD meshed "$istio" "\"agentSocket\":\"$work/state/agent.sock\","
run 3 DEL meshed "$istio" "\"agentSocket\":\"$work/state/agent.sock\","

nm --defined-only "$plugin" | awk '$2 ~ /^[tTwW]$/ {print $3}' >"$work/syms"
# Function names in the order callgrind first names them (a recursion's 'N suffix off;
# code callgrind has no symbol for, shown as an address or "(below main)", left out).
names() {
    sed -nE "s/^c?fn=\([0-9]+\) (.+)$/\1/p" "$1" | sed -E "s/'[0-9]+$//" |
        grep -vE '^(0x[0-9a-f]+|\(below main\))$'
}
# The start-up (crates/lean-start/c/lean_start.c) and glibc's parts of it and of the exit,
# by name; those this build lacks are left out.
startup="__libc_start_main run_init_array run_fini_array
_dl_relocate_static_pie _dl_aux_init __tunables_init __tunable_get_val
__libc_setup_tls _dl_early_allocate init_first __mprotect __init_misc
__libc_early_init _dl_call_libc_early_init _IO_init frame_dummy register_tm_clones
deregister_tm_clones __do_global_dtors_aux __run_exit_handlers _IO_cleanup _exit _Exit"
{
    echo "# The functions interlock-cni runs for a pod's ADD (not meshed, then meshed) and DEL,"
    echo "# after glibc's start-up and its IRELATIVE resolvers; then the small .bss objects."
    echo "# Made by scripts/plugin-hot-text.sh, read by the linker (scripts/plugin-rustflags.sh)."
    {
        for f in $startup; do
            grep -xF "$f" "$work/syms" || true
        done
        nm --defined-only "$plugin" | awk '$2 == "i" || $3 ~ /_ifunc$/ {print $3}' | sort
        for n in 1 2 3; do
            names "$work/cg.$n" >"$work/names.$n"
            cat "$work/names.$n"
        done
        nm --defined-only --size-sort -S "$plugin" \
            | awk '$3 ~ /^[bB]$/ && $2 ~ /^0000000000000/ {print $4}' | sort
    } | awk '!seen[$0]++'
} >"$work/order"
mv "$work/order" crates/plugin/hot-text.order
# The order is not in cargo's view of the build: relink the plugin with it.
touch crates/plugin/src/main.rs
echo "plugin-hot-text: $(grep -vc '^#' crates/plugin/hot-text.order) functions in crates/plugin/hot-text.order"
