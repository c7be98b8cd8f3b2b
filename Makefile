# make run: the default job (small ResNet on digits); make test: the whole suite.
# Both install what they need into .venv first (scripts/setup_env.sh, skipped once done).
VENV := .venv
STAMP := $(VENV)/.trainrun-installed

.PHONY: run test lint bench mutation install clean

run: $(STAMP)
	$(VENV)/bin/trainrun

# two workers, one per core (docs/testing.md); the 15 slowest tests printed at the end
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --durations=15

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

clean:
	rm -rf $(VENV) build *.egg-info runs
