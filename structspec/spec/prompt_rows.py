"""A prompt's rows through the body's integer linears on coarser blocks: a faster prefill.

Every request prefills its prompt in one pass before its first token (plain and speculative
decoding alike): ~100-160 rows for a function call or a code prefix, a third of a
speculative JSON request on this project's CPU. The body's ``"panel_int8"`` layers
(:mod:`~structspec.spec.fastlinear`) run GGUF Q4_1 weights on their own blocks of 32 inputs,
one float epilogue per block — the numbers every pass must share, since a tree row has to
get the very numbers a one-row step gets. A prompt row has no such partner: it is prefilled
once, by either decoder, and only ever as a prompt row. So where the CPU has AVX-512 VNNI,
:func:`use_prompt_panels` gives each body layer a second copy of its weight rounded to int8
per 64 inputs and output (``structspec/_native/promptdot.c``), and a pass run inside
:func:`prompt_rows` sends its first ``n`` rows through it: one epilogue per 64 inputs, 0.81x
the layer time at 24-114 rows (Zen 4, one thread, session 63), +1.13 bytes a weight.

What holds speculation lossless: the decoders enter :func:`prompt_rows` with exactly the
prompt's rows of the pass (plain :func:`~structspec.engine.decode` its whole prefill;
speculative decoding the prompt's part of its first pass, before the first tree's rows,
which stay on the shared kernels), and a row's numbers on this path depend on that row
alone (integer sums, then its own float steps), whatever the pass — a prefix-cache hit
prefills a prompt's tail alone, so one prompt row meets passes of different sizes, as the
prompt's last token does (prefilled by plain decoding, the root of speculative decoding's
first tree after a hit). The output layer is left
out (its rows are the ones logits are kept for, not the pass's). Outputs move by the
coarser rounding of the prompt: the default model gets 110 of the 250 BFCL dev calls right
with it, 111 without (session 63, ``docs/performance.md``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch

from structspec import _native

#: How many leading rows of the passes run now are prompt rows (0: none). Read by
#: :meth:`~structspec.spec.fastlinear.PackedLinear.forward` for layers with prompt panels.
PROMPT_ROWS: contextvars.ContextVar[int] = contextvars.ContextVar(
    "structspec_prompt_rows", default=0)


@contextlib.contextmanager
def prompt_rows(count: int) -> Iterator[None]:
    """Within the block, the first ``count`` rows of each pass are prompt rows (the rest, a
    tree's, run as any pass's). Nested blocks restore the outer count."""
    token = PROMPT_ROWS.set(max(0, int(count)))
    try:
        yield
    finally:
        PROMPT_ROWS.reset(token)


def prompt_row_count(model: Any, rows: int) -> int:
    """What a decoder passes :func:`prompt_rows` for a pass whose first ``rows`` rows are the
    prompt's (``rows`` <= 0: none): ``rows``, or 0 for a model split over ranks
    (:mod:`~structspec.spec.lockstep`: the other ranks run their shares of a pass without
    being told its prompt rows, so every rank runs them as any other). Pure."""
    from structspec.spec.shard import shard_of

    return 0 if rows <= 0 or shard_of(model) is not None else rows


def kernel() -> Any:
    """The ``promptdot`` module where it runs here (AVX-512 VNNI), else ``None``."""
    return _native.runnable("promptdot")


def use_prompt_panels(model: Any) -> int:
    """Give ``model``'s packed integer body layers (not its output layer) prompt panels,
    in place and idempotent; returns how many layers have them. A no-op (0) where the kernel
    does not run here, or for layers whose inputs are not a multiple of its block."""
    from structspec.spec import fastlinear
    from structspec.spec.fastlinear import PackedLinear

    mod = kernel()
    if mod is None:
        return 0
    fastlinear._PROMPTDOT[0] = mod
    block = mod.block()
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    count = 0
    for layer in model.modules():
        if not isinstance(layer, PackedLinear) or layer is output or not layer.int8:
            continue
        if layer.prompt_panels is None:
            n, k = layer.out_features, layer.in_features
            if k % block:
                continue
            weight = layer.dense_weight().to(torch.float32).contiguous()
            panels = torch.empty(mod.packed_bytes(n, k), dtype=torch.uint8)
            mod.pack(panels.data_ptr(), weight.data_ptr(), n, k)
            layer.prompt_panels = panels
        count += 1
    return count


def prompt_panel_count(model: Any) -> int:
    """How many of ``model``'s layers run prompt rows on prompt panels."""
    from structspec.spec.fastlinear import PackedLinear

    return sum(1 for m in model.modules()
               if isinstance(m, PackedLinear) and m.prompt_panels is not None)
