# interlock — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

# The plugin is shipped as a static, non-PIE executable with the code a pod's ADD runs
# placed first: the runtime starts it once per pod (scripts/plugin-rustflags.sh says why
# each flag; see docs/performance.md). --target keeps these flags away from proc-macros
# and build scripts.
HOST_TRIPLE := $(shell rustc -vV 2>/dev/null | sed -n 's/^host: //p')
STATIC_PLUGIN := target/static/$(HOST_TRIPLE)/plugin/interlock-cni
VERSION := $(shell sed -n '/^\[workspace.package\]/,/^\[/s/^version = "\(.*\)"/\1/p' Cargo.toml)

.PHONY: all deps build lint test demo soak soak-guard bench bench-json bench-repair bench-api-load bench-sandbox bench-budgets plugin-static plugin-hot-text image-rootfs image release clean

all: build

## deps: install the system packages the build, tests and demo need (only the missing ones)
deps:
	@bash scripts/install-deps.sh

build: deps
	$(CARGO) build --workspace --all-targets

## lint: formatting and clippy with warnings as errors
lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## test: everything CI runs (needs root for the netns / netfilter tests; they skip otherwise),
## the static plugin built and tested both with and without its lean start-up among them
test: deps lint
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --no-fail-fast

## demo: four race scenarios on nodes in a box (private containerd, reference
## primary, fake Kubernetes API), without and with interlock (the fourth keeps istio-cni,
## played by mesh-standin, and guards it); exit 1 if a meshed pod ran unprotected with
## interlock. Removes everything it made, also on Ctrl-C.
demo: deps
	$(CARGO) build --release -p interlock-cni -p interlock -p interlock-mesh-standins -p interlock-demo
	./target/release/interlock-demo --bin-dir ./target/release

## soak: a bounded chaos soak on a private containerd, judged by an independent checker
## (one JSON report on stdout, a summary on stderr; fails when an invariant broke).
## At least SOAK_MINUTES=10 minutes and CREATIONS=2000 sandboxes; its upgrade steps
## switch to SOAK_OTHER=v0.1.0 and back (built once per target dir from git, offline;
## SOAK_OTHER= restarts this build instead). Its sentinels are checked through the fake
## Kubernetes API. SOAK_ARGS for more flags (--seed N, --config-mode chain,
## --without-interlock for the control run, --no-kube without the API and sentinels,
## --guard-mesh istio|linkerd|consul|kuma for guard mode). It judges behaviour,
## not speed: the debug build `make test` made is used as is (SOAK_PROFILE=release for
## the shipped build).
CREATIONS ?= 2000
SOAK_MINUTES ?= 10
SOAK_OTHER ?= v0.1.0
SOAK_PROFILE ?= dev
SOAK_DIR := target/$(if $(filter dev,$(SOAK_PROFILE)),debug,$(SOAK_PROFILE))
soak: deps
	@$(CARGO) build --profile $(SOAK_PROFILE) -p interlock -p interlock-cni -p interlock-soak \
		-p interlock-mesh-standins
	@./$(SOAK_DIR)/interlock-soak --creations $(CREATIONS) --min-duration-s $$(( $(SOAK_MINUTES) * 60 )) \
		$(if $(SOAK_OTHER),--other-release $(SOAK_OTHER)) --bin-dir ./$(SOAK_DIR) $(SOAK_ARGS)

## soak-guard: the soak in guard mode, GUARD_MESH=istio (linkerd, consul, kuma): the
## mesh's plugin and installer stand-ins redirect, the agent guards them
## (--config-mode guard), and the chaos also restarts and kills the mesh's installer and
## deletes its plugin binary. Its upgrade steps restart this build (SOAK_OTHER's older
## release has no guard mode). A sentinel takes the audit's 30 s wait for a proxy.
GUARD_MESH ?= istio
soak-guard:
	@$(MAKE) --no-print-directory soak SOAK_OTHER= SOAK_ARGS="--guard-mesh $(GUARD_MESH) $(SOAK_ARGS)"

## plugin-static: the interlock-cni binary to ship ($(STATIC_PLUGIN))
plugin-static:
	@CARGO="$(CARGO)" scripts/plugin-static.sh $(HOST_TRIPLE) target/static

## plugin-hot-text: regenerate crates/plugin/hot-text.order, the functions the shipped
## plugin places first (root and valgrind; after a toolchain or dependency upgrade)
plugin-hot-text:
	@bash scripts/plugin-hot-text.sh

