"""The fast CPU paths a model gets for verification passes, in one call.

Packed linear layers (:mod:`structspec.spec.fastlinear`) and grouped-query attention kept
grouped under tree masks (:mod:`structspec.spec.attention`): together they make a pass of a
few tokens cost little more than a pass of one, which speculation on a CPU needs.
"""

from __future__ import annotations

from typing import Any

from structspec.spec.attention import use_grouped_sdpa
from structspec.spec.fastlinear import pack_linears


def use_fast_cpu_paths(model: Any, quantized: bool = True) -> Any:
    """Pack ``model``'s linears and switch its attention where each applies (a CPU float32
    model; grouped-query sdpa attention); a no-op elsewhere. In place, idempotent; returns
    ``model``. ``quantized``: as :func:`~structspec.spec.fastlinear.pack_linears`."""
    # a no-op where no kernel runs or the model is not CPU float32
    pack_linears(model, quantized=quantized)
    use_grouped_sdpa(model)
    return model
