# make run: the default job (small ResNet on digits); make test: trainrun's suite (the benches'
# own checks, tests/test_bench.py, are make test-bench; CI runs both).
# Both install what they need into .venv first (scripts/setup_env.sh, skipped once done).
VENV := .venv
STAMP := $(VENV)/.trainrun-installed

.PHONY: run test test-slow test-bench test-nodes test-floor lint bench mutation install clean

run: $(STAMP)
	$(VENV)/bin/trainrun

# two workers, one per core (docs/testing.md); the 15 slowest tests and the machine's kind printed at the
# end. make test: every test but the end-to-end runs marked slow, which make test-slow runs (CI runs both)
BENCH_TESTS := tests/test_bench.py
NODE_TESTS := tests/test_multinode.py tests/test_slurm_nodes.py
SUITE := -q -n 2 --durations=15 --ignore=$(BENCH_TESTS) $(addprefix --ignore=,$(NODE_TESTS))
test: $(STAMP)
	$(VENV)/bin/python -m pytest $(SUITE) -m "not slow"

test-slow: $(STAMP)
	$(VENV)/bin/python -m pytest $(SUITE) -m slow

# each bench script run tiny on this CPU (its harness, its peers' launches), apart from the suite's budget
test-bench: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --durations=10 $(BENCH_TESTS)

# several hosts as network namespaces of this machine (root), one test at a time: 2 nodes x 2 ranks,
# HSDP, a node killed and a node cut off (tests/test_multinode.py; skipped, saying why, without root)
test-nodes: $(STAMP)
	$(VENV)/bin/python -m pytest -q -p no:xdist --durations=10 $(NODE_TESTS)

# the tests of what older torch broke before (ranks, sharding, checkpoints, compile; grouped products'
# autocast rule and fake kernel) under the oldest torch setup.cfg allows, in .venv-floor
# (scripts/setup_floor_env.sh); .ci/run runs it after test
FLOOR := .venv-floor
FLOOR_STAMP := $(FLOOR)/.trainrun-installed
FLOOR_TESTS := tests/test_sharded.py tests/test_sharded_optim.py tests/test_distributed_step.py tests/test_checkpoint.py
FLOOR_TESTS += tests/test_elastic.py tests/test_launcher.py tests/test_gpu_paths.py
FLOOR_TESTS += tests/test_bench.py::test_compile_trains_like_eager tests/test_compiled.py
FLOOR_TESTS += tests/test_estimate.py::test_grouped_query_attention_counts_its_flops_at_the_querys_heads
FLOOR_TESTS += tests/test_brought_models.py::test_a_mixture_of_experts_runs_its_experts_in_the_runs_precision
FLOOR_TESTS += tests/test_estimate.py::test_a_mixture_of_experts_is_estimated_with_its_experts_products
test-floor: $(STAMP) $(FLOOR_STAMP)
	$(FLOOR)/bin/python -c "import torch; print('floor: torch', torch.__version__)"
	$(FLOOR)/bin/python -m pytest -q -n 2 $(FLOOR_TESTS)

lint: $(STAMP)
	$(VENV)/bin/ruff check trainrun tests bench scripts
	$(VENV)/bin/ruff format --check trainrun tests bench scripts

bench: $(STAMP)
	$(VENV)/bin/python bench/overhead.py
	$(VENV)/bin/python bench/overhead.py --task masked_lm
	$(VENV)/bin/python bench/loaders.py
	$(VENV)/bin/python bench/algorithms.py
	$(VENV)/bin/python bench/bert.py
	$(VENV)/bin/python bench/text_loader.py
	$(VENV)/bin/python bench/overhead.py --mlflow
	$(VENV)/bin/python bench/resume.py

# Mutation testing (docs/testing.md): not part of make test. One thread per mutant process and
# torch.compile's inductor compiling in-process: torch's thread pool and inductor's compile workers
# do not survive mutmut's fork (the mutant would hang until its timeout).
mutation: $(STAMP)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check "mutmut>=3.8,<4"
	OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCHINDUCTOR_COMPILE_THREADS=1 $(VENV)/bin/mutmut run --max-children 2
	$(VENV)/bin/python scripts/mutation_report.py > mutation-report.md
	cat mutation-report.md

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml scripts/setup_env.sh
	bash scripts/setup_env.sh
	touch $@

$(FLOOR_STAMP): $(STAMP) scripts/setup_floor_env.sh
	bash scripts/setup_floor_env.sh
	touch $@

clean:
	rm -rf $(VENV) $(FLOOR) build *.egg-info runs
