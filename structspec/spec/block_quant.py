"""Exact block-quantized weights: find the integers a float32 weight was dequantized from.

The default model ships as GGUF Q4_1 (its body linears) and Q8_0 (its tied embedding and
output layer), and loads as float32 tensors dequantized from them: in every block of 32
input features of an output row, ``w = d*q + m`` with ``d`` and ``m`` half-precision numbers
(``m = 0`` for Q8_0) and ``q`` a small integer (0-15 for Q4_1, -127..127 for Q8_0), computed
in float32. :func:`recover` finds such ``d``, ``m`` and ``q`` for each block and keeps them
only if they give back **every bit** of the weight; then a kernel can read one byte per
weight instead of four and widen it to exactly the float32 number the layer holds
(``structspec/_native/smallgemm.c``, quantized panels): the model's outputs do not change.

``d*q`` is exact in float32 (``d`` has 11 significant bits, ``|q|`` at most 7), so
``fl(fl(d*q) + m)`` — what the dequantizer computed — equals one fused multiply-add, which is
how the kernel widens. Recovery needs no file format and no metadata: any weight that has
this structure is found, any other (a float32 checkpoint) is refused at its first block.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

#: Input features per quantization block (GGUF's QK4_1 and QK8_0).
BLOCK = 32
#: Candidate scales tried around the first guess, in units in the last place of a half.
_STEPS = (0, -1, 1, -2, 2)


class BlockQuant(NamedTuple):
    """``w[r, c] == fma(q[r, c], d[r, c // 32], m[r, c // 32])`` bit for bit, in float32."""

    q: np.ndarray  # int8 [n, k]
    d: np.ndarray  # float32 [n, k // 32], each a half-precision number
    m: np.ndarray  # float32 [n, k // 32], each a half-precision number (or -0.0)


def _halves_near(value: np.ndarray) -> list[np.ndarray]:
    """Half-precision numbers (as float32) at the _STEPS around ``value`` rounded to half."""
    with np.errstate(over="ignore", invalid="ignore"):
        bits = value.astype(np.float16).view(np.uint16).astype(np.int32)
    out = []
    for step in _STEPS:
        cand = np.clip(bits + step, 0, 0x7BFF).astype(np.uint16).view(np.float16)
        out.append(cand.astype(np.float32))
    return out


def _try(blocks: np.ndarray, d: np.ndarray, m: np.ndarray, lo: int, hi: int
         ) -> tuple[np.ndarray, np.ndarray]:
    """q for each block given (d, m), and which blocks it reproduces bit for bit."""
    safe = np.where(d > 0, d, np.float32(1))[..., None]
    with np.errstate(invalid="ignore", over="ignore"):
        q = np.clip(np.rint((blocks - m[..., None]) / safe), lo, hi).astype(np.int8)
        # float32, as the kernel widens: q from its byte (no -0.0), d*q exact, one rounding
        back = d[..., None] * q.astype(np.float32) + m[..., None]
    same = (back.view(np.uint32) == blocks.view(np.uint32)).all(-1) & (d > 0)
    return q, same


def _recover_blocks(blocks: np.ndarray) -> BlockQuant | None:
    """Recover each block of ``blocks`` [..., 32] as Q4_1 or Q8_0, or ``None``."""
    shape = blocks.shape[:-1]
    q_out = np.zeros(blocks.shape, np.int8)
    d_out = np.zeros(shape, np.float32)
    m_out = np.zeros(shape, np.float32)
    done = np.zeros(shape, bool)
    if not np.isfinite(blocks).all():
        return None
    low, high = blocks.min(-1), blocks.max(-1)
    amax = np.abs(blocks).max(-1)
    # Q4_1: the offset is the block's minimum (q = 0 there), the scale spans it to the max.
    low_is_half = low.astype(np.float16).astype(np.float32) == low
    neg_zero = np.full(shape, -0.0, np.float32)
    q4 = [(d, low, 0, 15, low_is_half) for d in
          _halves_near(((high.astype(np.float64) - low) / 15).astype(np.float32))]
    # Q8_0: no offset (-0.0 adds nothing, not even to a zero's sign), symmetric scale.
    q8 = [(d, neg_zero, -127, 127, None) for d in
          _halves_near((amax.astype(np.float64) / 127).astype(np.float32))]
    # The nearest scale of each kind first: it is right for nearly every block.
    attempts = [q4[0], q8[0], *q4[1:], *q8[1:]]
    for d, m, lo, hi, allowed in attempts:
        todo = ~done if allowed is None else ~done & allowed
        if not todo.any():
            continue
        q, same = _try(blocks[todo], d[todo], m[todo], lo, hi)
        idx = np.flatnonzero(todo.ravel())[same]
        flat_q, flat_d, flat_m = (q_out.reshape(-1, BLOCK), d_out.reshape(-1),
                                  m_out.reshape(-1))
        flat_q[idx] = q[same]
        flat_d[idx] = d[todo][same]
        flat_m[idx] = m[todo][same]
        done.reshape(-1)[idx] = True
        if done.all():
            return BlockQuant(q_out, d_out, m_out)
    return None


def recover(weight: np.ndarray) -> BlockQuant | None:
    """The block quantization that reproduces ``weight`` (float32 [n, k], out x in) exactly,
    or ``None`` when there is none (``k`` not a multiple of 32, or some block that no Q4_1 or
    Q8_0 scale and offset gives back bit for bit). Pure; the first row is tried first, so a
    weight of another kind is refused quickly."""
    if weight.ndim != 2 or weight.dtype != np.float32 or weight.shape[1] % BLOCK:
        return None
    n, k = weight.shape
    if n == 0 or k == 0:
        return None
    blocks = np.ascontiguousarray(weight).reshape(n, k // BLOCK, BLOCK)
    if _recover_blocks(blocks[:1]) is None:
        return None
    found = _recover_blocks(blocks)
    return None if found is None else found._replace(q=found.q.reshape(n, k))


def dequantize(quant: BlockQuant) -> np.ndarray:
    """The float32 weight ``quant`` stands for (the reference the kernel must match)."""
    n, k = quant.q.shape
    blocks = quant.q.reshape(n, k // BLOCK, BLOCK).astype(np.float32)
    return (quant.d[..., None] * blocks + quant.m[..., None]).reshape(n, k)


def quantize_q4_1(weight: np.ndarray) -> BlockQuant:
    """Quantize ``weight`` (float32 [n, k], k a multiple of 32) as GGUF's Q4_1 does (per block:
    offset the minimum, scale (max - min) / 15, both stored as halves, q rounded to nearest):
    for benchmarks and tests that need weights shaped like the default model's. Lossy, pure."""
    n, k = weight.shape
    blocks = weight.astype(np.float32).reshape(n, k // BLOCK, BLOCK)
    low, high = blocks.min(-1), blocks.max(-1)
    d = ((high - low) / 15).astype(np.float16).astype(np.float32)
    m = low.astype(np.float16).astype(np.float32)
    safe = np.where(d > 0, d, np.float32(1))[..., None]
    q = np.clip(np.rint((blocks - m[..., None]) / safe), 0, 15).astype(np.int8)
    return BlockQuant(q.reshape(n, k), d, m)


def quantize_q8_0(weight: np.ndarray) -> BlockQuant:
    """Quantize ``weight`` (float32 [n, k], k a multiple of 32) as GGUF's Q8_0 does (per block:
    scale ``max |w| / 127`` stored as a half, q rounded to nearest, no offset): for layers
    whose numbers only rank guesses (the draft head's, :func:`~structspec.spec.fastlinear.
    rounded_int8`) and for tests. Lossy, pure."""
    n, k = weight.shape
    blocks = weight.astype(np.float32).reshape(n, k // BLOCK, BLOCK)
    d = (np.abs(blocks).max(-1) / 127).astype(np.float16).astype(np.float32)
    safe = np.where(d > 0, d, np.float32(1))[..., None]
    q = np.clip(np.rint(blocks / safe), -127, 127).astype(np.int8)
    return BlockQuant(q.reshape(n, k), d, np.full(d.shape, -0.0, np.float32))
