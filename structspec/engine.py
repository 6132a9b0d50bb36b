"""The decode loop: a model, a KV cache and a constraint, one token per forward pass.

This is plain constrained decoding (greedy or sampling); speculative decoding builds on the
same pieces. The loop stops when the model emits EOS in an accepting state, or when the
constraint admits nothing but the end (no forward pass is spent asking for an EOS that is
certain). Running out of ``max_new_tokens`` before the output is complete raises
:class:`~structspec.errors.GenerationError` with the partial text.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from structspec.automata.base import Constraint, State
from structspec.errors import GenerationError
from structspec.hf_compat import cache_kwargs
from structspec.masks import apply_mask, mask_to_bool
from structspec.sampling import SamplingParams, choose, make_draws
from structspec.vocab import Vocabulary


@dataclass
class DecodeStats:
    """What one generation cost.

    Attributes:
        prompt_tokens: tokens of the prompt (prefilled in one pass).
        new_tokens: tokens generated (EOS excluded).
        forward_passes: model forward calls, the prefill included.
        seconds: wall time of the whole decode.
        prefill_seconds: wall time until the prefill pass ended (the time to the first
            token), :attr:`setup_seconds` included.
        setup_seconds: wall time before the prefill pass began: the cache, a prefix cache's
            restore; under speculation also the device's cost curve (measured once per
            machine and model, seconds, then read from the user cache), the draft head, the
            tree support probe (once per model) and the first tree's drafting.
        mask_seconds: time spent computing and applying masks.
        sparse_rows: rows whose logits were computed for their few allowed tokens only
            (:mod:`structspec.spec.sparse_logits`).
    """

    prompt_tokens: int = 0
    new_tokens: int = 0
    forward_passes: int = 0
    seconds: float = 0.0
    prefill_seconds: float = 0.0
    setup_seconds: float = 0.0
    mask_seconds: float = 0.0
    sparse_rows: int = 0

    @property
    def tokens_per_second(self) -> float:
        """New tokens per second of decoding after the prefill."""
        decode = self.seconds - self.prefill_seconds
        return self.new_tokens / decode if decode > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        """The stats as a plain dict (for JSON output)."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "new_tokens": self.new_tokens,
            "forward_passes": self.forward_passes,
            "seconds": round(self.seconds, 4),
            "prefill_seconds": round(self.prefill_seconds, 4),
            "setup_seconds": round(self.setup_seconds, 4),
            "mask_seconds": round(self.mask_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 2),
            "sparse_rows": self.sparse_rows,
        }


@dataclass
class DecodeOutput:
    """Generated token ids (EOS excluded), whether the output is complete, and stats."""

    token_ids: list[int]
    complete: bool
    stats: DecodeStats = field(default_factory=DecodeStats)


class _FreeText:
    """The constraint of unconstrained generation: any text token, EOS at any point."""

    def __init__(self, vocab: Vocabulary) -> None:
        from structspec.automata.base import TokenMask

        self._vocab = vocab
        self._mask = TokenMask.from_ids(
            [i for i, t in enumerate(vocab.tokens) if t] + sorted(vocab.eos_token_ids), len(vocab)
        )
        self.initial = 0
        self.vocab_size = len(vocab)

    def advance(self, state: State, token: int) -> State | None:
        return 0 if token in self._mask else None

    def allowed(self, state: State):
        return self._mask

    def is_accepting(self, state: State) -> bool:
        return True

    def forced(self, state: State) -> bytes:
        return b""


def free_text(vocab: Vocabulary) -> Constraint:
    """A constraint that allows any text (special tokens except EOS stay out)."""
    return _FreeText(vocab)


def dead_end(vocab: Vocabulary, out: list[int]) -> GenerationError:
    """The error for a constraint state with no legal token (the output so far attached)."""
    return GenerationError("the constraint reached a state with no legal token",
                           vocab.decode_text(out), out)


def advance_or_raise(constraint: Constraint, state: State, token: int, vocab: Vocabulary,
                     out: list[int]) -> State:
    """``constraint.advance`` for a token the mask allowed; a refusal is a constraint bug."""
    next_state = constraint.advance(state, token)
    if next_state is None:
        raise GenerationError(
            f"internal error: token {token} was allowed but advance refused it",
            vocab.decode_text(out), out,
        )
    return next_state


