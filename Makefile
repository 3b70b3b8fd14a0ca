# Two entry points, each self-sufficient on a fresh machine with only Python:
#   make demo   creates .venv, installs pl-privfed[dev] (with pytest, ruff and lightning, for
#               `from pl_privfed.lightning import ...`), runs `pl-privfed demo` (a useful private
#               run on the embedded digits, its non-private twin and a second algorithm at the same ε)
#   make test   creates .venv, installs pl-privfed[dev], runs ruff (lint + format) and pytest,
#               the whole suite spread over the machine's cores (pytest-xdist, a worker a core and
#               one more)
#               and the 40 slowest tests listed at the end (where the CI time goes)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch/torchvision pins that install from this project's machines' local disk; override freely.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
# pytest-xdist workers for `make test`: one per logical core and one more (e.g. TEST_WORKERS=0
# runs in-process). The suite's tests wait on the processes they start (start-ups, signals, a
# DDP rendezvous) part of the time, and the extra worker fills those gaps: on the project's
# 2-core CPU `.ci/run` from a fresh clone took 691 s with three workers against 779 s with two,
# measured one after the other with nothing else running (CHANGELOG.md).
TEST_WORKERS ?= $(shell $(PYTHON) -c "import os; print((os.cpu_count() or 1) + 1)")

.PHONY: demo test lint install benchmark clean frontier-mnist frontier-a9a results \
	frontier-total frontier-total-distributed benchmarks-cpu

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

install: $(BIN)/.installed

demo: $(BIN)/.installed
	$(BIN)/pl-privfed demo

lint: $(BIN)/.installed
	$(BIN)/ruff check pl_privfed tests benchmarks examples
	$(BIN)/ruff format --check pl_privfed tests benchmarks examples

test: lint
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=40

benchmark: $(BIN)/.installed
	$(BIN)/python benchmarks/round_time.py

# Every CPU benchmark docs/performance.md shows, at its documented size (21 min 21 s measured
# on the project's 2-core CPU with nothing else running; `python benchmarks/run_cpu.py --list`), each into
# docs/results/benchmarks/<name>.json, then the page's tables rendered from them; one failing
# benchmark names itself and the others still run. tests/test_benchmark_pages.py fails when the
# page differs from the artefacts.
benchmarks-cpu: $(BIN)/.installed
	$(BIN)/python benchmarks/run_cpu.py

# The results pages, docs/results/ (and docs/privacy.md's frontier block), regenerated from the
# kept artefacts (the frontier runs kept in docs/frontier_runs/); tests/test_frontier.py fails
# when a kept page differs from what this draws.
results: $(BIN)/.installed
	$(BIN)/python benchmarks/results_pages.py

# The privacy–utility frontier on MNIST (test accuracy against certified ε, one curve per
# algorithm): every private config of configs/private/ at ε ∈ {0.5, 1, 2, 4, 8} × 3 step sizes
# (5 for distributed DP-SGD and DP-α-NormEC without server normalization, 6 for DP-Clip21, whose
# selections sat on the grid's edge) (× 3 values (5 for DP-Fed-α-NormEC's β, 4 for DP-Clip21's τ) of the family's own knob where its paper tunes one: β or τ of the four paper-002/004
# error-compensation families, DP-FedAvg's clipping threshold) × 3 seeds
# (configs/sweeps/frontier_<config>.yaml) and its non-private twin
# (frontier_<config>_nonprivate.yaml), 1,980 runs (the CNN's 100 rounds, the others' 300): 2 h 18 min
# in one sitting on the project's 2-core CPU from a fresh clone, install included (load 2.0-2.5 for
# nine tenths of it; benchmarks/frontier_time.py, docs/performance.md); 69 % of its process time the
# four 10,000-client families, whose clients run in the span of
# their data (client_span; docs/performance.md), batched (`--batch`: the points of a sweep that differ only in ε, the step size, the knob
# and the seed train as one federation, each point's results as its separate run's; resumable:
# run it again to go on). The configuration is selected on validation accuracy at
# each ε; the tables give the certified ε and the ε with selection (docs/privacy.md). A failed
# run does not stop it; `compare --frontier` names and skips it. MNIST is read from $PL_PRIVFED_DATA (../shared/data on this project's machines).
FRONTIER_CLIENT := mnist_dp_fedavg_clip mnist_dp_fedavg_adaptive_clip mnist_dp_fedavg_bandmf mnist_dp_fedadam mnist_cnn_dp_fedavg mnist_dp_fedavg_per_update mnist_dpsgd \
	mnist_dp_fed_alpha_normec mnist_dp_alpha_normec mnist_dp_alpha_normec_no_sn mnist_dp_clip21 \
	mnist_dpsgd_distributed
FRONTIER_RECORD := mnist_dp_fedavg_per_sample mnist_porter_dp mnist_soteriafl
frontier_results = $(foreach c,$(1),sweeps/frontier/frontier_$(c)/results.csv \
	sweeps/frontier/frontier_$(c)_nonprivate/results.csv)

