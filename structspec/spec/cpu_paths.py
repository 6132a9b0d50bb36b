"""The fast CPU paths a model gets for verification passes, in one call.

Packed linear layers (:mod:`structspec.spec.fastlinear`) and grouped-query attention kept
grouped under tree masks (:mod:`structspec.spec.attention`): together they make a pass of a
few tokens cost little more than a pass of one, which speculation on a CPU needs. Around
them, the gated MLP's activation (:mod:`structspec.spec.gated_mlp`) and the rotary
embeddings (:mod:`structspec.spec.rope`) as one native call each, where torch's small
operators cost more in dispatch than in arithmetic: 5-8% of every pass, one node or many.
And the packed weights in huge pages (:mod:`structspec.spec.hugepages`), which a pass
streams from memory: 1-8% of a pass on one thread (the most at one node), 2-3% on two.
Last, what packing freed goes back to the OS (:mod:`structspec.spec.heap`).
"""

from __future__ import annotations

from typing import Any

from structspec.spec.attention import use_grouped_sdpa
from structspec.spec.fastlinear import (
    available_kernels,
    cpu_float32,
    is_packed,
    pack_linears,
    release_originals,
)
from structspec.spec.gated_mlp import use_fused_activation
from structspec.spec.heap import trim_heap
from structspec.spec.hugepages import use_huge_pages
from structspec.spec.prompt_rows import use_prompt_panels
from structspec.spec.rope import use_native_rotary


def use_fast_cpu_paths(model: Any, quantized: bool = True,
                       int8_activations: bool = True, huge_pages: bool = True,
                       prompt_panels: bool = True, keep_originals: bool = False) -> Any:
    """Pack ``model``'s linears and switch its attention where each applies (a CPU float32
    model; grouped-query sdpa attention); a no-op elsewhere. In place, idempotent; returns
    ``model``. ``quantized``: as :func:`~structspec.spec.fastlinear.pack_linears`.
    ``int8_activations``: run exactly block-quantized layers with q >= 0 (GGUF Q4_1) with
    8-bit activations (``"panel_int8"``, llama.cpp's arithmetic for such weights: faster
    passes, outputs within that rounding of float32 arithmetic) where that kernel runs here;
    the float32 panels otherwise (``False``: always). ``huge_pages``: move the packed
    panels into transparent huge pages where the OS gives them (same outputs).
    ``prompt_panels``: with ``int8_activations``, prompts prefill their rows on coarser
    integer blocks (:mod:`~structspec.spec.prompt_rows`: a faster prefill, outputs within
    that rounding; off for a model that never prefills a prompt, such as a draft model).
    ``keep_originals``: keep each packed layer's original float32 weight beside its panels;
    by default they are let go where the panels give them back exactly and nothing else
    holds them (:func:`~structspec.spec.fastlinear.release_originals`: rebuilt, bit for
    bit, for whatever asks — ``state_dict``, ``unpack_linears``, autograd). Packing's freed
    copies are handed back to the OS afterwards (:func:`~structspec.spec.heap.trim_heap`)."""
    kernel = None
    if int8_activations and "panel_int8" in available_kernels(approx=True):
        kernel = "panel_int8"
    # a no-op where no kernel runs or the model is not CPU float32
    pack_linears(model, kernel, quantized=quantized)
    if kernel == "panel_int8" and prompt_panels:
        use_prompt_panels(model)
    if huge_pages:
        use_huge_pages(model)
    use_grouped_sdpa(model)
    if cpu_float32(model):
        use_fused_activation(model)
        use_native_rotary(model)
    if is_packed(model):
        if not keep_originals:
            release_originals(model)
        trim_heap()
    return model
