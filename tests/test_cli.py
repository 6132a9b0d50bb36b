"""The command line: one-line errors with exit status 2; JSON alone on stdout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from structspec.cli import main, summary_line
from structspec.engine import DecodeStats

ROOT = Path(__file__).resolve().parents[1]


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_help_works_for_every_command():
    for argv in (["--help"], ["generate", "--help"], ["batch", "--help"]):
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
     ("speculative_decoding: {\n", "not valid YAML"),
     ("speculative_decoding:\n  draft_model: 3\n", "draft_model must be"),
     ("speculative_decoding:\n  corpus: 3\n", "corpus must be"),
     ("speculative_decoding:\n  corpus: no/such/corpus.npz\n", "corpus.npz"),
     ("speculative_decoding:\n  enabled: maybe\n", "enabled must be true or false"),
     ("speculative_decoding:\n  draft_length: true\n", "draft_length must be"),
     ("speculative_decoding:\n  validation_threshold: high\n",
      "validation_threshold must be a number"),
     ("speculative_decodnig:\n  enabled: false\n", "unknown section speculative_decodnig"),
     ("- speculative_decoding\n", "must be a mapping"),
     ("speculative_decoding:\n  draft_head: no/such/head.pt\n", "draft_head: no such file")],
)
def test_bad_speculation_config_is_exit_2(capsys, tmp_path, config, needle):
    path = tmp_path / "spec.yaml"
    path.write_text(config)
    code, _, err = _run(capsys, "generate", "--schema", '{"type":"string"}', "--prompt", "x",
                        "--config", str(path))
    assert code == 2 and needle in err


# -- grammars -----------------------------------------------------------------------------------

LET = 'start: "let " NAME " = " VALUE ";"\nNAME: /[a-z]{1,2}/\nVALUE: "true" | "false" | /[0-9]/\n'


@pytest.mark.parametrize(
    ("grammar", "needle"),
    [
        ('start: "a" |\n  ) b\n', "line 2"),
        ('start: "a"\nfoo: bar\n', "bar"),
        ("start: a\na: \"x\"\na: \"y\" \"z\"\n", "grammar"),
    ],
)
def test_bad_grammar_fails_before_the_model_loads(capsys, tmp_path, grammar, needle):
    path = tmp_path / "bad.lark"
    path.write_text(grammar)
    # The model does not exist: the grammar error must come first.
    code, out, err = _run(capsys, "generate", "--grammar", str(path), "--prompt", "x",
                          "--model", "./no/such/model")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("structspec: error:")
    assert needle in err and "does not exist" not in err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--grammar", "pyhton", "--prompt", "x"], "python"),
        (["--grammar", "missing.lark", "--prompt", "x"], "not a shipped grammar"),
        (["--regex", "a", "--stop", "line", "--prompt", "x"], "--grammar"),
        (["--regex", "a", "--tolerant", "--prompt", "x"], "--grammar"),
        (["--grammar", "json"], "--prompt"),
        (["--grammar", "json", "--prefix-file", "no/such/prefix.py"], "--prefix-file"),
    ],
)
def test_bad_grammar_arguments_are_exit_2(capsys, argv, needle):
    code, out, err = _run(capsys, "generate", *argv, "--model", "./no/such/model")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and needle in err


def test_prefix_that_does_not_parse_names_line_and_column(capsys, tmp_path):
    grammar = tmp_path / "let.lark"
    grammar.write_text(LET)
    prefix = tmp_path / "prefix.txt"
    prefix.write_text("let x == ")
    code, _, err = _run(capsys, "generate", "--grammar", str(grammar), "--prefix-file",
                        str(prefix), "--model", "./no/such/model")
    assert code == 2
    assert "--prefix-file" in err and "line 1, column 8" in err


def test_grammar_is_exclusive_with_schema_and_regex(capsys):
    for other in (["--schema", '{"type":"string"}'], ["--regex", "a"]):
        with pytest.raises(SystemExit) as info:
            main(["generate", "--grammar", "json", *other, "--prompt", "x"])
        assert info.value.code == 2
        assert "not allowed with" in capsys.readouterr().err


def test_grammar_output_goes_to_stdout_exactly(capsys, tmp_path, tiny_model_dir):
    import lark

    grammar = tmp_path / "let.lark"
    grammar.write_text(LET)
    code, out, err = _run(capsys, "generate", "--grammar", str(grammar), "--prompt", "Bind.",
                          "--model", str(tiny_model_dir), "--max-new-tokens", "20", "--stats")
    assert code == 0, err
    lark.Lark(LET, parser="lalr").parse(out)  # exactly the text: no newline added
    assert "tokens/s" in err
    stats = json.loads(err.strip().splitlines()[-1])  # --stats: the last line of stderr
    assert stats["attempts"] == 1 and stats["time_split"]
    assert stats["totals"]["requests"] == stats["totals"]["decodes"] == 1
    assert stats["totals"]["new_tokens"] == stats["new_tokens"]


def test_fill_in_the_middle_from_files(capsys, tmp_path, tiny_model_dir):
    grammar = tmp_path / "let.lark"
    grammar.write_text(LET)
    (tmp_path / "pre.txt").write_text("let ")
    (tmp_path / "suf.txt").write_text(";")
    code, out, err = _run(capsys, "generate", "--grammar", str(grammar),
                          "--prefix-file", str(tmp_path / "pre.txt"),
                          "--suffix-file", str(tmp_path / "suf.txt"),
                          "--model", str(tiny_model_dir), "--max-new-tokens", "12",
                          "--no-speculative-decoding")
    if code == 1:  # the random model wrote past the point where the suffix fits: a dead
        # end the FIM view does not prune yet (see test_grammar_generate.py)
        assert "no legal token" in err
        return
    assert code == 0, err
    import lark

    lark.Lark(LET, parser="lalr").parse("let " + out + ";")


def test_tensor_parallel_outside_a_launcher_is_a_clear_error(capsys, monkeypatch):
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is already set up in this process")
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    code, out, err = _run(capsys, "generate", "--tensor-parallel", "--schema",
                          '{"type": "string"}', "--prompt", "x")
    assert code != 0 and out == ""
    assert "torchrun" in err


def test_summary_names_the_decoding_rate_and_the_overall_one_where_no_pass_followed():
    # Six tokens from the prompt's pass and the forced text after it: the decoding "rate"
    # (6 tokens in 1 ms) would read as thousands a second; the overall one is what happened.
    one = DecodeStats(prompt_tokens=48, new_tokens=6, forward_passes=1, seconds=0.45,
                      prefill_seconds=0.449)
    assert summary_line(one) == ("6 tokens in 0.45 s (13.3 tokens/s, all from the prompt's "
                                 "pass), 1 forward pass, prompt 48 tokens")
    many = DecodeStats(prompt_tokens=48, new_tokens=50, forward_passes=20, seconds=2.7,
                       prefill_seconds=0.2)
    assert summary_line(many) == ("50 tokens in 2.70 s (20.0 tokens/s after a 0.20-s prompt "
                                  "pass), 20 forward passes, prompt 48 tokens")
    # A first call: most of the time before the first token was set-up (the cost curve),
    # not the prompt's pass.
    first = DecodeStats(prompt_tokens=172, new_tokens=49, forward_passes=11, seconds=4.26,
                        prefill_seconds=3.95, setup_seconds=3.8)
    assert summary_line(first) == ("49 tokens in 4.26 s (158.1 tokens/s after a 0.15-s prompt "
                                   "pass and 3.80 s of set-up), 11 forward passes, prompt 172 "
                                   "tokens")
