# The two set-up commands (README): `make report` builds the book from committed results,
# `make test` runs the tests. Both create their environments on first use. `make lint` runs ruff and
# mypy (pinned in envs/lint.txt, installed into .venvs/pylate).
PYLATE := .venvs/pylate/bin/python
COLPALI := .venvs/colpali/bin/python
PYLATE15 := .venvs/pylate-1.5/bin/python
COLPALI316 := .venvs/colpali-0.3.16/bin/python
TORCH ?= cpu

.PHONY: report test lint envs clean-book

envs: .venvs/pylate/.ready .venvs/colpali/.ready .venvs/pylate-1.5/.ready .venvs/colpali-0.3.16/.ready

.venvs/%/.ready: envs/%/requirements.in envs/%/constraints.txt envs/common.in envs/report.in pyproject.toml
	python3 tools/envs.py create $* --torch $(TORCH)
	touch $@

# Each test runs in one environment: the generic ones (no stack library needed) and the `pylate`
# ones in pylate, the `colpali` ones in colpali; the older releases' environments run only the
# `release` tests, whose outcome depends on the library release installed (pyproject.toml).
test: envs
	$(PYLATE) -m pytest -m "not colpali and not gpu" --durations=20
	$(COLPALI) -m pytest -m "colpali and not gpu"
	$(PYLATE15) -m pytest -m "pylate and release and not gpu"
	$(COLPALI316) -m pytest -m "colpali and release and not gpu"

# No `ruff format --check`: harness/ keeps hand-wrapped calls (closing brackets on the last line)
# that ruff's formatter would rewrap. The lint tools take the pylate lock as constraints: they never
# move its pins.
lint: .venvs/pylate/.ready
	$(PYLATE) -m pip install --quiet --disable-pip-version-check -c envs/pylate/constraints.txt -r envs/lint.txt
	$(PYLATE) -m ruff check harness tools tests
	$(PYLATE) -m mypy harness tools
	.venvs/pylate/bin/check-jsonschema --builtin-schema vendor.github-workflows .github/workflows/*.yml

# The book is book/ (book/_config.yml, book/_toc.yml): `jupyter-book build book` is the whole build.
# Here it builds into .cache/book-build/ (ignored by git, kept between builds) and copies the HTML
# to _build/html only once it built, so a failed build leaves the last good book in place. First,
# every results file the report skips is printed with its reason. Every page is executed again
# when the pages' inputs (results, book/data, grids, harness: `python -m harness.report.data
# --digest`) changed since the last good build; otherwise Sphinx rebuilds only the pages whose
# source changed. A page that raised is named, with its traceback.
BOOK_BUILD := .cache/book-build

report: .venvs/pylate/.ready
	$(PYLATE) -m harness.report.data --check
	@digest=$$($(PYLATE) -m harness.report.data --digest); \
	if [ "$$digest" = "$$(cat $(BOOK_BUILD)/inputs.sha256 2>/dev/null)" ]; then \
		echo "make report: results and report code unchanged since the last build: pages whose source changed only"; \
		all=; \
	else \
		rm -rf $(BOOK_BUILD); all=--all; \
	fi; \
	rm -f $(BOOK_BUILD)/inputs.sha256; \
	if ! .venvs/pylate/bin/jupyter-book build $$all -W --keep-going --path-output $(BOOK_BUILD) book; then \
		echo "make report: the book did not build; _build still holds the last good book." >&2; \
		reports=$(BOOK_BUILD)/_build/html/reports; \
		for log in $$(find $$reports -name '*.err.log' 2>/dev/null | sort); do \
			page=$${log#$$reports/}; \
			echo "make report: page $${page%.err.log} raised ($$log):" >&2; \
			cat "$$log" >&2; \
		done; \
		exit 1; \
	fi; \
	echo "$$digest" > $(BOOK_BUILD)/inputs.sha256
	rm -rf _build.new
	mkdir -p _build.new
	cp -a $(BOOK_BUILD)/_build/html _build.new/html
	rm -rf _build
	mv _build.new _build

clean-book:
	rm -rf _build
