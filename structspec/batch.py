"""Batches of requests as JSON Lines: what ``structspec batch`` reads and writes.

A request is one JSON object per line holding :meth:`Generator.run`'s arguments by name
(``prompt`` and, say, ``schema`` as a JSON Schema object, ``regex``, ``grammar`` by shipped
name or Lark text, ``max_new_tokens``, ``temperature``, ``seed``, …) and, optionally, an
``id`` that comes back with its result. The results go out one JSON object per line in the
requests' order: ``{"index", "id"?, "text", "value"?, "attempts", "stats"}`` or, for a
request that failed, ``{"index", "id"?, "error": {"type", "message", "text"?}}`` — one bad
request does not stop the batch. A file that cannot be read as requests (a line that is
not a JSON object, an unknown field) is refused whole, naming the line, before any model
loads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from structspec.errors import GenerationError, StructSpecError

#: A request's field that is not an argument of ``Generator.run``: echoed with its result.
ID = "id"


def _fields() -> frozenset[str]:
    """The fields a request may hold: :meth:`Generator.run`'s parameters, and ``id``."""
    from structspec.api import RUN_PARAMETERS

    return RUN_PARAMETERS | {ID}


def _request_object(value: Any, where: str, fields: frozenset[str],
                    what: str = "a request is a JSON object") -> dict[str, Any]:
    """``value`` if it is a JSON object of ``fields`` only; else ``ValueError`` naming
    ``where``, ``what`` it should be, or the fields."""
    if not isinstance(value, dict):
        raise ValueError(f"{where}: {what}, not {type(value).__name__}")
    unknown = sorted(k for k in value if k not in fields)
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (known: "
                         f"{', '.join(sorted(fields))})")
    return value


def check_defaults(defaults: Any, source: str = "defaults") -> dict[str, Any]:
    """``defaults`` (parsed JSON) as the arguments every request of a batch takes unless it
    sets them: a JSON object of ``Generator.run``'s arguments (a schema shared by all the
    lines, a token budget). Pure.

    Raises:
        ValueError: not a JSON object, or a field ``run`` does not take (named)."""
    return _request_object(defaults, source, _fields() - {ID},
                           "a JSON object of Generator.run's arguments")


def read_requests(lines: Iterable[str], source: str = "requests",
                  defaults: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The requests of a JSON Lines text (blank lines skipped), each over ``defaults``
    (:func:`check_defaults`; a line's own fields win). Pure.

    Raises:
        ValueError: a line that is not a JSON object, holds a field ``Generator.run`` does
            not take, or has no ``prompt`` (``source``, the line number and the field
            named); a text with no request at all."""
    fields = _fields()
    requests = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{source} line {number}"
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{where}: not JSON: {exc.msg} (column {exc.colno})") from exc
        request = {**(defaults or {}), **_request_object(request, where, fields)}
        if not isinstance(request.get("prompt"), str):
            raise ValueError(f"{where}: 'prompt' must be a string")
        requests.append(request)
    if not requests:
        raise ValueError(f"{source}: no requests")
    return requests


def run_arguments(request: Mapping[str, Any]) -> dict[str, Any]:
    """``request`` without its ``id``: the keyword arguments of :meth:`Generator.run`."""
    return {k: v for k, v in request.items() if k != ID}


def record(index: int, request: Mapping[str, Any], outcome: Any) -> dict[str, Any]:
    """The JSON-ready result line of request ``index``: from a
    :class:`~structspec.api.Result`, or from the error it raised. ``value`` is given for
    schema-constrained requests (the parsed JSON), where it is not the text itself."""
    line: dict[str, Any] = {"index": index}
    if ID in request:
        line[ID] = request[ID]
    if isinstance(outcome, BaseException):
        error: dict[str, Any] = {"type": type(outcome).__name__,
                                 "message": " ".join(str(outcome).split())}
        if isinstance(outcome, GenerationError):
            error["text"] = outcome.text
        line["error"] = error
        return line
    line["text"] = outcome.text
    if outcome.value != outcome.text:
        value = outcome.value
        line["value"] = value.model_dump() if hasattr(value, "model_dump") else value
    s = outcome.stats
    line["attempts"] = outcome.attempts
    line["stats"] = {"new_tokens": s.new_tokens, "forward_passes": s.forward_passes,
                     "prompt_tokens": s.prompt_tokens, "seconds": round(s.seconds, 4)}
    return line


def run_in_process(generator: Any, requests: Iterable[Mapping[str, Any]]) -> Iterator[Any]:
    """Each request's :class:`~structspec.api.Result`, or the error it raised (a
    :class:`StructSpecError` or ``ValueError``), one after the other on ``generator``."""
    for request in requests:
        try:
            yield generator.run(**run_arguments(request))
        except (StructSpecError, ValueError) as exc:
            yield exc