## image-rootfs: the image's filesystem in target/image-rootfs, built as the Dockerfile
## builds it (both binaries static); `docker build .` runs the same script
image-rootfs:
	@rm -rf target/image-rootfs
	@scripts/image-rootfs.sh target/image-rootfs
	@file target/image-rootfs/usr/local/bin/*

## image: the image as an OCI archive, target/image/interlock-$(VERSION).oci.tar, built
## without a Docker daemon (umoci), reproducibly, from committed files only: it refuses a
## work tree with uncommitted changes or untracked files (scripts/image.sh says why).
## Load it with `ctr -n k8s.io images import` or push it with `skopeo copy oci-archive:…`.
image: deps
	@scripts/image.sh target/image

## release: dist/ holds interlock-$(VERSION)-$(HOST_TRIPLE), interlock-cni-$(VERSION)-$(HOST_TRIPLE)
## (static, the image's own), the image archive and SHA256SUMS
release: image
	@scripts/release.sh dist target/image/rootfs target/image/interlock-$(VERSION).oci.tar

## bench: criterion benchmarks (root for the netns ones)
bench: deps
	$(CARGO) bench --workspace

## bench-json: the budget summary as one JSON document, for the shipped (static) plugin
bench-json: deps plugin-static
	@$(CARGO) build --release -p interlock-bench
	@nice -n -15 ./target/release/interlock-bench --pretty --plugin $(STATIC_PLUGIN)

## bench-repair: the agent's repair, follow, /readyz and primary-return latencies, one JSON line each
## (in the system temp dir: on disk, with fsync, like /etc/cni/net.d on a node;
## CLOBBERS=50 for a short run); the repair in both modes with 0 and FOREIGN further foreign
## files in the conf dir, on disk and on tmpfs (REPAIR_TMPFS); and a primary rewritten 100
## times a second with 0 and FOREIGN foreign files in both modes (agent CPU share). Every
## figure with a budget carries it and "pass" in its line.
CLOBBERS ?= 1000
FOREIGN ?= 1000
REPAIR_TMPFS ?= /dev/shm
bench-repair: deps
	@$(CARGO) build --release -p interlock -p interlock-cni -p interlock-bench
	@for run in "follow chain" "follow owned" "readyz owned" "return chain" "return owned"; do \
		set -- $$run; \
		./target/release/interlock-bench repair --clobbers $(CLOBBERS) --scenario $$1 --mode $$2 || exit 1; \
	done
	@for dir in "" $(REPAIR_TMPFS); do \
		for mode in chain owned; do \
			for f in 0 $(FOREIGN); do \
				./target/release/interlock-bench repair --clobbers $(CLOBBERS) --scenario clobber \
					--mode $$mode --foreign $$f $${dir:+--dir $$dir} || exit 1; \
			done; \
		done; \
	done
	@for mode in owned chain; do \
		for f in 0 $(FOREIGN); do \
			./target/release/interlock-bench repair --scenario writer --mode $$mode --foreign $$f || exit 1; \
		done; \
	done

## bench-api-load: Kubernetes API requests and bytes per node for N = 50, 100, 200
## simulated agents against the fake API server (one JSON document; about 5 minutes)
bench-api-load: deps
	@$(CARGO) build --release -p interlock-bench
	@./target/release/interlock-bench api-load --nodes 50,100,200 --pretty

## bench-sandbox: what interlock adds to a pod's sandbox start on a private containerd
## (the primary alone, with interlock, with an istio-cni stand-in; sequential and in
## bursts; one JSON document with the budgets; release build, the static plugin)
bench-sandbox: deps plugin-static
	@$(CARGO) build --release -p interlock -p interlock-bench
	@nice -n -15 ./target/release/interlock-bench sandbox --pretty --plugin $(STATIC_PLUGIN)

## bench-budgets: every budget judged on the median of BENCH_RUNS (3) runs of bench-json,
## bench-sandbox, bench-repair (its JSON lines, CLOBBERS, FOREIGN) and the audit (AUDIT_PODS
## netns, and a real agent on AUDIT_SANDBOXES sandboxes of a private containerd; 0 skips
## it), with the spread; the runs' documents and the summary (budgets.json) in target/bench/
BENCH_RUNS ?= 3
AUDIT_PODS ?= 1000
AUDIT_SANDBOXES ?= 1000
bench-budgets: deps plugin-static
	@$(CARGO) build --release -p interlock -p interlock-cni -p interlock-bench
	@mkdir -p target/bench
	@rm -f target/bench/plugin-*.json target/bench/sandbox-*.json target/bench/repair-*.jsonl target/bench/audit-*.json
	@for i in $$(seq 1 $(BENCH_RUNS)); do \
		echo "run $$i of $(BENCH_RUNS)" >&2; \
		nice -n -15 ./target/release/interlock-bench --plugin $(STATIC_PLUGIN) > target/bench/plugin-$$i.json || exit 1; \
		nice -n -15 ./target/release/interlock-bench sandbox --plugin $(STATIC_PLUGIN) > target/bench/sandbox-$$i.json || exit 1; \
		$(MAKE) --no-print-directory -s bench-repair > target/bench/repair-$$i.jsonl || exit 1; \
		./target/release/interlock-bench audit --pods $(AUDIT_PODS) > target/bench/audit-netns-$$i.json || exit 1; \
		if [ "$(AUDIT_SANDBOXES)" != 0 ]; then \
			./target/release/interlock-bench audit --agent-rss-sandboxes $(AUDIT_SANDBOXES) > target/bench/audit-agent-$$i.json || exit 1; \
		fi; \
	done
	@./target/release/interlock-bench budgets --pretty target/bench/plugin-*.json target/bench/sandbox-*.json \
		target/bench/repair-*.jsonl target/bench/audit-*.json | tee target/bench/budgets.json

clean:
	$(CARGO) clean
