"""The Python face of structspec: :class:`Generator`, :class:`Result` and :func:`generate`.

A :class:`Generator` owns one model (the embedded default unless told otherwise), its
vocabulary and a cache of compiled constraints. ``run`` returns the whole :class:`Result`
(value, text, token ids, stats); ``generate`` returns just the value — a dict/list for a
JSON Schema, an instance for a Pydantic model class, a string for a regex, a Lark grammar
or free text. Every JSON output is validated with ``jsonschema`` before it is returned.

Grammars (``grammar=``) are a shipped grammar's name (``"python"``, see
:func:`structspec.grammars.available`), a path to a ``.lark`` file, or Lark text. For code
completion, ``grammar_prefix`` (the code above the cursor) sets where the constraint
starts, and ``grammar_suffix`` (the code below it) makes an output final only where
prefix + output + suffix parses, at the stopping point ``stop`` (``"eof"``, ``"line"``,
``"statement"`` or ``"block"``).
"""

from __future__ import annotations

import copy
import inspect
import json
import os
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from structspec.automata.base import Constraint
from structspec.automata.json_schema import (
    DEFAULT_WHITESPACE,
    JsonSchemaConstraint,
    compile_json_schema,
)
from structspec.automata.lark_compile import STOPS, LarkConstraint, compile_grammar
from structspec.automata.regex import compile_regex
from structspec.engine import DecodeStats, decode, free_text
from structspec.errors import GenerationError, GrammarError, SchemaError
from structspec.models import LoadedModel, load_model
from structspec.sampling import SamplingParams
from structspec.schema_prompt import SCHEMA_STYLES, schema_instruction
from structspec.spec import SpecConfig, UnsupportedModelError, speculative_decode
from structspec.spec.cost import AcceptanceModel
from structspec.spec.cpu_paths import use_fast_cpu_paths
from structspec.spec.habits import fresh_acceptance
from structspec.spec.lockstep import (
    Leader,
    LockstepError,
    group_up,
    init_group,
    lead,
    leave_group,
    serve,
)
from structspec.spec.prefix import PrefixCache
from structspec.spec.shard import shard_model
from structspec.spec.totals import StatsTotals
from structspec.vocab import Vocabulary

#: Opens the system message when a schema is shown and no ``system`` is given. The schema
#: goes in the system message, before the request: on the BFCL dev set (250 calls, greedy,
#: default model) 76 calls were right this way as a template, 62 as JSON Schema, against 30
#: with the JSON Schema after the request; and requests with the same schema (a tool set)
#: share its key/values in the prefix cache.
SCHEMA_SYSTEM = "You are a precise assistant."


@dataclass(frozen=True)
class Result:
    """The outcome of one generation.

    Attributes:
        value: the parsed output: dict/list/scalar for a JSON Schema, a model instance for a
            Pydantic class, the text for a regex or free text.
        text: the generated text.
        token_ids: the generated token ids (EOS excluded).
        stats: forward passes, new tokens, seconds, ...
        attempts: how many generations it took (more than 1 only in lenient mode).
    """

    value: Any
    text: str
    token_ids: list[int]
    stats: DecodeStats = field(default_factory=DecodeStats)
    attempts: int = 1


def _pydantic_model(schema: Any) -> Any | None:
    """The Pydantic model class if ``schema`` is one, else ``None``."""
    try:
        from pydantic import BaseModel
    except ImportError:  # pragma: no cover - pydantic is a dependency
        return None
    if isinstance(schema, type) and issubclass(schema, BaseModel):
        return schema
    return None


def resolve_grammar(grammar: str | os.PathLike[str]) -> str | Path:
    """What ``grammar`` names: a shipped grammar's path, a file's path, or Lark text.

    In this order: a name in :func:`structspec.grammars.available` (``"python"``, also
    ``"python.lark"``) is the shipped file; a path-like object, or a one-line string naming an
    existing file, is that file; any other string containing ``:`` (every Lark rule has
    one) is grammar text. Pure; reads the file system only to test for a file.

    Returns:
        A :class:`~pathlib.Path` for a file, else the text itself.

    Raises:
        GrammarError: a path-like object that is not a file; a string that is none of the
            three (the message lists the shipped names).
        ValueError: ``grammar`` is not a non-empty string or path.
    """
    from structspec.grammars import available, grammar_path

    if isinstance(grammar, os.PathLike):
        path = Path(grammar).expanduser()
        if not path.is_file():
            raise GrammarError(f"no such grammar file {str(path)!r}")
        return path
    if not isinstance(grammar, str) or not grammar.strip():
        raise ValueError(f"grammar must be a non-empty string or path, not {grammar!r}")
    name = grammar.strip()
    if name.removesuffix(".lark") in available():
        return grammar_path(name)
    if "\n" not in grammar:
        path = Path(name).expanduser()
        if path.is_file():
            return path
        if ":" not in name or name.endswith(".lark"):
            known = ", ".join(available())
            raise GrammarError(f"grammar {name!r} is not a shipped grammar ({known}), an "
                               "existing file, nor Lark text")
    return grammar


