# The two commands of the README: `make demo` and `make test`.
VENV ?= .venv
PROMPT ?= Extract the person: Maria Lopez is 34, lives in Madrid, email maria.lopez@example.com, and enjoys chess and hiking.
SCHEMA ?= schemas/person.json

.PHONY: setup demo test test-floor lint bench native

setup:
	@bash scripts/setup.sh

demo: setup
	$(VENV)/bin/structspec generate --schema $(SCHEMA) --prompt "$(PROMPT)"

lint: setup
	$(VENV)/bin/ruff check structspec tests benchmarks examples scripts

test: setup lint
	$(VENV)/bin/python -m pytest -q

# The oldest transformers pyproject.toml allows, on the tests that call models directly
# (transformers renamed the cache keyword in 5.24: structspec.hf_compat).
FLOOR_PINS ?= transformers==5.17.0
test-floor:
	@VENV=.venv-floor PINS="$(FLOOR_PINS)" bash scripts/setup.sh
	.venv-floor/bin/python -m pytest -q tests/test_hf_compat.py tests/test_spec_architectures.py \
		tests/test_spec_tree.py tests/test_spec_prefix.py tests/test_spec_decode.py tests/test_api.py \
		tests/test_kv_cache.py tests/test_tensor_parallel.py tests/test_rope_native.py \
		tests/test_gated_mlp.py

bench: setup
	$(VENV)/bin/python benchmarks/overhead.py

# Rebuild the native kernels in place after editing structspec/_native/*.c.
native:
	$(VENV)/bin/python setup.py -q build_ext --inplace
