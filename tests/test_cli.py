"""The command line: one-line errors with exit status 2; JSON alone on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from structspec.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_works_for_every_command():
    for argv in (["--help"], ["generate", "--help"]):
        result = subprocess.run([sys.executable, "-m", "structspec", *argv],
                                capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert result.returncode == 0
        assert "usage:" in result.stdout


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--schema", "{not json", "--prompt", "x"], "not valid JSON"),
        (["--schema", "missing-file.json", "--prompt", "x"], "no such file"),
        (["--schema", '{"type": "strin"}', "--prompt", "x"], "/type"),
        (["--schema", '{"type": "string"}', "--prompt", "  "], "--prompt"),
        (["--schema", '{"type": "string"}', "--prompt", "x", "--max-new-tokens", "-3"],
         "--max-new-tokens"),
        (["--schema", '{"type": "string"}', "--prompt", "x", "--temperature", "-1"],
         "--temperature"),
        (["--schema", '{"type": "string"}', "--prompt", "x", "--model", "./no/such/model"],
         "does not exist"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(capsys, argv, needle):
    code, out, err = _run(capsys, "generate", *argv)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("structspec: error:")
    assert needle in err


def test_unsupported_keyword_names_keyword_and_pointer(capsys):
    schema = '{"type":"object","properties":{"n":{"type":"number","multipleOf":0.0000123457}}}'
    code, _, err = _run(capsys, "generate", "--schema", schema, "--prompt", "x")
    assert code == 2
    assert "multipleOf" in err and "/properties/n" in err


@pytest.mark.real_model
def test_generate_prints_json_alone_on_stdout(capsys, smollm_tokenizer):
    schema_path = ROOT / "schemas" / "function_call.json"
    code, out, err = _run(capsys, "generate", "--schema", str(schema_path),
                          "--prompt", "What is the weather in Paris, in celsius?",
                          "--max-new-tokens", "80")
    assert code == 0, err
    value = json.loads(out)
    jsonschema.validate(value, json.loads(schema_path.read_text()))
    assert "tokens/s" in err and "forward passes" in err


@pytest.mark.parametrize(
    ("config", "needle"),
    [("speculative_decoding: [1, 2]\n", "must be a mapping"),
     ("speculative_decoding:\n  draft_lenght: 3\n", "unknown key"),
     ("speculative_decoding:\n  validation_threshold: 2\n", "validation_threshold"),
     ("speculative_decoding: {\n", "not valid YAML")],
)
def test_bad_speculation_config_is_exit_2(capsys, tmp_path, config, needle):
    path = tmp_path / "spec.yaml"
    path.write_text(config)
    code, _, err = _run(capsys, "generate", "--schema", '{"type":"string"}', "--prompt", "x",
                        "--config", str(path))
    assert code == 2 and needle in err
