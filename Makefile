# The two commands of the README: `make demo` and `make test`.
VENV ?= .venv
PROMPT ?= Extract the person: Maria Lopez is 34, lives in Madrid, email maria.lopez@example.com, and enjoys chess and hiking.
SCHEMA ?= schemas/person.json

.PHONY: setup demo test lint bench native

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/structspec generate --schema $(SCHEMA) --prompt "$(PROMPT)"

lint: setup
	$(VENV)/bin/ruff check structspec tests benchmarks examples

test: setup lint
	$(VENV)/bin/python -m pytest -q

bench: setup
	$(VENV)/bin/python benchmarks/overhead.py

# Rebuild the native kernels in place after editing structspec/_native/*.c.
native:
	$(VENV)/bin/python setup.py -q build_ext --inplace
