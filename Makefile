# The two set-up commands (README): `make report` builds the book from committed results,
# `make test` runs the tests. Both create their environments on first use.
PYLATE := .venvs/pylate/bin/python
COLPALI := .venvs/colpali/bin/python
PYLATE15 := .venvs/pylate-1.5/bin/python
COLPALI316 := .venvs/colpali-0.3.16/bin/python
TORCH ?= cpu

.PHONY: report test envs clean-book

envs: .venvs/pylate/.ready .venvs/colpali/.ready .venvs/pylate-1.5/.ready .venvs/colpali-0.3.16/.ready

.venvs/%/.ready: envs/%/requirements.in envs/%/constraints.txt envs/common.in envs/report.in pyproject.toml
	python3 tools/envs.py create $* --torch $(TORCH)
	touch $@

test: envs
	$(PYLATE) -m pytest -m "not colpali and not gpu"
	$(COLPALI) -m pytest -m "not pylate and not gpu"
	$(PYLATE15) -m pytest -m "pylate and not gpu"
	$(COLPALI316) -m pytest -m "colpali and not gpu"

report: .venvs/pylate/.ready
	rm -rf _build
	.venvs/pylate/bin/jupyter-book build --all -W --keep-going .

clean-book:
	rm -rf _build
