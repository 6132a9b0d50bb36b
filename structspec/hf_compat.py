"""What differs between the transformers releases structspec runs on (5.17 and later 5.x).

transformers 5.24 renamed the KV-cache keyword of a model's ``forward`` from
``past_key_values`` to ``cache``; before 5.24 an unknown ``cache=`` is swallowed by
``**kwargs`` and the model silently runs without its cache (wrong logits, no error), and from
5.24 on the old name logs a deprecation warning. :func:`cache_kwargs` names the cache the way
the model's own ``forward`` takes it.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

#: The release that renamed ``past_key_values`` to ``cache``.
_RENAMED_IN = (5, 24)
#: The names a ``forward`` may take the KV cache under (the new one first).
CACHE_KEYWORDS = ("cache", "past_key_values")


@functools.cache
def _default_keyword() -> str:
    """The keyword for a ``forward`` that names neither (a wrapper taking ``**kwargs``): the
    installed release's."""
    import transformers

    parts = []
    for part in transformers.__version__.split(".")[:2]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return "cache" if tuple(parts) >= _RENAMED_IN else "past_key_values"


@functools.cache
def _keyword_of(cls: type[Any]) -> str:
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return _default_keyword()
    for name in CACHE_KEYWORDS:
        if name in params:
            return name
    return _default_keyword()


def cache_kwargs(model: Any, cache: Any) -> dict[str, Any]:
    """``{keyword: cache}`` for ``model(**...)``: ``cache`` or ``past_key_values``, whichever
    ``model``'s ``forward`` names (per model class, memoized)."""
    return {_keyword_of(type(model)): cache}  # type: ignore[arg-type]  # a class is Hashable


def base_model(model: Any) -> Any:
    """The decoder a causal LM wraps (``model.model`` for Llama: the module its
    ``base_model_prefix`` names), or ``None`` where it has none."""
    return getattr(model, getattr(model, "base_model_prefix", "model"), None)