class Generator:
    """Structured generation with one model.

    Args:
        model: ``None`` for the embedded default (SmolLM2-135M-Instruct), a model spec
            accepted by :func:`structspec.models.load_model` (HF id, local dir, GGUF file),
            or an already :class:`~structspec.models.LoadedModel`.
        device: torch device for a model loaded here.
        speculation: default speculative-decoding settings (``None``: :class:`SpecConfig`
            defaults, speculation on); ``run(speculative=...)`` overrides per call.
        pack: on CPU, replace the model's linear layers by packed ones
            (:mod:`structspec.spec.fastlinear`; same outputs within 1e-4) and keep its
            grouped-query attention grouped under tree masks
            (:mod:`structspec.spec.attention`): passes of a few tokens get much cheaper,
            which speculation needs.
        draft_model: a small model with the same tokenizer to draft with (a model spec, a
            :class:`~structspec.models.LoadedModel` or a
            :class:`~structspec.spec.draft_model.DraftModel`); loaded here (and packed like
            the target) and added to the default ``speculation`` config.
        int8_activations: with ``pack``, run the layers whose weights are exactly
            block-quantized with q >= 0 (GGUF Q4_1, the default model's body) with
            activations rounded to 8 bits per block of 32, as llama.cpp does (kernel
            ``"panel_int8"``): passes of many rows faster (the JSON benchmark's prompt
            prefills 0.79x the time; draft trees), outputs that differ from float32
            arithmetic by that rounding (BFCL calls right: 79/250 with it, 76/250 without).
            Speculation stays lossless with it (a row's numbers are bitwise the same in every
            pass). ``False``: float32 activations (``--no-int8-activations``).
        tensor_parallel: split the model over the ranks of a ``torch.distributed`` group
            (started by ``torchrun --nproc-per-node N``; NCCL on GPUs, gloo on CPUs): each
            rank holds a share of every layer (:mod:`structspec.spec.shard`), rank 0 decodes
            and the others run its passes (:mod:`structspec.spec.lockstep`). On rank 0
            (``leader`` True) use the Generator as usual and :meth:`close` it at the end; on
            the others call :meth:`serve`, which returns when rank 0 closes. A model passed
            in is split in place. No prefix KV cache under it.

    Thread-safety: compiled constraints are shared; concurrent ``run`` calls on one
    Generator are serialized by a lock (one model, one KV cache at a time).
    """

    def __init__(self, model: str | LoadedModel | None = None, *, device: str = "cpu",
                 speculation: SpecConfig | None = None, pack: bool = True,
                 draft_model: Any = None, int8_activations: bool = True,
                 tensor_parallel: bool = False) -> None:
        rank, world = 0, 1
        #: Whether this Generator set a process group up (and so leaves it at the end).
        self._owns_group = False
        if tensor_parallel:
            self._owns_group = not group_up()
            rank, world = init_group()
            if device == "cuda":  # one GPU per rank, as torchrun numbers them
                device = f"cuda:{os.environ.get('LOCAL_RANK', rank)}"
        self.loaded = model if isinstance(model, LoadedModel) else load_model(model, device=device)
        self.speculation = speculation if speculation is not None else SpecConfig()
        if tensor_parallel:
            shard_model(self.loaded.model, rank, world)
        #: Whether this process decodes (False: a tensor-parallel follower; see ``serve``).
        self.leader = rank == 0
        if draft_model is not None and self.leader:
            from dataclasses import replace

            from structspec.spec.draft_model import DraftModel

            draft = DraftModel.resolve(draft_model, device=device, pack=pack)
            if pack:
                use_fast_cpu_paths(draft.model, prompt_panels=False)
            self.speculation = replace(self.speculation, draft_model=draft)
        if pack:
            use_fast_cpu_paths(self.loaded.model, int8_activations=int8_activations)
        self.vocab = Vocabulary.from_tokenizer(
            self.loaded.tokenizer,
            eos_token_ids=self.loaded.eos_token_ids,
            vocab_size=int(getattr(self.loaded.model.config, "vocab_size", 0) or 0) or None,
        )
        self._lock = threading.Lock()
        self._acceptance: dict[str, AcceptanceModel] = {}
        self._acceptance_lock = threading.Lock()
        self._warned_unsupported = False
        # The chat header's KV, shared by both decode paths (not across a group's ranks).
        self._prefixes: PrefixCache | None = None if world > 1 else PrefixCache()
        self._group: Leader | None = (lead(self.loaded.model) if world > 1 and self.leader
                                      else None)
        #: Cumulative statistics over this Generator's requests (``totals.as_dict()``;
        #: ``totals.reset()`` starts again).
        self.totals = StatsTotals()

    # -- building blocks ------------------------------------------------------------------

    def compile(
        self, schema: Any, *, whitespace: str = DEFAULT_WHITESPACE, lenient: bool = False
    ) -> JsonSchemaConstraint:
        """Compile a JSON Schema (dict, bool, JSON text) or a Pydantic model class.

        Cached per schema and options. Raises :class:`SchemaError` /
        :class:`UnsupportedSchemaError` for schemas it cannot enforce.
        """
        # (a Pydantic model class is turned into its JSON Schema by compile_json_schema)
        return compile_json_schema(schema, self.vocab, whitespace=whitespace, lenient=lenient)

    def compile_grammar(self, grammar: str | os.PathLike[str] | LarkConstraint, *,
                        start: str | None = None, postlex: Any = "auto",
                        keywords: str = "reserved") -> LarkConstraint:
        """Compile a Lark grammar for this model's vocabulary.

        Args:
            grammar: a shipped grammar's name, a ``.lark`` path or Lark text (see
                :func:`resolve_grammar`), or an already compiled :class:`LarkConstraint`
                (returned as it is, after a vocabulary check).
            start, postlex, keywords: as :func:`structspec.compile_grammar`.

        Returns:
            The immutable, shared constraint (cached per grammar, options and vocabulary).

        Raises:
            GrammarError: the grammar does not load (with line/column where known).
        """
        if isinstance(grammar, LarkConstraint):
            if grammar.vocab_size != len(self.vocab):
                raise ValueError(f"the grammar constraint covers {grammar.vocab_size} tokens, "
                                 f"this model's vocabulary {len(self.vocab)}")
            return grammar
        return compile_grammar(resolve_grammar(grammar), self.vocab, start=start,
                               postlex=postlex, keywords=keywords)

    def prompt_ids(
        self,
        prompt: str,
        *,
        schema: Any = None,
        schema_style: str = "template",
        chat: bool | None = None,
        system: str | None = None,
    ) -> list[int]:
        """Tokenize ``prompt``, through the chat template when the model has one.

        Args:
            prompt: the user's request.
            schema: a JSON Schema (dict or bool) to show the model, in the system message
                (after ``system`` when one is given), before the request.
            schema_style: how to show it, one of
                :data:`~structspec.schema_prompt.SCHEMA_STYLES`.
            chat: ``None`` = use the chat template if the tokenizer has one; ``False`` = the
                raw prompt text (nothing added); ``True`` = require a template.
            system: system message for chat models (default: none, or with ``schema``
                :data:`SCHEMA_SYSTEM`).
        """
        tokenizer = self.loaded.tokenizer
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat is True and not has_template:
            raise ValueError("chat=True but the tokenizer has no chat template")
        if chat is False or not has_template:
            return list(tokenizer.encode(prompt, add_special_tokens=False))
        messages = []
        if schema is not None:
            instruction = schema_instruction(schema, schema_style)
            system = (f"{SCHEMA_SYSTEM} {instruction}" if system is None else
                      f"{system}\n\n{instruction}")
        if system is not None:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    # -- tensor parallelism ---------------------------------------------------------------

    def serve(self) -> int:
        """On a tensor-parallel follower: run rank 0's passes on this rank's shard until
        rank 0 calls :meth:`close`; returns the passes run.

        Raises:
            LockstepError: this Generator decodes itself (rank 0, or no group).
        """
        if self.leader:
            raise LockstepError("serve() is for the ranks other than 0 of a tensor-parallel "
                                "Generator; this one decodes (call run/generate)")
        passes = serve(self.loaded.model)
        if self._owns_group:
            leave_group()  # in step with rank 0's close()
        return passes

    def close(self) -> None:
        """Release a tensor-parallel group's followers (their :meth:`serve` returns) and,
        where this Generator set the process group up, leave it with them; a no-op
        elsewhere. The Generator cannot decode afterwards."""
        if self._group is not None:
            self._group.stop()
            if self._owns_group:
                self._owns_group = False
                leave_group()

    # -- generation -----------------------------------------------------------------------

    def run(
        self,
        prompt: str,
        *,
        schema: Any = None,
        regex: str | None = None,
        grammar: str | os.PathLike[str] | LarkConstraint | None = None,
        grammar_prefix: str | None = None,
        grammar_suffix: str | None = None,
        stop: str = "eof",
        tolerant: bool = False,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        chat: bool | None = None,
        system: str | None = None,
        schema_in_prompt: bool | str = True,
        whitespace: str = DEFAULT_WHITESPACE,
        lenient: bool = False,
        max_retries: int = 3,
        speculative: bool | SpecConfig | None = None,
    ) -> Result:
        """Generate one output under a JSON Schema, a Pydantic model, a regex, a Lark
        grammar, or nothing (at most one of ``schema``, ``regex``, ``grammar``).

        Args:
            prompt: the request (non-empty). For code completion, the code itself with
                ``chat=False`` (the model continues it).
            schema: a JSON Schema (dict, bool or JSON text) or a Pydantic model class.
            regex: a regular expression the whole output must match (instead of a schema).
            grammar: a Lark grammar the output must parse under: a shipped name
                (``"python"``, ``"json"``, ``"sql"``, ``"javascript"``), a ``.lark`` path, Lark
                text (see :func:`resolve_grammar`), or a compiled :class:`LarkConstraint`.
            grammar_prefix: the code above the cursor: the output continues it (the
                constraint starts from ``state_after(grammar_prefix)``). Only constrains;
                the model sees ``prompt``.
            grammar_suffix: the code below the cursor (fill-in-the-middle): the output may
                end only where prefix + output + suffix parses.
            stop: where the output may end: ``"eof"`` (anywhere the text, with the suffix,
                parses), ``"line"`` (only at the end of a line; the output stops at the
                first line it ends where the text parses), ``"statement"`` (where the
                statement holding the cursor, or the one the output began, ends; it stops
                where that end is certain, e.g. after ``x = 1\\n``) or ``"block"`` (where
                the block holding the cursor ends: the suffix dedents after the output, or
                the output's ``}``). See ``docs/lark_grammars.md``, stopping points.
            tolerant: when ``grammar_prefix`` does not parse, fall back to a lexer-only
                state from the start of the failing line instead of raising.
            max_new_tokens: token budget of the output (>= 1).
            temperature: 0 for greedy decoding; otherwise sampling temperature.
            top_k, top_p: sampling filters.
            seed: sampling seed, for reproducible sampling.
            chat: chat template: ``None`` auto, ``False`` raw prompt, ``True`` required.
            system: system message for chat models.
            schema_in_prompt: show the schema to the model in the prompt (chat models):
                ``True`` or ``"template"`` as a typed JSON template, ``"json"`` as JSON
                Schema (:mod:`structspec.schema_prompt`), ``False`` not at all.
            whitespace: JSON whitespace policy: ``"spaced"`` (default; ``{"a": 1, "b": [2]}``,
                which small models write more accurately than compact JSON),
                ``"compact"`` or ``"flexible"`` (the model's own, bounded).
            lenient: accept schemas with keywords that cannot be enforced exactly;
                generate under a superset and validate afterwards.
            max_retries: extra attempts when an output fails validation — a lenient
                schema's, or a Pydantic model's own validators beyond its JSON Schema —
                with sampling (greedy retries would repeat the same output).
            speculative: ``None``/``True`` use the Generator's :class:`SpecConfig`, ``False``
                decodes one token per pass, a :class:`SpecConfig` tunes this call. Greedy
                outputs are identical either way; sampling keeps its distribution.

        Returns:
            A :class:`Result`.

        Raises:
            ValueError: a bad argument (named in the message).
            SchemaError, UnsupportedSchemaError: the schema is invalid or cannot be enforced.
            GrammarError: the grammar does not load, or ``grammar_prefix`` does not parse
                (not ``tolerant``); with the line/column. Or ``stop`` names a construct the
                grammar has no rule for (``"statement"`` for JSON, ``"block"`` for SQL).
            GenerationError: the token budget ran out before the output was complete, or the
                output failed validation after every retry.
            LockstepError: a tensor-parallel follower (rank > 0) was asked to decode.
        """
        if not self.leader:
            raise LockstepError("only rank 0 of a tensor-parallel Generator decodes; the "
                                "other ranks call serve()")
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries!r}")
        given = [n for n, v in (("schema", schema), ("regex", regex), ("grammar", grammar))
                 if v is not None]
        if len(given) > 1:
            raise ValueError(f"pass only one of schema or regex or grammar, not "
                             f"{' and '.join(given)}")
        if stop not in STOPS:
            raise ValueError(f"stop must be one of {', '.join(STOPS)}, not {stop!r}")
        if grammar is None:
            extra = [n for n, v in (("grammar_prefix", grammar_prefix),
                                    ("grammar_suffix", grammar_suffix)) if v is not None]
            extra += ["stop"] if stop != "eof" else []
            extra += ["tolerant"] if tolerant else []
            if extra:
                raise ValueError(f"{', '.join(extra)} need(s) grammar=")
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
        if not isinstance(schema_in_prompt, bool) and schema_in_prompt not in SCHEMA_STYLES:
            raise ValueError(f"schema_in_prompt must be a bool or one of {SCHEMA_STYLES}, "
                             f"not {schema_in_prompt!r}")
        if speculative is None or speculative is True:
            spec = self.speculation
        elif speculative is False:
            spec = SpecConfig(enabled=False)
        elif isinstance(speculative, SpecConfig):
            spec = speculative
        else:
            raise ValueError(f"speculative must be a bool or a SpecConfig, not {speculative!r}")

        model_cls = _pydantic_model(schema)
        json_constraint: JsonSchemaConstraint | None = None
        constraint: Constraint
        shown = None
        if schema is not None:
            json_constraint = self.compile(schema, whitespace=whitespace, lenient=lenient)
            constraint = json_constraint
            if schema_in_prompt:
                shown = json_constraint.schema
        elif regex is not None:
            constraint = compile_regex(regex, self.vocab)
        elif grammar is not None:
            constraint = self.compile_grammar(grammar)
            if grammar_prefix is not None or grammar_suffix is not None or stop != "eof":
                constraint = constraint.with_suffix(grammar_suffix or "", stop=stop,
                                                    prefix=grammar_prefix, tolerant=tolerant)
        else:
            constraint = free_text(self.vocab)
        style = "template" if schema_in_prompt is True else str(schema_in_prompt)
        ids = self.prompt_ids(prompt, schema=shown, schema_style=style, chat=chat, system=system)
        if not ids:
            raise ValueError("prompt tokenizes to nothing")

        attempts = 0
        done = False
        try:
            while True:
                attempts += 1
                with self._lock:
                    try:
                        out = self._decode(ids, constraint, max_new_tokens, sampling, spec)
                    except GenerationError as exc:  # what the failed attempt cost counts too
                        self.totals.add(exc.stats if isinstance(exc.stats, DecodeStats)
                                        else None)
                        raise
                self.totals.add(out.stats)
                text = self.vocab.decode_text(out.token_ids)
                if json_constraint is None:
                    done = True
                    return Result(text, text, out.token_ids, out.stats, attempts)
                problem = json_constraint.problem(text)
                beyond_schema = False
                if problem is None:
                    value = json.loads(text)
                    if model_cls is not None:
                        # A model's own validators (``field_validator``, …) are not in its
                        # JSON Schema: a valid output they refuse is retried like a lenient
                        # one, not raised as pydantic's error or as a constraint bug.
                        value, problem = _model_value(model_cls, value)
                        beyond_schema = problem is not None
                    if problem is None:
                        done = True
                        return Result(value, text, out.token_ids, out.stats, attempts)
                self.totals.validation_failed()
                if json_constraint.exact and not beyond_schema:
                    # a constraint bug: never hide it behind a retry
                    raise GenerationError(f"internal error: output failed validation: "
                                          f"{problem}", text, out.token_ids)
                if attempts > max_retries:
                    raise GenerationError(
                        f"output failed validation after {attempts} attempts: {problem}",
                        text, out.token_ids,
                    )
                # Retry by sampling: a greedy retry would only repeat the same output.
                sampling = SamplingParams(
                    temperature=sampling.temperature or 0.7, top_k=top_k, top_p=top_p,
                    seed=None if seed is None else seed + attempts,
                )
        finally:
            self.totals.finish(done)

    def _decode(self, ids: list[int], constraint: Constraint, max_new_tokens: int,
                sampling: SamplingParams, spec: SpecConfig) -> Any:
        """Speculative decoding where the model supports tree masks, plain otherwise."""
        if spec.enabled:
            # Acceptance statistics carry over between requests of one kind (a JSON call is
            # only a few steps: too few to size its trees from its own evidence alone).
            kind = type(constraint).__name__
            with self._acceptance_lock:
                known = self._acceptance.get(kind)
                acceptance = (copy.deepcopy(known) if known is not None
                              else fresh_acceptance(self.loaded.model))
            try:
                return speculative_decode(
                    self.loaded.model, self.vocab, ids, constraint,
                    max_new_tokens=max_new_tokens, sampling=sampling, config=spec,
                    tokenizer=self.loaded.tokenizer, acceptance=acceptance,
                    prefix_cache=self._prefixes,
                )
            except UnsupportedModelError as exc:
                if not self._warned_unsupported:  # once per Generator: every call falls back
                    self._warned_unsupported = True
                    warnings.warn(f"{exc} Decoding without speculation.", RuntimeWarning,
                                  stacklevel=3)
            finally:
                with self._acceptance_lock:
                    self._acceptance[kind] = acceptance
        return decode(self.loaded.model, self.vocab, ids, constraint,
                      max_new_tokens=max_new_tokens, sampling=sampling,
                      prefix_cache=self._prefixes)

    def acceptance(self, kind: str = "JsonSchemaConstraint") -> AcceptanceModel | None:
        """A copy of what this Generator's speculative requests under constraints of class
        ``kind`` have taught it (acceptance per drafter, the model's tokenization habits:
        :class:`~structspec.spec.cost.AcceptanceModel`), or ``None`` before the first."""
        with self._acceptance_lock:
            known = self._acceptance.get(kind)
            return copy.deepcopy(known) if known is not None else None

    def generate(self, prompt: str, **kwargs: Any) -> Any:
        """Like :meth:`run`, but return only ``Result.value``."""
        return self.run(prompt, **kwargs).value