@torch.inference_mode()
def decode(
    model: Any,
    vocab: Vocabulary,
    prompt_ids: list[int],
    constraint: Constraint,
    *,
    max_new_tokens: int,
    sampling: SamplingParams,
    prefix_cache: Any = None,
    sparse_logits: bool = True,
) -> DecodeOutput:
    """Generate under ``constraint`` with a KV cache, one token per forward pass.

    Args:
        model: a ``transformers`` causal LM.
        vocab: the vocabulary the constraint was compiled for.
        prompt_ids: the prompt, already templated and tokenized (non-empty).
        constraint: the compiled constraint.
        max_new_tokens: at most this many tokens are generated.
        sampling: greedy or sampling parameters.
        prefix_cache: a :class:`~structspec.spec.prefix.PrefixCache` to start the KV cache
            from (the prompt's stored beginning is not prefilled again) and to teach.
        sparse_logits: where the next state allows few tokens, compute only their logits
            (bitwise the same; :mod:`structspec.spec.sparse_logits`, where it supports the
            model).

    Returns:
        The generated ids; ``complete`` is True (an incomplete output raises).

    Raises:
        GenerationError: ``max_new_tokens`` was reached before the output was complete, or
            the constraint reached a state with no legal token.
    """
    # imported here: structspec.spec imports this module
    from structspec.spec.draft_head import captured_outputs
    from structspec.spec.kv_cache import decoding_cache
    from structspec.spec.lockstep import refuse_prefix_cache
    from structspec.spec.prompt_rows import prompt_row_count, prompt_rows
    from structspec.spec.sparse_logits import SparseLogits

    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = model.device
    stats = DecodeStats(prompt_tokens=len(prompt_ids))
    draws = make_draws(sampling)
    eos = vocab.eos_token_ids
    start = time.perf_counter()

    sparse = SparseLogits.of(model, sparse_logits)
    out: list[int] = []
    with captured_outputs(None if sparse is None else sparse.norm) as captured:
        cache = decoding_cache(model, len(prompt_ids) + max_new_tokens)
        refuse_prefix_cache(model, prefix_cache)
        reused = prefix_cache.restore(prompt_ids, cache) if prefix_cache is not None else 0
        input_ids = torch.tensor([prompt_ids[reused:]], dtype=torch.long,
                                 device=device)  # [1, P']
        forward = _Pass(model, cache, constraint, sparse, captured, stats)
        stats.setup_seconds = time.perf_counter() - start
        with prompt_rows(prompt_row_count(model, len(prompt_ids) - reused)):
            logits = forward(input_ids, constraint.initial)
        stats.forward_passes += 1
        if prefix_cache is not None:
            prefix_cache.learn(prompt_ids, cache)
        stats.prefill_seconds = time.perf_counter() - start

        state: State = constraint.initial
        # Constraints memoize masks per state, so the same few mask objects recur: convert
        # each to a bool tensor once (keyed by identity; the mask itself kept alongside).
        bool_masks: dict[int, tuple[Any, torch.Tensor]] = {}
        complete = False
        while True:
            t0 = time.perf_counter()
            mask = constraint.allowed(state)
            n_allowed = mask.count()
            eos_allowed = constraint.is_accepting(state)
            if eos_allowed and n_allowed <= len(eos):  # nothing can follow: done, no pass
                complete = True
                stats.mask_seconds += time.perf_counter() - t0
                break
            if n_allowed == 0:
                raise dead_end(vocab, out)
            row = logits[0, -1]  # [V']
            cached = bool_masks.get(id(mask))
            if cached is None:
                cached = (mask, mask_to_bool(mask, row.shape[-1], row.device))
                bool_masks[id(mask)] = cached
            masked = apply_mask(row, cached[1])
            stats.mask_seconds += time.perf_counter() - t0
            token = choose(masked, sampling, None if draws is None else draws(len(out)))
            if token in eos:
                complete = True
                break
            state = advance_or_raise(constraint, state, token, vocab, out)
            out.append(token)
            if constraint.is_accepting(state) and constraint.allowed(state).count() <= len(eos):
                complete = True
                break
            if len(out) >= max_new_tokens:
                break
            step = torch.tensor([[token]], dtype=torch.long, device=device)  # [1, 1]
            logits = forward(step, state)
            stats.forward_passes += 1

    # At the token limit an output the constraint accepts is complete (and valid).
    complete = complete or constraint.is_accepting(state)
    stats.new_tokens = len(out)
    stats.seconds = time.perf_counter() - start
    if not complete:
        text = vocab.decode_text(out)
        raise GenerationError(
            f"max_new_tokens={max_new_tokens} reached before the output was complete "
            f"(partial output: {text[:200]!r}{'...' if len(text) > 200 else ''})",
            text, out, stats,
        )
    return DecodeOutput(out, complete, stats)


class _Pass:
    """One forward pass of :func:`decode` over new tokens: the next-token logits ``[1, 1, V]``
    of the last one, only the allowed tokens' where ``sparse`` supports the model and the
    next state allows few (then the final norm's output, which ``captured`` receives from a
    hook, feeds the gathered logits)."""

    def __init__(self, model: Any, cache: Any, constraint: Constraint, sparse: Any,
                 captured: list[torch.Tensor], stats: DecodeStats) -> None:
        self.model = model
        self.stats = stats
        self.cache = cache
        self.constraint = constraint
        self.sparse = sparse
        self.captured = captured

    def __call__(self, input_ids: torch.Tensor, state: State) -> torch.Tensor:
        plan = None if self.sparse is None else self.sparse.plan([self.constraint.allowed(state)])
        if plan is None:
            logits = self.model(input_ids=input_ids, **cache_kwargs(self.model, self.cache),
                                use_cache=True, logits_to_keep=1).logits  # [1, 1, V]
        else:  # one row, gathered: the output layer runs on no row at all
            keep = torch.empty(0, dtype=torch.long, device=input_ids.device)
            full = self.model(input_ids=input_ids, **cache_kwargs(self.model, self.cache),
                              use_cache=True, logits_to_keep=keep).logits[0]  # [0, V]
            logits = self.sparse.assemble(plan, full, self.captured[-1][0, -1:])[None]
            self.stats.sparse_rows += 1
        self.captured.clear()
        return logits
