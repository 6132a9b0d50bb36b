"""The ``structspec`` command.

``structspec generate --schema FILE_OR_JSON --prompt TEXT`` prints the generated JSON alone
on stdout and a one-line summary on stderr. ``--grammar NAME|FILE`` generates text that
parses under a Lark grammar (a shipped one such as ``python``, or a ``.lark`` file) and
prints it exactly as generated; ``--prefix-file``/``--suffix-file`` complete code between a
prefix and a suffix (fill-in-the-middle); ``--stop line|statement|block`` lets it end only
at a line end, at the end of the statement or of the block the cursor is in.

``structspec batch REQUESTS.jsonl`` runs many requests (``Generator.run``'s arguments by name,
one JSON object per line) in this process or on ``--replicas N`` processes, and writes a
result line per request, in order (:mod:`structspec.batch`), with a progress bar on a
terminal's stderr.

Bad input (an invalid schema or grammar, a prefix that does not parse, an unknown model, a
bad argument) prints one line ``structspec: error: ...`` and exits with status 2 — schema
and grammar errors before the model loads; a generation that could not complete exits with
status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from structspec.automata.json_schema import DEFAULT_WHITESPACE
from structspec.errors import GenerationError, StructSpecError

EXIT_BAD_INPUT = 2
EXIT_GENERATION_FAILED = 1


class _UsageError(Exception):
    """A command-line argument that cannot be used (exit status 2)."""


def _read_json(flag: str, value: str) -> Any:
    """The JSON a flag gives inline or names by file path (``--schema``, ``--defaults``)."""
    text = value.strip()
    if text[:1] in "{[" or text in ("true", "false"):
        source = flag
    else:
        path = Path(value).expanduser()
        if not path.is_file():
            raise _UsageError(f"{flag}: no such file {value!r} (pass a file or inline JSON)")
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise _UsageError(f"{flag}: cannot read {value!r}: {exc}") from exc
        source = str(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _UsageError(
            f"{source} is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})"
        ) from exc


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="structspec",
        description="Structured output from language models, valid by construction.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    gen = sub.add_parser(
        "generate",
        help="generate one output that matches a JSON Schema, a regex or a Lark grammar",
        description="Generate one output under a JSON Schema, a regex or a Lark grammar. "
        "The output goes to "
        "stdout alone; a one-line summary goes to stderr.",
    )
    what = gen.add_mutually_exclusive_group(required=True)
    what.add_argument("--schema", metavar="FILE_OR_JSON", help="JSON Schema: a file or inline JSON")
    what.add_argument("--regex", metavar="PATTERN", help="a regex the whole output must match")
    what.add_argument("--grammar", metavar="NAME_OR_FILE",
                      help="a Lark grammar the output must parse under: a shipped name "
                      "(json, python, sql, javascript) or a .lark file")
    gen.add_argument("--prompt", default=None,
                     help="the request (use - to read stdin); with --prefix-file it may be "
                     "left out: the prefix is then the raw prompt")
    code = gen.add_argument_group("code completion (with --grammar)")
    code.add_argument("--prefix-file", metavar="FILE", default=None,
                      help="code above the cursor: the output continues it")
    code.add_argument("--suffix-file", metavar="FILE", default=None,
                      help="code below the cursor: the output ends only where prefix + "
                      "output + suffix parses (fill-in-the-middle)")
    code.add_argument("--stop", choices=["eof", "line", "statement", "block"], default=None,
                      help="where the output may end: anywhere it parses (eof, default); "
                      "at the end of a line, stopping at the first one where it parses "
                      "(line); where the statement (statement) or the block (block) the "
                      "cursor is in ends")
    code.add_argument("--tolerant", action="store_true",
                      help="a prefix that does not parse falls back to lexer-only "
                      "constraints from its last line instead of failing")
    gen.add_argument("--max-new-tokens", type=int, default=512, metavar="N",
                     help="token budget of the output (default: 512)")
    gen.add_argument("--temperature", type=float, default=0.0, metavar="T",
                     help="0 = greedy (default); > 0 samples")
    gen.add_argument("--top-k", type=int, default=None, metavar="K", help="sampling: top-k")
    gen.add_argument("--top-p", type=float, default=None, metavar="P", help="sampling: top-p")
    gen.add_argument("--seed", type=int, default=None, metavar="S", help="sampling seed")
    gen.add_argument("--whitespace", choices=["spaced", "compact", "flexible"],
                     default=DEFAULT_WHITESPACE,
                     help=f"JSON whitespace policy (default: {DEFAULT_WHITESPACE}: a space after "
                          "each ',' and ':')")
    gen.add_argument("--lenient", action="store_true",
                     help="accept keywords that cannot be enforced exactly; validate afterwards")
    gen.add_argument("--schema-style", choices=["template", "json"], default="template",
                     help="how the schema is shown to the model: a typed JSON template "
                          "(default; JSON Schema where a template cannot state it) or JSON "
                          "Schema")
    gen.add_argument("--raw-prompt", action="store_true",
                     help="do not apply the chat template nor show the schema to the model")
    gen.add_argument("--stats", action="store_true", help="print full stats as JSON on stderr")
    _add_engine_options(gen, tensor_parallel=True)

    batch = sub.add_parser(
        "batch",
        help="generate the outputs of many requests (JSON Lines in, JSON Lines out), on "
             "one or several model replicas",
        description="Generate the output of every request of a JSON Lines file: one object "
        "per line with the arguments of Generator.run by name (prompt, schema, regex, "
        "grammar, max_new_tokens, temperature, seed, ...) and an optional id. One result "
        "line per request goes to stdout (or --output), in order; a failed request gets an "
        "error line and the batch goes on. A summary goes to stderr.",
    )
    batch.add_argument("requests", metavar="REQUESTS.jsonl",
                       help="the requests, one JSON object per line (- reads stdin)")
    batch.add_argument("--output", metavar="FILE", default=None,
                       help="write the result lines here (default: stdout)")
    batch.add_argument("--defaults", metavar="FILE_OR_JSON", default=None,
                       help="a JSON object of arguments every request takes unless it sets "
                            "them (a file or inline JSON), e.g. one schema for all the lines: "
                            "'{\"schema\": {...}, \"max_new_tokens\": 128}'")
    batch.add_argument("--replicas", default="1", metavar="N",
                       help="processes decoding side by side, each with its own copy of the "
                            "model (default 1: this process); 'auto': one per GPU with "
                            "--device cuda, else one per core up to four")
    batch.add_argument("--threads", type=int, default=None, metavar="N",
                       help="torch threads of each replica (default: the cores shared out)")
    batch.add_argument("--stats", action="store_true",
                       help="print the batch's summed stats as JSON on stderr at the end")
    batch.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                       help="a progress bar on stderr: requests done, failed, tokens/s, "
                            "time left (default: when stderr is a terminal)")
    _add_engine_options(batch, tensor_parallel=False)
    return parser


def _add_engine_options(parser: argparse.ArgumentParser, *, tensor_parallel: bool) -> None:
    """The model and speculative-decoding options that ``generate`` and ``batch`` share."""
    parser.add_argument("--model", default=None,
                        help="HF model id, local directory or .gguf file (default: embedded "
                        "SmolLM2-135M-Instruct)")
    parser.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    spec = parser.add_argument_group("speculative decoding (lossless unless a threshold is set)")
    spec.add_argument("--config", metavar="FILE", default=None,
                      help="YAML file with a `speculative_decoding:` section")
    spec.add_argument("--speculative-decoding", dest="speculative", action="store_true",
                      default=None, help="draft trees verified in one pass (default: on)")
    spec.add_argument("--no-speculative-decoding", dest="speculative", action="store_false",
                      help="one token per forward pass")
    spec.add_argument("--num-candidates", type=int, default=None, metavar="N",
                      help="most branches opened per step (default 8)")
    spec.add_argument("--draft-length", type=int, default=None, metavar="N",
                      help="deepest drafted path (default 32)")
    spec.add_argument("--validation-threshold", type=float, default=None, metavar="E",
                      help="opt-in LOSSY typical acceptance with threshold E in (0, 1)")
    spec.add_argument("--draft-model", metavar="ID", default=None,
                      help="a small model with the same tokenizer to draft with (HF id, "
                      "local directory or .gguf file)")
    spec.add_argument("--no-pack", action="store_true",
                      help="keep the model's plain linear layers and attention (no packed "
                           "kernels, no grouped tree attention)")
    if tensor_parallel:
        spec.add_argument("--tensor-parallel", action="store_true",
                          help="split the model over the processes of a torchrun group "
                               "(torchrun --nproc-per-node N -m structspec generate ...): "
                               "rank 0 decodes and prints, the others run its passes")
    spec.add_argument("--no-int8-activations", action="store_true",
                      help="run exactly Q4_1-quantized layers with float32 activations "
                           "(default: 8-bit activations, as llama.cpp does; faster)")


_SPEC_KEYS = {"enabled": "enabled", "draft_length": "draft_length",
              "num_speculations": "num_speculations", "max_nodes": "max_nodes",
              "validation_threshold": "validation_threshold",
              "draft_head": "draft_head",  # false, "auto" or a head file
              "corpus": "corpus"}  # a corpus file (TokenCorpus.save)


def _spec_config(args: argparse.Namespace) -> tuple[Any, int | None]:
    """The :class:`SpecConfig` from ``--config`` and the flags (flags win), and the
    ``max_retries`` of the file if it sets one."""
    from structspec.spec import SpecConfig

    values: dict[str, Any] = {}
    retries = None
    if args.config is not None:
        import yaml

        try:
            data = yaml.safe_load(Path(args.config).expanduser().read_text(encoding="utf-8"))
        except OSError as exc:
            raise _UsageError(f"--config: cannot read {args.config!r}: {exc}") from exc
        except yaml.YAMLError as exc:
            raise _UsageError(f"--config: {args.config!r} is not valid YAML: {exc}") from exc
        if data is not None and not isinstance(data, dict):
            raise _UsageError(f"--config: {args.config!r} must be a mapping with a "
                              f"`speculative_decoding` section, not a {type(data).__name__}")
        unknown = sorted(str(k) for k in (data or {}) if k != "speculative_decoding")
        if unknown:  # a misspelt section would otherwise be ignored without a word
            raise _UsageError(f"--config: unknown section {', '.join(unknown)} (known: "
                              f"speculative_decoding)")
        section = (data or {}).get("speculative_decoding", {})
        if not isinstance(section, dict):
            raise _UsageError("--config: `speculative_decoding` must be a mapping")
        for key, value in section.items():
            if key == "max_retries":
                retries = value
            elif key == "draft_model":  # loaded by the Generator; --draft-model wins
                if not isinstance(value, str) or not value:
                    raise _UsageError("--config: speculative_decoding.draft_model must be a "
                                      "model id or directory")
                if args.draft_model is None:
                    args.draft_model = value
            elif key in _SPEC_KEYS:
                values[_SPEC_KEYS[key]] = value
            else:
                known = ", ".join([*_SPEC_KEYS, "max_retries", "draft_model"])
                raise _UsageError(f"--config: unknown key speculative_decoding.{key} "
                                  f"(known: {known})")
    for flag, key in (("speculative", "enabled"), ("num_candidates", "num_speculations"),
                      ("draft_length", "draft_length"),
                      ("validation_threshold", "validation_threshold")):
        if getattr(args, flag) is not None:
            values[key] = getattr(args, flag)
    if isinstance(values.get("corpus"), str):
        values["corpus"] = str(Path(values["corpus"]).expanduser())
    try:  # (a corpus file is read here, before the model loads)
        return SpecConfig(**values), retries
    except (TypeError, ValueError, OSError) as exc:
        raise _UsageError(f"speculative decoding settings: {exc}") from exc


def _read_text(flag: str, value: str | None) -> str | None:
    """The text of the file a flag names (``None`` when the flag is absent)."""
    if value is None:
        return None
    try:
        return Path(value).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise _UsageError(f"{flag}: cannot read {value!r}: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise _UsageError(f"{flag}: {value!r} is not UTF-8 text") from exc


def _check_grammar(args: argparse.Namespace, prefix: str | None, suffix: str | None) -> Any:
    """Load the grammar and parse the prefix before the model loads (no vocabulary needed:
    a byte-level one). Returns what ``Generator.run(grammar=...)`` takes. The loaded grammar
    goes to the disk compile cache, so compiling it again for the model's vocabulary is
    cheap."""
    from structspec.api import resolve_grammar
    from structspec.automata.cache import disk_cache
    from structspec.automata.lark_compile import compile_grammar
    from structspec.vocab import Vocabulary

    grammar = resolve_grammar(args.grammar)
    byte_vocab = Vocabulary.from_tokens([b"", *(bytes([b]) for b in range(256))],
                                        eos_token_ids=[0])
    constraint = compile_grammar(grammar, byte_vocab)
    if prefix is not None:
        try:
            constraint.state_after(prefix, tolerant=args.tolerant)
        except StructSpecError as exc:
            raise _UsageError(f"--prefix-file {args.prefix_file}: {exc}") from exc
    if args.stop in ("statement", "block"):  # the grammar must have the rules for it
        try:
            constraint.with_suffix(suffix or "", stop=args.stop)
        except StructSpecError as exc:
            raise _UsageError(f"--stop {args.stop}: {exc}") from exc
    disk = disk_cache()
    if disk is not None:
        disk.flush()
    return grammar


def summary_line(s: Any) -> str:
    """The stderr summary of one request's stats: tokens, time, rate, passes, prompt size.
    The rate is the decoding rate after the prompt's pass, so named, and the set-up before
    that pass is named apart where it counts (a process's first request loads the draft head
    and probes the model; a machine's first measures the device's cost curve: seconds, which
    the prompt's pass was credited with before); where no pass followed
    the prompt's (a short or mostly forced output), the overall rate instead — the decoding
    rate of a few forced tokens committed in a millisecond would read as thousands a
    second."""
    if s.forward_passes > 1:
        prompt_pass = max(0.0, s.prefill_seconds - s.setup_seconds)
        rate = f"{s.tokens_per_second:.1f} tokens/s after a {prompt_pass:.2f}-s prompt pass"
        if s.setup_seconds >= 0.05:  # the first call of a process (or machine) pays it
            rate += f" and {s.setup_seconds:.2f} s of set-up"
    else:
        overall = s.new_tokens / s.seconds if s.seconds > 0 else 0.0
        rate = f"{overall:.1f} tokens/s, all from the prompt's pass"
    passes = "forward pass" if s.forward_passes == 1 else "forward passes"
    return (f"{s.new_tokens} tokens in {s.seconds:.2f} s ({rate}), {s.forward_passes} "
            f"{passes}, prompt {s.prompt_tokens} tokens")


def _generate(args: argparse.Namespace) -> int:
    prefix = _read_text("--prefix-file", args.prefix_file)
    suffix = _read_text("--suffix-file", args.suffix_file)
    if args.grammar is None:
        used = [f for f, v in (("--prefix-file", prefix), ("--suffix-file", suffix),
                               ("--stop", args.stop)) if v is not None]
        used += ["--tolerant"] if args.tolerant else []
        if used:
            raise _UsageError(f"{', '.join(used)} need(s) --grammar")
    raw_prompt = args.raw_prompt
    if args.prompt is None:
        if prefix is None:
            raise _UsageError("--prompt is required (or --prefix-file with --grammar)")
        prompt, raw_prompt = prefix, True
    else:
        prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    if not prompt.strip():
        raise _UsageError("--prompt must not be empty")
    if args.max_new_tokens < 1:
        raise _UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.temperature < 0:
        raise _UsageError(f"--temperature must be >= 0, got {args.temperature}")
    schema = _read_json("--schema", args.schema) if args.schema is not None else None
    if schema is not None:  # fail fast, before the model loads
        from structspec.automata.json_schema import check_json_schema

        check_json_schema(schema, lenient=args.lenient)
    grammar = _check_grammar(args, prefix, suffix) if args.grammar is not None else None

    spec, retries = _spec_config(args)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _quiet_transformers()
    from structspec.api import Generator

    generator = Generator(args.model, device=args.device, speculation=spec,
                          pack=not args.no_pack, draft_model=args.draft_model,
                          int8_activations=not args.no_int8_activations,
                          tensor_parallel=args.tensor_parallel)
    if not generator.leader:  # a tensor-parallel follower: run rank 0's passes, print nothing
        generator.serve()
        return 0
    retry_kwargs: dict[str, Any] = {} if retries is None else {"max_retries": retries}
    try:
        result = generator.run(
            prompt,
            schema=schema,
            regex=args.regex,
            grammar=grammar,
            **({} if grammar is None else {"grammar_prefix": prefix, "grammar_suffix": suffix,
                                           "stop": args.stop or "eof",
                                           "tolerant": args.tolerant}),
            max_new_tokens=args.max_new_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            chat=False if raw_prompt else None,
            schema_in_prompt=False if raw_prompt else args.schema_style,
            whitespace=args.whitespace,
            lenient=args.lenient,
            **retry_kwargs,
        )
    finally:
        generator.close()  # releases a tensor-parallel group's followers (else a no-op)
    if grammar is None:
        print(result.text)
    else:  # code goes out exactly as generated (an editor inserts it as it is)
        sys.stdout.write(result.text)
        sys.stdout.flush()
    s = result.stats
    print(f"structspec: {summary_line(s)}, model {generator.loaded.name}", file=sys.stderr)
    if args.stats:
        # "totals": every attempt of the request (a lenient schema's retries included)
        print(json.dumps({"attempts": result.attempts, **s.as_dict(),
                          "totals": generator.totals.as_dict()}), file=sys.stderr)
    _flush_compile_cache()
    return 0


def _replica_count(value: str) -> int | None:
    """``--replicas``: a positive count, or ``None`` for ``auto``."""
    if value == "auto":
        return None
    try:
        count = int(value)
    except ValueError:
        count = 0
    if count < 1:
        raise _UsageError(f"--replicas must be a positive integer or 'auto', not {value!r}")
    return count


def _batch(args: argparse.Namespace) -> int:
    """``structspec batch``: every request of a JSON Lines file, in this process or on
    replicas; a result line each, in order. Exit 1 where a request failed."""
    import time

    from structspec.batch import (
        check_defaults,
        read_requests,
        record,
        run_arguments,
        run_in_process,
    )

    defaults = None
    if args.defaults is not None:
        defaults = check_defaults(_read_json("--defaults", args.defaults), "--defaults")
    source = "stdin" if args.requests == "-" else args.requests
    text = sys.stdin.read() if args.requests == "-" else _read_text("REQUESTS", args.requests)
    # the whole file is checked before the model loads
    requests = read_requests((text or "").splitlines(), source, defaults)
    replicas = _replica_count(args.replicas)
    if args.threads is not None and args.threads < 1:
        raise _UsageError(f"--threads must be >= 1, got {args.threads}")
    spec, retries = _spec_config(args)
    if retries is not None:  # the file's max_retries is each request's default
        requests = [{"max_retries": retries, **r} for r in requests]
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    _quiet_transformers()
    engine = {"device": args.device, "speculation": spec, "pack": not args.no_pack,
              "draft_model": args.draft_model,
              "int8_activations": not args.no_int8_activations}
    failed = tokens = 0
    start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        out = sys.stdout if args.output is None else stack.enter_context(
            _open_output(args.output))
        if replicas == 1:
            import torch

            from structspec.api import Generator

            if args.threads is not None:
                torch.set_num_threads(args.threads)
            generator = Generator(args.model, **engine)
            totals, where = generator.totals, "in this process"
            outcomes = run_in_process(generator, requests)
        else:
            from structspec.replicas import Replicas

            pool = stack.enter_context(Replicas(args.model, replicas=replicas,
                                                threads=args.threads, **engine))
            totals = pool.totals
            where = f"on {pool.replicas} replicas of {pool.threads} thread(s)"
            outcomes = pool.map((run_arguments(r) for r in requests), errors="return")
        loaded = time.perf_counter()  # the model(s) loaded: the batch's own time from here
        bar = _progress_bar(args.progress, len(requests), stack)
        for index, outcome in enumerate(outcomes):
            out.write(json.dumps(record(index, requests[index], outcome),
                                 ensure_ascii=False) + "\n")
            out.flush()
            if isinstance(outcome, BaseException):
                failed += 1
            else:
                tokens += outcome.stats.new_tokens
            if bar is not None:
                elapsed = time.perf_counter() - loaded
                bar.set_postfix(failed=failed, tokens_per_s=f"{tokens / elapsed:.1f}"
                                if elapsed > 0 else "-", refresh=False)
                bar.update(1)
    seconds = time.perf_counter() - loaded
    print(f"structspec: {len(requests)} requests ({failed} failed) {where}: {tokens} tokens "
          f"in {seconds:.2f} s ({tokens / seconds if seconds > 0 else 0.0:.1f} tokens/s) "
          f"after {loaded - start:.2f} s of loading", file=sys.stderr)
    if args.stats:
        print(json.dumps(totals.as_dict()), file=sys.stderr)
    _flush_compile_cache()
    return EXIT_GENERATION_FAILED if failed else 0


def _progress_bar(wanted: bool | None, total: int, stack: contextlib.ExitStack) -> Any:
    """A tqdm bar over ``total`` requests on stderr, closed with ``stack``; None where
    ``wanted`` is False, or None (the default) and stderr is not a terminal (a log file or
    a pipe gets the summary line alone)."""
    if wanted is False or (wanted is None and not sys.stderr.isatty()):
        return None
    from tqdm import tqdm

    return stack.enter_context(tqdm(total=total, unit="req", file=sys.stderr,
                                    dynamic_ncols=True, desc="structspec batch"))


def _open_output(path: str) -> Any:
    """``--output``'s file, open for writing."""
    try:
        return open(Path(path).expanduser(), "w", encoding="utf-8")
    except OSError as exc:
        raise _UsageError(f"--output: cannot write {path!r}: {exc.strerror or exc}") from exc


def _flush_compile_cache() -> None:
    """Keep the masks this call computed for the next call (the on-disk compile cache)."""
    from structspec.automata.cache import disk_cache

    disk = disk_cache()
    if disk is not None:
        disk.flush()


def _quiet_transformers() -> None:
    """Keep library progress bars and warnings off the terminal: stdout is the output. The
    environment says it too, for the replicas ``batch`` starts (they inherit it)."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - cosmetic only
        pass


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns the exit status."""
    parser = _build_parser()
    args = parser.parse_args(argv)  # argparse exits with 2 on its own usage errors
    try:
        return _batch(args) if args.command == "batch" else _generate(args)
    except (_UsageError, ValueError, StructSpecError) as exc:
        if isinstance(exc, GenerationError):
            print(f"structspec: generation failed: {exc}", file=sys.stderr)
            return EXIT_GENERATION_FAILED
        message = " ".join(str(exc).split())
        print(f"structspec: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