def _model_value(model_cls: Any, value: Any) -> tuple[Any, str | None]:
    """(the model instance, None), or (None, why the model refused ``value``)."""
    from pydantic import ValidationError

    try:
        return model_cls.model_validate(value), None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "/" + "/".join(str(p) for p in first["loc"])
        return None, (f"{model_cls.__name__} refused it: {first['msg']} (at instance {where}; "
                      f"{exc.error_count()} error(s))")


#: The keyword arguments :meth:`Generator.run` takes (``prompt`` among them): what a request
#: sent by name may hold (:mod:`structspec.replicas`, :mod:`structspec.batch`).
RUN_PARAMETERS = frozenset(inspect.signature(Generator.run).parameters) - {"self"}

_GENERATORS: dict[str | None, Generator] = {}
_GENERATORS_LOCK = threading.Lock()


def get_generator(model: str | None = None) -> Generator:
    """A process-wide :class:`Generator` for ``model`` (loaded once, then shared)."""
    with _GENERATORS_LOCK:
        gen = _GENERATORS.get(model)
        if gen is None:
            gen = Generator(model)
            _GENERATORS[model] = gen
        return gen


def generate(prompt: str, *, schema: Any = None, grammar: Any = None, model: str | None = None,
             **kwargs: Any) -> Any:
    """Generate a value matching ``schema`` (or text parsing under ``grammar``) with ``model``
    (default: the embedded model).

    A convenience over :class:`Generator` (one shared instance per model). See
    :meth:`Generator.run` for the keyword arguments (``regex``, ``grammar_prefix``,
    ``grammar_suffix``, ``stop``, ...).
    """
    return get_generator(model).generate(prompt, schema=schema, grammar=grammar, **kwargs)


__all__ = ["RUN_PARAMETERS", "Generator", "GrammarError", "Result", "SchemaError", "generate",
           "get_generator", "resolve_grammar"]
