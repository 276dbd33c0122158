# eagle-parity: every target bootstraps .venv on first use.
# The venv sees system site-packages so an existing torch (a CUDA build on a GPU
# machine) is used as it is; the CPU build of torch is installed only when no
# torch is importable at all.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.bootstrapped

MODEL    ?= tiny-llama3-eagle
# SCENARIO empty: the model's own (scenarios/llama3-eagle.yaml for llama3-eagle, else scenarios/default.yaml)
SCENARIO ?=
GATE_SCENARIO = $(or $(SCENARIO),scenarios/default.yaml)
MODES    ?= all
BACKEND  ?= auto
OUT      ?=
TORCH_CPU_VERSION ?= 2.13.0
FUZZ_SECONDS ?= 300

.PHONY: parity smoke test test-costly test-gpu bench gate models bugs clean help fuzz

help:
	@echo "make parity [MODEL=$(MODEL)] [SCENARIO=the model's own] [MODES=$(MODES)] [BACKEND=$(BACKEND)]"
	@echo "make smoke       seconds: imports, a tiny scenario in every mode, one fault named"
	@echo "make test        CPU test suite (what CI runs), TEST_WORKERS=$(TEST_WORKERS) xdist workers"
	@echo "make test-gpu    tests marked gpu (needs CUDA)"
	@echo "make test-costly whole scenarios too costly for make test (CI runs them after it)"
	@echo "make bench       side-by-side latency ratios"
	@echo "make models      rebuild the embedded tiny pair under parity/assets/"
	@echo "make fuzz        fuzz every input kind for FUZZ_SECONDS=$(FUZZ_SECONDS) s; prints examples and failures"
	@echo "make bugs [BACKEND=emulated|cuda] [BUGS='id ...']  grade the bisector on the second bug corpus (docs/bugs.md)"

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv --system-site-packages $(VENV)
	@# NOTE: when $(PYTHON) is itself a venv (as on GPU images), --system-site-packages
	@# only reaches the base interpreter; a .pth makes the parent's packages visible too.
	@$(PYTHON) -c "import site; print('\n'.join(site.getsitepackages()))" \
		> "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/_parent_site.pth"
	@$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "torch==$(TORCH_CPU_VERSION)"
	@$(PY) -m pip install -q --no-build-isolation -e ".[dev]"
	@touch $(STAMP)

parity: $(STAMP)
	$(PY) -m parity run --model $(MODEL) $(if $(SCENARIO),--scenario $(SCENARIO),) --modes $(MODES) --backend $(BACKEND) $(if $(OUT),--out $(OUT),)

smoke: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider tests/test_smoke.py

# Two xdist workers keep both cores of the CI machine busy; tests sharing an expensive module fixture carry
# an xdist_group mark and stay in one worker. Each test has a budget (tests/budget.py); the 15 slowest print.
TEST_WORKERS ?= 2
test: $(STAMP)
	$(PY) -m pytest -m "not gpu and not costly" tests -n $(TEST_WORKERS) --dist loadgroup --durations=15

# Whole scenarios make test's 10 minutes cannot hold (pyproject's `costly` marker): every bug corpus grade, the
# mutation matrix under the numerics seam, the tree, hybrid and overlap faults through parity run, concurrent runs
# against sequential ones bit for bit, nano-vllm under the audit. CI runs them after make test (.ci/run).
test-costly: $(STAMP)
	PARITY_TEST_BUDGET_S=300 $(PY) -m pytest -m "costly and not gpu" tests -n $(TEST_WORKERS) --dist loadgroup --durations=15

# With pytest-xdist the GPU tests spread over GPU_WORKERS processes sharing the one GPU (tests that share
# an expensive fixture stay together: --dist loadgroup).
GPU_WORKERS ?= 8
test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu tests $(shell $(PY) -c "import xdist" 2>/dev/null && printf -- '-n %s --dist loadgroup' $(GPU_WORKERS))

# Random hostile inputs (files, options, environments, signals; tests/fuzzcases.py, tests/fuzzenv.py) for a bounded
# time (the suite's per-test budget grows with it);
# CI runs the same bodies with a few derandomized examples (tests/test_fuzz_inputs.py).
fuzz: $(STAMP)
	PARITY_FUZZ_PROFILE=soak FUZZ_SECONDS=$(FUZZ_SECONDS) PARITY_TEST_BUDGET_S=$$(( $(FUZZ_SECONDS) * 2 + 120 )) \
		$(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz_soak.py

bench: $(STAMP)
	$(PY) -m parity bench

# The second bug corpus (docs/bugs.md): each patch under tests/bugs/corpus/ applied to a copy of
# this tree and run through `parity run`; BACKEND=auto (the default) grades on the emulated backend.
BUGS ?=
BUGS_BACKEND = $(if $(filter auto,$(BACKEND)),emulated,$(BACKEND))
bugs: $(STAMP)
	$(PY) -m tests.bugs.grade --backend $(BUGS_BACKEND) $(if $(BUGS),--only $(BUGS),)

models: $(STAMP)
	$(PY) -m parity models build

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis

gate: $(STAMP)
	$(PY) -m parity gate --scenario $(GATE_SCENARIO) --model $(MODEL) --baseline scenarios/baselines/$(basename $(notdir $(GATE_SCENARIO))).json --junit reports/gate-junit.xml --markdown reports/gate.md
