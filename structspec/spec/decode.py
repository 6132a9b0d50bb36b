"""Speculative constrained decoding: draft a tree, verify it in one pass, keep what agrees.

Each step (DESIGN.md, "Data flow of one request"):

1. drafters grow a :class:`~structspec.spec.tree.DraftTree` rooted at the last committed
   token — every node legal under the constraint;
2. one forward pass of the target over all nodes (tree attention on the KV cache);
3. acceptance walks the tree with each node's masked logits: greedy is token-identical to
   :func:`structspec.engine.decode`, and so is sampling under one seed (each position's token
   is the one its seeded number picks), and a lossy typical-acceptance mode is opt-in;
4. the KV cache keeps only the accepted path; the bonus token becomes the next root.

The cache holds the committed sequence *minus its last token*, which is the next root, and
minus any committed tokens still pending: the next pass runs them before the tree, like a
prefix. The prompt is not prefilled on its own: the first verification pass runs the prompt
and the first tree together (the prompt's last token is the first root), so that pass computes
the first token's distribution and already checks drafts after it — as many passes as plain
decoding when nothing is drafted. ``stats.prefill_seconds`` is that first pass. Tokens the
constraint leaves no choice about (exactly one legal token, no EOS) are committed without a
pass (:func:`certain_tokens`): plain decoding could only choose them, and an output whose
rest is certain (the closing ``}}`` of a JSON call) ends without a last pass.

Tree size: the scheduler bounds the speculative part (smaller for free text, shrunk when it
stops paying or under memory pressure), and within that bound keeps the nodes that maximize
expected tokens per second given the device's measured cost curve
(:mod:`structspec.spec.cost`).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

import torch

from structspec.automata.base import Constraint, State
from structspec.engine import DecodeOutput, advance_or_raise, dead_end
from structspec.errors import GenerationError
from structspec.sampling import SamplingParams, make_draws
from structspec.spec.accept import MaskCache, walk_tree
from structspec.spec.canonical import canonical_tokenizer
from structspec.spec.config import SpecConfig
from structspec.spec.corpus import SOURCE as CORPUS
from structspec.spec.corpus import resolve_corpus
from structspec.spec.cost import (
    AcceptanceModel,
    CostCurve,
    device_cost_curve,
    free_nodes,
    memory_use,
)
from structspec.spec.draft_context import FORCED, DraftContext, drafter_of
from structspec.spec.draft_head import SOURCE as DRAFT_HEAD
from structspec.spec.draft_head import (
    captured_outputs,
    decoder_layer,
    final_norm,
    resolve_head,
)
from structspec.spec.draft_model import SOURCE as DRAFT_MODEL
from structspec.spec.draft_model import DraftModel
from structspec.spec.drafters import build_tree, make_drafters
from structspec.spec.forced import cheap_allowed, learn_choice, learn_closer
from structspec.spec.habits import fresh_acceptance
from structspec.spec.literals import field_literals, request_literals, request_text
from structspec.spec.lockstep import refuse_prefix_cache
from structspec.spec.ngram import NgramIndex
from structspec.spec.prefix import PrefixCache
from structspec.spec.prompt_rows import prompt_row_count, prompt_rows
from structspec.spec.schedule import DrafterGate, Scheduler
from structspec.spec.sparse_logits import SparseLogits
from structspec.spec.stats import SpecStats
from structspec.spec.text_lookup import TextIndex
from structspec.spec.tree import DraftTree, TreeBuilder
from structspec.spec.verify import (
    UnsupportedModelError,
    check_positions,
    check_tree_cache,
    check_tree_support,
    keep_path,
    probe_tree_support,
    tree_cache,
    verify_tree,
)
from structspec.vocab import Vocabulary


@torch.inference_mode()
def speculative_decode(
    model: Any,
    vocab: Vocabulary,
    prompt_ids: list[int],
    constraint: Constraint,
    *,
    max_new_tokens: int,
    sampling: SamplingParams,
    config: SpecConfig | None = None,
    tokenizer: Any = None,
    acceptance: AcceptanceModel | None = None,
    prefix_cache: PrefixCache | None = None,
) -> DecodeOutput:
    """Generate under ``constraint`` with speculative decoding over draft trees.

    Same contract as :func:`structspec.engine.decode` — same stopping rules, same errors,
    greedy output token-identical, sampled output identically distributed (unless
    ``config.validation_threshold`` is set).

    Args:
        model: a ``transformers`` causal LM (eager or sdpa attention, full-attention cache).
        vocab: the vocabulary the constraint was compiled for.
        prompt_ids: the prompt, already templated and tokenized (non-empty).
        constraint: the compiled constraint.
        max_new_tokens: at most this many tokens are generated.
        sampling: greedy or sampling parameters.
        config: speculation settings (default :class:`SpecConfig`).
        tokenizer: the model's tokenizer, for canonical tokenization of forced text and
            literals (``None``: forced text uses the longest matching token instead).
        acceptance: the acceptance statistics to start from and update (per drafter and
            depth, and the model's splits of forced text;
            :class:`~structspec.spec.cost.AcceptanceModel`) — pass one kept across requests
            of a kind so that short requests size their trees and split forced text from
            experience;
            ``None``: a fresh one (the prior, with the model's packaged tokenization
            habits: :mod:`structspec.spec.habits`). Not shared between concurrent decodes.
        prefix_cache: a :class:`~structspec.spec.prefix.PrefixCache` to start the KV cache
            from (the prompt's stored beginning is not prefilled again) and to teach.

    Returns:
        A :class:`~structspec.engine.DecodeOutput` whose ``stats`` is a :class:`SpecStats`.

    Raises:
        GenerationError: ``max_new_tokens`` was reached before the output was complete (the
            error's ``stats`` attribute holds the :class:`SpecStats` of the run), or the
            constraint reached a state with no legal token.
        UnsupportedModelError: speculation is enabled and the model (or the draft model)
            cannot verify trees.
        DraftModelMismatchError: ``config.draft_model`` does not share the target's tokenizer.
        DraftHeadMismatchError: ``config.draft_head`` names a head of another model.
    """
    from structspec.spec.kv_cache import decoding_cache  # (imports transformers)

    config = config or SpecConfig()
    if not prompt_ids:
        raise ValueError("prompt_ids must not be empty")
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    device = model.device
    stats = SpecStats(prompt_tokens=len(prompt_ids))
    draws = make_draws(sampling)
    eos = frozenset(vocab.eos_token_ids)
    start = time.perf_counter()

    curve = None
    free = 0  # speculative nodes the device's passes carry for (almost) nothing
    if config.enabled:
        check_tree_support(model)  # refused before its cost curve is measured by tree passes
        probe_tree_support(model)
        if config.cost_model and config.max_nodes != 0:
            curve = (config.cost_curve if config.cost_curve is not None
                     else device_cost_curve(model))
            free = free_nodes(curve)
        # The most the cache holds at once: the prompt, the output, and a pass's tree.
        widest = max(config.budgets(True, free)[0], config.budgets(False, free)[0])
        most = len(prompt_ids) + max_new_tokens + 1 + config.draft_length + widest
        cache = decoding_cache(model, most, tree_cache(model, most))
        check_positions(model, len(prompt_ids), most)
        check_tree_cache(cache)  # the model's side was checked above
    else:
        cache = decoding_cache(model, len(prompt_ids) + max_new_tokens + 1)
    refuse_prefix_cache(model, prefix_cache)
    past_len = prefix_cache.restore(prompt_ids, cache) if prefix_cache is not None else 0
    prefix = list(prompt_ids[past_len:-1])  # prefilled in the first verification pass

    draft_model = None
    if config.enabled and config.draft_model is not None:
        draft_model = _draft_model(config.draft_model, str(device))
        draft_model.check(vocab)
    history = NgramIndex(max(1, config.lookup_max_n))
    history.extend(prompt_ids)
    prompt_bytes = vocab.decode(prompt_ids) if config.enabled else b""
    prompt_text = prompt_bytes.decode("utf-8", errors="replace")  # as vocab.decode_text
    request = request_text(vocab, prompt_ids) if config.enabled else ""
    ctx = DraftContext(
        constraint=constraint, vocab=vocab, canon=canonical_tokenizer(tokenizer, vocab),
        history=history, prompt_len=len(prompt_ids),
        literals=(request_literals(vocab, prompt_ids, prompt=prompt_text, request=request)
                  if config.enabled else []),
        field_literals=field_literals(prompt_text) if config.enabled else {},
        options=config.options, draft_model=draft_model,
        text_index=TextIndex(prompt_bytes) if config.enabled else None,
        request=request,
        sampling=None if draws is None else sampling, draws=draws,
    )
    structured = _structured(constraint, vocab)
    # "auto": the shipped head wherever one matches. The first head cost more than it
    # gained under a grammar (HumanEval code: 2.61x decode without it, 2.41x with it); the
    # retrained one drafts code too (benchmarks/speculative.py --task code, back to back:
    # 4.95 tokens per pass and 2.70-2.73x end to end with it, 4.14 and 2.45-2.59x
    # without) and leaves JSON where it was (12.44 tokens per pass either way).
    head = resolve_head(config.draft_head, model) if config.enabled else None
    norm = final_norm(model) if head is not None else None
    if head is not None and norm is None:
        if config.draft_head in ("auto", True):
            head = None
        else:
            raise UnsupportedModelError("the draft head needs the target's final norm module "
                                        "(model.model.norm); this model has none")
    corpus = resolve_corpus(config.corpus, vocab) if config.enabled else None
    names = _place(tuple(config.drafters), DRAFT_HEAD, head is not None,
                   after=("values", "closers"), default_end=False)
    names = _place(names, CORPUS, corpus is not None, after=("lookup",), default_end=True)
    ctx.draft_head = head
    ctx.corpus = corpus
    stats.draft_head = head.name if head is not None else None
    drafters = make_drafters(names) if config.enabled else []
    max_nodes, max_branches = config.budgets(structured, free)
    stats.cost_curve = curve.as_dict() if curve is not None else None
    stats.wide = max_nodes > config.budgets(structured)[0]  # (an explicit bound: equal)
    stats.max_nodes = max_nodes if config.enabled else 0
    threshold = config.memory_threshold
    min_acceptance = config.min_acceptance
    if curve is not None and not structured:  # free text: shrink only where it stops paying
        min_acceptance = min(min_acceptance, break_even_hit_rate(curve, max_nodes))
    scheduler = Scheduler(max_nodes, max_branches, adaptive=config.adaptive,
                          window=config.window, min_acceptance=min_acceptance,
                          probe_every=config.probe_every, curve=curve,
                          memory_probe=None if threshold is None else lambda: memory_use(device),
                          memory_threshold=threshold or 1.0,
                          acceptance=(acceptance if acceptance is not None or not config.enabled
                                      else fresh_acceptance(model)),
                          min_nodes=free)
    ctx.acceptance = scheduler.acceptance
    gate = DrafterGate.shared(scheduler.acceptance, config.window, config.probe_every,
                              adaptive=config.adaptive)
    gate.begin()
    masks: MaskCache | None = None

    # Logits only where the constraint leaves a choice, from the output layer's input.
    sparse = SparseLogits.of(model, config.sparse_logits)
    if sparse is not None and norm is None:
        norm = sparse.norm
    # The draft head reads the target's last hidden state at each tree node: a hook on the
    # final norm keeps the pass's output (the rows the logits came from).
    # A head that also reads a middle layer (DraftHead.mid_layer): a hook there too.
    mid = (decoder_layer(model, head.mid_layer)
           if head is not None and head.mid_layer is not None else None)
    with captured_outputs(norm) as captured, captured_outputs(mid) as captured_mid:
        root = prompt_ids[-1]
        state: State = constraint.initial
        out: list[int] = []
        complete = False
        certain = config.enabled and config.forced
        while True:
            if certain:  # tokens the constraint leaves no choice about need no pass
                for token in certain_tokens(constraint, state, max_new_tokens - len(out)):
                    state = advance_or_raise(constraint, state, token, vocab, out)
                    prefix.append(root)  # committed, not yet in the cache
                    out.append(token)
                    history.extend([token])
                    root = token
                    stats.certain_tokens += 1
                    if ctx.head_anchor is not None:
                        ctx.head_anchor[1].append(token)
            # The checks plain decoding makes before each forward pass.
            if constraint.is_accepting(state) and constraint.allowed(state).count() <= len(eos):
                complete = True
                break
            if len(out) >= max_new_tokens:
                break
            if constraint.allowed(state).count() == 0:
                raise dead_end(vocab, out)

            t0 = time.perf_counter()
            first = stats.forward_passes == 0
            built, tree, frontier_depth = _draft(ctx, drafters, scheduler, gate, config, root,
                                                 state, eos, remaining=max_new_tokens - len(out),
                                                 first=first, context=past_len + len(prefix))
            t1 = time.perf_counter()
            plan = (None if sparse is None  # (no mask computed here that costs much)
                    else sparse.plan([cheap_allowed(constraint, st) for st in tree.states]))
            tv = time.perf_counter()
            if first:
                stats.setup_seconds = tv - start
            # The prompt's rows of this pass (the first's, up to its tree): as plain decoding
            # prefills them (structspec.spec.prompt_rows).
            with prompt_rows(prompt_row_count(model, len(prompt_ids) - past_len)):
                logits = verify_tree(model, cache, tree, past_len, prefix,
                                     rows=None if plan is None else plan.full)  # [q or f, V]
            if not first:
                if device.type == "cuda":  # the pass's own time, not its launch (the walk
                    torch.cuda.synchronize(device)  # below would wait for it anyway)
                stats.pass_log.append((len(tree), past_len, time.perf_counter() - tv))
            hidden = captured[-1][0, -len(tree):] if captured else None  # [q, H]
            hidden_mid = captured_mid[-1][0, -len(tree):] if captured_mid else None  # [q, H]
            captured.clear()
            captured_mid.clear()
            if plan is not None and sparse is not None and hidden is not None:  # (the
                # norm's hook captures every pass where sparse logits are on)
                logits = sparse.assemble(plan, logits, hidden)  # [q, V]
                stats.sparse_rows += len(plan.gathered)
            past_len += len(prefix)
            prefix = []
            stats.forward_passes += 1
            stats.steps += 1
            t2 = time.perf_counter()
            if first:
                stats.prefill_seconds = t2 - start
            if masks is None:
                masks = MaskCache(logits.shape[-1], logits.device)
            acc = walk_tree(tree, logits, constraint, masks, sampling, draws, eos_ids=eos,
                            budget=max_new_tokens - len(out), position=len(out),
                            validation_threshold=config.validation_threshold)
            t3 = time.perf_counter()
            keep_path(cache, past_len, acc.path)
            past_len += len(acc.path)
            if first and prefix_cache is not None:
                prefix_cache.learn(prompt_ids, cache)
            t4 = time.perf_counter()
            stats.draft_seconds += t1 - t0
            stats.verify_seconds += (t2 - t1) + (t4 - t3)
            stats.mask_seconds += t3 - t2
            _record(stats, scheduler, gate, built, tree, acc.path, frontier_depth,
                    None if acc.token is None else int(acc.token), first=first)

            accepted = [tree.tokens[i] for i in acc.path[1:]]
            if config.enabled and config.forced:  # how the model tokenized forced text
                for a, b in itertools.pairwise(acc.path):
                    learn_choice(ctx, tree.states[a], tree.tokens[a], tree.tokens[b])
                    learn_closer(ctx, tree.states[a], tree.states[b], tree.tokens[b])
            out.extend(accepted)
            history.extend(accepted)
            state = tree.states[acc.path[-1]]
            ctx.last_logits = acc.masked_logits
            if acc.outcome in ("eos", "complete"):
                complete = True
                break
            if acc.outcome == "limit":
                break
            if acc.outcome == "dead":
                raise dead_end(vocab, out)
            token = int(acc.token)  # type: ignore[arg-type]
            if config.enabled and config.forced:
                prev = tree.tokens[acc.path[-1]]
                learn_choice(ctx, state, prev, token)
            before, state = state, advance_or_raise(constraint, state, token, vocab, out)
            if config.enabled and config.forced:
                learn_closer(ctx, before, state, token)
            out.append(token)
            history.extend([token])
            root = token
            if head is not None and hidden is not None:  # the head starts from the bonus's context
                at = acc.path[-1]
                ctx.head_anchor = (head.start(hidden[at:at + 1], None if hidden_mid is None
                                              else hidden_mid[at:at + 1])[0].clone(), [token])

    complete = complete or constraint.is_accepting(state)
    stats.new_tokens = len(out)
    stats.seconds = time.perf_counter() - start
    stats.budgets = scheduler.history
    stats.planned = scheduler.planned
    stats.memory_pressure_steps = scheduler.pressure_steps
    stats.draft_model_passes = sum(getattr(d, "forward_passes", 0) for d in drafters
                                   if getattr(d, "name", None) == DRAFT_MODEL)
    if not complete:
        text = vocab.decode_text(out)
        error = GenerationError(
            f"max_new_tokens={max_new_tokens} reached before the output was complete "
            f"(partial output: {text[:200]!r}{'...' if len(text) > 200 else ''})",
            text, out,
        )
        error.stats = stats  # type: ignore[attr-defined]  # what the failed run cost
        raise error
    return DecodeOutput(out, complete, stats)


def break_even_hit_rate(curve: CostCurve, max_nodes: int, floor: float = 0.1) -> float:
    """The fraction of steps that must accept a draft for a half-size tree to pay for its
    pass: ``t(1 + max_nodes // 2) / t(1) - 1`` (each hit saves at least one pass), at least
    ``floor``. On a CPU where a pass of a few tokens costs what a pass of one does, this is
    far below the default ``min_acceptance`` of 0.6: free text with a learned draft head
    (hits on ~40-60% of steps) should not be shrunk away. Pure."""
    half = 1 + max(1, max_nodes // 2)
    return max(floor, curve(half) / curve(1) - 1.0)


def certain_tokens(constraint: Constraint, state: State, limit: int) -> list[int]:
    """The tokens that follow ``state`` whatever the model says: while the constraint allows
    exactly one token and does not accept (so EOS is not an option either), that token; at
    most ``limit``. Plain decoding would spend a forward pass on each and could only choose
    it (greedy, sampling and typical acceptance alike), so committing them unverified
    changes no output. Pure."""
    out: list[int] = []
    while len(out) < limit and not constraint.is_accepting(state):
        mask = constraint.allowed(state)
        if mask.count() != 1:
            break
        token = int(mask.ids()[0])
        nxt = constraint.advance(state, token)
        if nxt is None:
            break
        out.append(token)
        state = nxt
    return out


def _draft(
    ctx: DraftContext, drafters: list[Any], scheduler: Scheduler, gate: DrafterGate,
    config: SpecConfig,
    root: int, state: State, eos: frozenset[int], *, remaining: int, first: bool = False,
    context: int = 0,
) -> tuple[DraftTree, DraftTree, int]:
    """This step's tree as built and as planned (what is verified, priced for a pass on
    ``context`` cached tokens), and the depth of its frontier (the end of the forced
    chain)."""
    if not config.enabled:
        builder = TreeBuilder(ctx.constraint, root, state, max_depth=0, max_nodes=0,
                              max_branches=0, eos_ids=eos)
        tree = builder.freeze()
        return tree, tree, 0
    budget = scheduler.budget()
    builder = TreeBuilder(ctx.constraint, root, state,
                          max_depth=min(config.draft_length, remaining),
                          max_nodes=budget.nodes, max_branches=budget.branches, eos_ids=eos)
    # The drafter that hits most drafts first: where budgets are small, a drafter that
    # never hits here (the request's literals in code) would otherwise take the branches of
    # one that does (lookup). Unseen drafters keep the configured order (equal priors).
    rate = scheduler.acceptance.rate
    ordered = sorted(drafters, key=lambda d: -rate(d.name, 1)) if budget.nodes else []
    frontier = build_tree(ctx, builder, ordered, forced=config.forced,
                          active=None if budget.probe else gate.active)
    frontier_depth = builder.depths[frontier]
    built = builder.freeze()
    return (built, scheduler.plan(built, frontier_depth, first=first, context=context),
            frontier_depth)


def _record(stats: SpecStats, scheduler: Scheduler, gate: DrafterGate, built: DraftTree,
            tree: DraftTree, path: tuple[int, ...], frontier_depth: int,
            next_token: int | None = None, *, first: bool = False) -> None:
    """Update per-drafter / per-depth stats for the verified ``tree``; tell the scheduler
    (the tree as drafted, and ``next_token``, the model's choice after the path: its
    acceptance statistics learn from the nodes the plan dropped too) and the gate how it
    went (the gate counts a drafter whose nodes the plan dropped as a miss: it cost
    drafting time for nothing)."""
    stats.draft_nodes += len(tree) - 1
    stats.accepted_tokens += len(path) - 1
    for i in range(1, len(tree)):
        stats.per_drafter[tree.sources[i]][0] += 1
    for i in path[1:]:
        stats.per_drafter[tree.sources[i]][1] += 1
    on_path = set(path)
    for i in range(1, len(tree)):
        rows = stats.per_drafter_depth.setdefault(tree.sources[i], [])
        d = tree.depths[i]
        while len(rows) < d:
            rows.append([0, 0])
        rows[d - 1][0] += 1
        rows[d - 1][1] += i in on_path
    depth = tree.max_depth
    while len(stats.per_depth) < depth:
        stats.per_depth.append([0, 0])
    for d in range(depth):
        stats.per_depth[d][0] += 1
    for d in range(len(path) - 1):
        stats.per_depth[d][1] += 1
    proposed = {drafter_of(built.sources[i]): False for i in range(1, len(built))
                if built.sources[i] != FORCED}
    for i in path[1:]:
        name = drafter_of(tree.sources[i])
        if name in proposed:
            proposed[name] = True
    gate.record(proposed)
    scheduler.record_tree(tree, path, frontier_depth, built=built, next_token=next_token,
                          first=first)


def _place(names: tuple[str, ...], name: str, used: bool, *, after: tuple[str, ...],
           default_end: bool) -> tuple[str, ...]:
    """``names`` with drafter ``name``: dropped when not ``used``; when used and absent,
    inserted after the last of ``after`` present (none present: at the end if
    ``default_end``, else first). Pure."""
    if not used:
        return tuple(n for n in names if n != name)
    if name in names:
        return names
    present = [names.index(n) + 1 for n in after if n in names]
    at = max(present) if present else (len(names) if default_end else 0)
    return (*names[:at], name, *names[at:])


def _structured(constraint: Constraint, vocab: Vocabulary) -> bool:
    """Whether the constraint looks like structured output: at the start it allows at most
    half the vocabulary (free text and prose-like regexes allow nearly all of it)."""
    return constraint.allowed(constraint.initial).count() * 2 <= len(vocab)


_DRAFT_MODELS: dict[tuple[str, str], DraftModel] = {}


def _draft_model(spec: Any, device: str) -> DraftModel:
    """``spec`` as a :class:`DraftModel`; model ids are loaded once per process and device."""
    if not isinstance(spec, str):
        return DraftModel.resolve(spec)  # a DraftModel already (SpecConfig wraps the others)
    key = (spec, device)
    hit = _DRAFT_MODELS.get(key)
    if hit is None:
        hit = _DRAFT_MODELS[key] = DraftModel.resolve(spec, device=device)
    return hit
