# interlock — the two commands a newcomer needs are `make demo` and `make test`.
SHELL := /bin/bash
export PATH := $(HOME)/.cargo/bin:$(PATH)
CARGO ?= cargo

.PHONY: all deps build lint test demo bench clean

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

## test: everything CI runs (needs root for the netns / netfilter tests; they skip otherwise)
test: deps lint
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace --no-fail-fast

## demo: a throwaway node in network namespaces, two pods through a real chain
demo: deps
	$(CARGO) build --release -p interlock-cni -p interlock -p interlock-demo
	./target/release/interlock-demo --bin-dir ./target/release

## bench: criterion benchmarks and the JSON summary
bench: deps
	$(CARGO) bench --workspace

clean:
	$(CARGO) clean
