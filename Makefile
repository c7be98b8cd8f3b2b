# make run: the default job (small ResNet on digits); make test: the whole suite.
# Both install what they need into .venv first (scripts/setup_env.sh, skipped once done).
VENV := .venv
STAMP := $(VENV)/.trainrun-installed

.PHONY: run test lint bench install clean

run: $(STAMP)
	$(VENV)/bin/trainrun

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

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

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml scripts/setup_env.sh
	bash scripts/setup_env.sh
	touch $@

clean:
	rm -rf $(VENV) build *.egg-info runs