frontier-mnist: $(BIN)/.installed
	@$(MAKE) --no-print-directory -j$(FRONTIER_JOBS) $(addprefix sweep-,$(FRONTIER_ORDER))
	$(BIN)/pl-privfed compare --frontier $(call frontier_results,$(FRONTIER_CLIENT)) \
	  --out report/frontier_mnist_client
	$(BIN)/pl-privfed compare --frontier $(call frontier_results,$(FRONTIER_RECORD)) \
	  --out report/frontier_mnist_record

# The sweep files, longest first (the 10,000-client families' groups take about 70 % of the
# time), so that FRONTIER_JOBS processes finish together.
FRONTIER_ORDER := $(foreach c,mnist_dp_clip21 mnist_dp_alpha_normec_no_sn mnist_dp_alpha_normec \
	mnist_dpsgd_distributed,frontier_$(c) frontier_$(c)_nonprivate) \
	$(foreach c,$(filter-out mnist_dp_clip21 mnist_dp_alpha_normec_no_sn mnist_dp_alpha_normec \
	mnist_dpsgd_distributed,$(FRONTIER_CLIENT) $(FRONTIER_RECORD)),frontier_$(c) frontier_$(c)_nonprivate)

# One sweep file (configs/sweeps/<name>.yaml) run batched into sweeps/total/<name> (total_*) or
# sweeps/frontier/<name>, its progress written to <that folder>.log. The frontier targets run
# FRONTIER_JOBS of them at a time (default: one per logical core), each process with
# cores / FRONTIER_JOBS torch threads: two one-thread processes do about 1.5 times the work of one
# two-thread process on the project's 2-core CPU. A failed sweep does not stop the others.
FRONTIER_JOBS ?= $(shell nproc 2>/dev/null || echo 1)
FRONTIER_THREADS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); t=$$((n / $(FRONTIER_JOBS))); \
	echo $$((t > 0 ? t : 1)))
sweep_out = sweeps/$(if $(filter total_%,$(1)),total,frontier)/$(1)
sweep-%: $(BIN)/.installed
	@mkdir -p $(dir $(call sweep_out,$*))
	@echo "$$(date +%T) $*: started ($(FRONTIER_THREADS) torch thread(s); log: $(call sweep_out,$*).log)"
	@OMP_NUM_THREADS=$(FRONTIER_THREADS) $(BIN)/pl-privfed sweep configs/sweeps/$*.yaml \
	  --out $(call sweep_out,$*) --batch >> $(call sweep_out,$*).log 2>&1 \
	  && echo "$$(date +%T) $*: finished" \
	  || echo "$$(date +%T) $*: some runs failed or it stopped (see $(call sweep_out,$*).log, results.csv)"

# SoteriaFL where record-level DP and utility coexist (a9a, 1,000 clients, one record each a
# round; on MNIST it stays at chance, docs/privacy.md): 45 runs of 1,000 rounds and 9 twins.
FRONTIER_A9A := a9a_soteriafl

frontier-a9a: $(BIN)/.installed
	@$(MAKE) --no-print-directory -j$(FRONTIER_JOBS) sweep-frontier_a9a_soteriafl \
	  sweep-frontier_a9a_soteriafl_nonprivate
	$(BIN)/pl-privfed compare --frontier $(call frontier_results,$(FRONTIER_A9A)) \
	  --out report/frontier_a9a_record

clean:
	rm -rf $(VENV) logs lightning_logs wandb .pytest_cache .ruff_cache

# The frontier at equal total ε (tuning included): each family's configs/sweeps/total_<config>.yaml,
# every run calibrated (calibration: random_search) so that a random search over the family's grid
# costs the total ε; kept in docs/frontier_runs/ and drawn by `make results`
# (docs/results/frontier_total/, docs/privacy.md's leading table). The 1,000-client central
# families (`frontier-total`) ran family by family on the project's 2-core CPU, 5-25 min each
# under other jobs' load (2-9), not in one sitting; of the 10,000-client ones
# (`frontier-total-distributed`) distributed DP-SGD's 60 runs took 82 min wall, 740 s of CPU,
# batched under other jobs' load (2-14); DP-α-NormEC's 108 in 68 min (load 2-8), without server
# normalization 180 in 37 min (one torch thread, beside the test suite); DP-Clip21's 288 in 81 min (one
# torch thread, beside the a9a frontier and other jobs, load 2-5).
TOTAL_CENTRAL := mnist_dp_fedavg_clip mnist_dp_fedavg_adaptive_clip mnist_dp_fedavg_bandmf \
	mnist_dp_fedadam mnist_cnn_dp_fedavg mnist_dp_fedavg_per_update mnist_dpsgd mnist_dp_fed_alpha_normec
TOTAL_DISTRIBUTED := mnist_dpsgd_distributed mnist_dp_alpha_normec mnist_dp_alpha_normec_no_sn mnist_dp_clip21
frontier-total frontier-total-distributed: $(BIN)/.installed
	@$(MAKE) --no-print-directory -j$(FRONTIER_JOBS) \
	  $(addprefix sweep-total_,$(if $(filter frontier-total,$@),$(TOTAL_CENTRAL),$(TOTAL_DISTRIBUTED)))
	$(BIN)/pl-privfed compare --total-epsilon $$(ls sweeps/total/total_*/results.csv) \
	  --keep-runs docs/frontier_runs --out report/frontier_total
	$(BIN)/python benchmarks/results_pages.py
