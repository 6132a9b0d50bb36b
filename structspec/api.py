"""The Python face of structspec: :class:`Generator`, :class:`Result` and :func:`generate`.

A :class:`Generator` owns one model (the embedded default unless told otherwise), its
vocabulary and a cache of compiled constraints. ``run`` returns the whole :class:`Result`
(value, text, token ids, stats); ``generate`` returns just the value — a dict/list for a
JSON Schema, an instance for a Pydantic model class, a string for a regex or free text.
Every JSON output is validated with ``jsonschema`` before it is returned.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any

from structspec.automata.base import Constraint
from structspec.automata.json_schema import JsonSchemaConstraint, compile_json_schema
from structspec.automata.regex import compile_regex
from structspec.engine import DecodeStats, decode, free_text
from structspec.errors import GenerationError, SchemaError
from structspec.models import LoadedModel, load_model
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, UnsupportedModelError, speculative_decode
from structspec.spec.fastlinear import pack_linears, packing_available
from structspec.vocab import Vocabulary

DEFAULT_SYSTEM = "You are a precise assistant. Answer with JSON only."
SCHEMA_INSTRUCTION = "Answer with a JSON value that matches this JSON Schema:\n{schema}"


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


class Generator:
    """Structured generation with one model.

    Args:
        model: ``None`` for the embedded default (SmolLM2-135M-Instruct), a model spec
            accepted by :func:`structspec.models.load_model` (HF id, local dir, GGUF file),
            or an already :class:`~structspec.models.LoadedModel`.
        device: torch device for a model loaded here.
        speculation: default speculative-decoding settings (``None``: :class:`SpecConfig`
            defaults, speculation on); ``run(speculative=...)`` overrides per call.
        pack: on CPU, replace the model's linear layers by packed oneDNN ones (same outputs
            within 1e-4; passes of a few tokens get much cheaper, which speculation needs).
        draft_model: a small model with the same tokenizer to draft with (a model spec, a
            :class:`~structspec.models.LoadedModel` or a
            :class:`~structspec.spec.draft_model.DraftModel`); loaded here (and packed like
            the target) and added to the default ``speculation`` config.

    Thread-safety: compiled constraints are shared; concurrent ``run`` calls on one
    Generator are serialized by a lock (one model, one KV cache at a time).
    """

    def __init__(self, model: str | LoadedModel | None = None, *, device: str = "cpu",
                 speculation: SpecConfig | None = None, pack: bool = True,
                 draft_model: Any = None) -> None:
        self.loaded = model if isinstance(model, LoadedModel) else load_model(model, device=device)
        self.speculation = speculation if speculation is not None else SpecConfig()
        if draft_model is not None:
            from dataclasses import replace

            from structspec.spec.draft_model import DraftModel

            draft = DraftModel.resolve(draft_model, device=device, pack=pack)
            if pack and packing_available(draft.model):
                pack_linears(draft.model)
            self.speculation = replace(self.speculation, draft_model=draft)
        if pack and packing_available(self.loaded.model):
            pack_linears(self.loaded.model)
        self.vocab = Vocabulary.from_tokenizer(
            self.loaded.tokenizer,
            eos_token_ids=self.loaded.eos_token_ids,
            vocab_size=int(getattr(self.loaded.model.config, "vocab_size", 0) or 0) or None,
        )
        self._lock = threading.Lock()

    # -- building blocks ------------------------------------------------------------------

    def compile(
        self, schema: Any, *, whitespace: str = "compact", lenient: bool = False
    ) -> JsonSchemaConstraint:
        """Compile a JSON Schema (dict, bool, JSON text) or a Pydantic model class.

        Cached per schema and options. Raises :class:`SchemaError` /
        :class:`UnsupportedSchemaError` for schemas it cannot enforce.
        """
        model_cls = _pydantic_model(schema)
        if model_cls is not None:
            schema = model_cls.model_json_schema()
        return compile_json_schema(schema, self.vocab, whitespace=whitespace, lenient=lenient)

    def prompt_ids(
        self,
        prompt: str,
        *,
        schema_text: str | None = None,
        chat: bool | None = None,
        system: str | None = None,
    ) -> list[int]:
        """Tokenize ``prompt``, through the chat template when the model has one.

        Args:
            prompt: the user's request.
            schema_text: a JSON Schema to show the model (appended to the request).
            chat: ``None`` = use the chat template if the tokenizer has one; ``False`` = the
                raw prompt text (nothing added); ``True`` = require a template.
            system: system message for chat models (default: a short "answer with JSON").
        """
        tokenizer = self.loaded.tokenizer
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat is True and not has_template:
            raise ValueError("chat=True but the tokenizer has no chat template")
        if chat is False or not has_template:
            return list(tokenizer.encode(prompt, add_special_tokens=False))
        content = prompt
        if schema_text is not None:
            content = f"{prompt}\n\n{SCHEMA_INSTRUCTION.format(schema=schema_text)}"
        messages = []
        if system is not None or schema_text is not None:
            messages.append({"role": "system", "content": system or DEFAULT_SYSTEM})
        messages.append({"role": "user", "content": content})
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    # -- generation -----------------------------------------------------------------------

    def run(
        self,
        prompt: str,
        *,
        schema: Any = None,
        regex: str | None = None,
        max_new_tokens: int = 512,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        chat: bool | None = None,
        system: str | None = None,
        schema_in_prompt: bool = True,
        whitespace: str = "compact",
        lenient: bool = False,
        max_retries: int = 3,
        speculative: bool | SpecConfig | None = None,
    ) -> Result:
        """Generate one output under a JSON Schema, a Pydantic model, a regex, or nothing.

        Args:
            prompt: the request (non-empty).
            schema: a JSON Schema (dict, bool or JSON text) or a Pydantic model class.
            regex: a regular expression the whole output must match (instead of a schema).
            max_new_tokens: token budget of the output (>= 1).
            temperature: 0 for greedy decoding; otherwise sampling temperature.
            top_k, top_p: sampling filters.
            seed: sampling seed, for reproducible sampling.
            chat: chat template: ``None`` auto, ``False`` raw prompt, ``True`` required.
            system: system message for chat models.
            schema_in_prompt: show the schema to the model in the prompt (chat models).
            whitespace: JSON whitespace policy, ``"compact"`` or ``"flexible"``.
            lenient: accept schemas with keywords that cannot be enforced exactly;
                generate under a superset and validate afterwards.
            max_retries: extra attempts when a lenient output fails validation (with
                sampling; greedy retries would repeat the same output).
            speculative: ``None``/``True`` use the Generator's :class:`SpecConfig`, ``False``
                decodes one token per pass, a :class:`SpecConfig` tunes this call. Greedy
                outputs are identical either way; sampling keeps its distribution.

        Returns:
            A :class:`Result`.

        Raises:
            ValueError: a bad argument (named in the message).
            SchemaError, UnsupportedSchemaError: the schema is invalid or cannot be enforced.
            GenerationError: the token budget ran out before the output was complete, or the
                output failed validation after every retry.
        """
        if not isinstance(prompt, str) or not prompt.strip():
            raise ValueError("prompt must be a non-empty string")
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        if not isinstance(max_retries, int) or max_retries < 0:
            raise ValueError(f"max_retries must be >= 0, got {max_retries!r}")
        if schema is not None and regex is not None:
            raise ValueError("pass either schema or regex, not both")
        sampling = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
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
        schema_text = None
        if schema is not None:
            json_constraint = self.compile(schema, whitespace=whitespace, lenient=lenient)
            constraint = json_constraint
            if schema_in_prompt:
                schema_text = json.dumps(json_constraint.schema, separators=(",", ":"))
        elif regex is not None:
            constraint = compile_regex(regex, self.vocab)
        else:
            constraint = free_text(self.vocab)
        ids = self.prompt_ids(prompt, schema_text=schema_text, chat=chat, system=system)
        if not ids:
            raise ValueError("prompt tokenizes to nothing")

        attempts = 0
        while True:
            attempts += 1
            with self._lock:
                out = self._decode(ids, constraint, max_new_tokens, sampling, spec)
            text = self.vocab.decode_text(out.token_ids)
            if json_constraint is None:
                return Result(text, text, out.token_ids, out.stats, attempts)
            problem = _validation_problem(json_constraint, text)
            if problem is None:
                value = json.loads(text)
                if model_cls is not None:
                    value = model_cls.model_validate(value)
                return Result(value, text, out.token_ids, out.stats, attempts)
            if json_constraint.exact:  # a constraint bug: never hide it behind a retry
                raise GenerationError(f"internal error: output failed validation: {problem}",
                                      text, out.token_ids)
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

    def _decode(self, ids: list[int], constraint: Constraint, max_new_tokens: int,
                sampling: SamplingParams, spec: SpecConfig) -> Any:
        """Speculative decoding where the model supports tree masks, plain otherwise."""
        if spec.enabled:
            try:
                return speculative_decode(
                    self.loaded.model, self.vocab, ids, constraint,
                    max_new_tokens=max_new_tokens, sampling=sampling, config=spec,
                    tokenizer=self.loaded.tokenizer,
                )
            except UnsupportedModelError:
                pass
        return decode(self.loaded.model, self.vocab, ids, constraint,
                      max_new_tokens=max_new_tokens, sampling=sampling)

    def generate(self, prompt: str, **kwargs: Any) -> Any:
        """Like :meth:`run`, but return only ``Result.value``."""
        return self.run(prompt, **kwargs).value


def _validation_problem(constraint: JsonSchemaConstraint, text: str) -> str | None:
    """Why ``text`` is not a valid instance of the constraint's schema (``None`` if valid)."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        return f"not JSON: {exc}"
    error = next(iter(constraint.validator.iter_errors(value)), None)
    if error is None:
        return None
    where = "/" + "/".join(str(p) for p in error.absolute_path)
    return f"{error.message} (at instance {where})"


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


def generate(prompt: str, *, schema: Any = None, model: str | None = None, **kwargs: Any) -> Any:
    """Generate a value matching ``schema`` with ``model`` (default: the embedded model).

    A convenience over :class:`Generator` (one shared instance per model). See
    :meth:`Generator.run` for the keyword arguments.
    """
    return get_generator(model).generate(prompt, schema=schema, **kwargs)


__all__ = ["Generator", "Result", "SchemaError", "generate", "get_generator"]
