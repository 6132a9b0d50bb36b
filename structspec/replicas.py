"""Data-parallel decoding: several whole :class:`~structspec.api.Generator` replicas, one per
process, sharing out a batch of requests.

One sequence decodes one pass at a time, and on a CPU a pass of one row barely uses a second
core (one core already streams the weights about as fast as the memory delivers them): the
default model's speculative requests at two threads take ~0.9x the time of one. Two
processes of one thread each, on the 2-core machine this project runs on, decoded 20 function
calls in 0.68x the time one process at two threads took (plain decoding 0.56x;
``benchmarks/replicas.py``). With several GPUs, a replica per GPU.

DESIGN.md sketched the replicas as verifiers of a batch's trees with the drafting on rank
0. They are whole decoders here instead: a request's drafting is a few percent of its time,
while a verifier fed by another process pays a round trip per pass; whole replicas exchange
nothing but the requests and their results, need no ``torch.distributed`` group or launcher,
and each keeps its own acceptance statistics, as a :class:`Generator` does. Greedy outputs
are one Generator's: a row's numbers depend neither on the pass nor on the process, and on
the packed CPU kernels not on the thread count either (``benchmarks/replicas.py``: 40 of 40
identical, one process at two threads against replicas at one); sampled ones follow their
seeds.

The pool is :class:`concurrent.futures.ProcessPoolExecutor` (spawned processes: a forked
torch is not safe), which already hands each request to the next free replica and reports a
replica that died; what is added here is the replicas' start (each loads the model once,
and one that cannot is reported with its own error before any request is taken), requests
checked against :meth:`Generator.run`'s parameters before they leave the process, and
results in order with their statistics summed.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import multiprocessing
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from structspec.api import RUN_PARAMETERS
from structspec.errors import DistributedError, StructSpecError
from structspec.spec.config import SpecConfig
from structspec.spec.totals import StatsTotals

#: What a replica holds once started (one process, one Generator).
_REPLICA: dict[str, Any] = {}


def default_layout(device: str, replicas: int | None, threads: int | None) -> tuple[int, int]:
    """``(replicas, threads per replica)`` for ``device`` where not given: a replica per GPU
    on ``"cuda"``; on a CPU, one replica per core up to four (more replicas of one sequence
    each only contend for the memory's bandwidth), the cores shared out among them. Pure but
    for reading the device count and the cores this process may use.

    Raises:
        ValueError: ``replicas`` or ``threads`` is given and not a positive integer."""
    for name, value in (("replicas", replicas), ("threads", threads)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            raise ValueError(f"{name} must be a positive integer, not {value!r}")
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        cores = os.cpu_count() or 1
    if replicas is None:
        if device.split(":")[0] == "cuda":
            import torch

            replicas = max(1, torch.cuda.device_count())
        else:
            replicas = max(1, min(4, cores))
    if threads is None:
        threads = max(1, cores // replicas)
    return replicas, threads


def replica_device(device: str, index: int) -> str:
    """The device of replica ``index``: ``cuda:i`` in turn over the visible GPUs for
    ``"cuda"``; ``device`` itself otherwise (``"cpu"``, or a GPU named by number)."""
    if device == "cuda":
        import torch

        count = torch.cuda.device_count()
        return f"cuda:{index % count}" if count else device
    return device


def _start(options: dict[str, Any], counter: Any, barrier: Any) -> None:
    """A replica's initializer: take the next index, set the thread count, load the model.
    An error is kept (and raised by every task this replica takes), not raised here: an
    initializer that raises leaves the pool broken with no word of why. (``counter`` and
    ``barrier`` come this way because locks only pass to a process at its start.)"""
    with counter.get_lock():
        index = counter.value
        counter.value += 1
    _REPLICA.update(index=index, device=replica_device(options["device"], index),
                    barrier=barrier)
    try:
        import torch

        torch.set_num_threads(options["threads"])
        from structspec.api import Generator

        _REPLICA["generator"] = Generator(
            options["model"], device=_REPLICA["device"], speculation=options["speculation"],
            pack=options["pack"], draft_model=options["draft_model"],
            int8_activations=options["int8_activations"])
    except BaseException as exc:  # reported by _report and by every request it takes
        # A typed error goes back as it is; anything else (out of memory, a library's own
        # exception, which may not even pickle) as a DistributedError that names it.
        _REPLICA["error"] = exc if isinstance(exc, (StructSpecError, ValueError)) else \
            DistributedError(f"replica {index} could not start on {_REPLICA['device']}: "
                             f"{type(exc).__name__}: {exc}")


def _report(timeout: float) -> tuple[int, str, BaseException | None]:
    """``(index, device, start-up error)`` of the replica that takes this task. Waits for
    the others' at the start-up barrier, so that each replica takes exactly one."""
    _REPLICA["barrier"].wait(timeout)
    return _REPLICA["index"], _REPLICA["device"], _REPLICA.get("error")


def _request(kwargs: dict[str, Any]) -> tuple[Any, BaseException | None, StatsTotals]:
    """One :meth:`Generator.run` on this replica: ``(result, None, totals)`` or, where it
    raised a typed error, ``(None, error, totals)`` — the totals what the Generator counted
    for this request alone (its attempts, a failure), for the caller's sum."""
    error = _REPLICA.get("error")
    if error is not None:
        raise error
    generator = _REPLICA["generator"]
    generator.totals = StatsTotals()
    try:
        return generator.run(**kwargs), None, generator.totals
    except (StructSpecError, ValueError) as exc:
        return None, exc, generator.totals


class Replicas:
    """A pool of processes, each holding one :class:`~structspec.api.Generator` (a copy of
    the model), decoding requests side by side.

    Args:
        model: what :class:`Generator` takes as a model spec: ``None`` for the embedded
            default, a model id, a local directory or a GGUF file (a loaded model cannot
            travel to another process).
        replicas, threads: how many processes, and torch threads in each; by default
            :func:`default_layout`.
        device: ``"cpu"``, ``"cuda"`` (replica ``i`` on GPU ``i`` modulo the GPUs), or one
            device for all.
        speculation, pack, draft_model, int8_activations: as :class:`Generator` takes them
            (a draft model by spec, for the same reason as ``model``).
        start_timeout: seconds the replicas may take to load the model before the pool gives
            up with :class:`DistributedError`.

    The constructor returns once every replica has loaded the model. Use as a context
    manager, or call :meth:`close`. The replicas are spawned: they import the calling
    script's main module again, so a script starts them under ``if __name__ ==
    "__main__":``, and a Pydantic model class passed as a schema must be importable
    (defined at a module's top level). Thread-safe: :meth:`submit`, :meth:`run` and
    :meth:`map` may be called from several threads.

    Raises:
        ValueError: a bad argument (named).
        StructSpecError: a replica could not start — its own error (e.g. ``ModelLoadError``).
        DistributedError: a replica died or did not start within ``start_timeout``.
    """

    def __init__(self, model: str | os.PathLike[str] | None = None, *,
                 replicas: int | None = None, threads: int | None = None, device: str = "cpu",
                 speculation: SpecConfig | None = None, pack: bool = True,
                 draft_model: str | os.PathLike[str] | None = None,
                 int8_activations: bool = True, start_timeout: float = 900.0) -> None:
        for name, value in (("model", model), ("draft_model", draft_model)):
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ValueError(f"{name} must be a model spec (id, directory or GGUF file) "
                                 f"that each replica loads itself, not a "
                                 f"{type(value).__name__}")
        if not isinstance(device, str) or not device:
            raise ValueError(f"device must be a torch device string, not {device!r}")
        self.replicas, self.threads = default_layout(device, replicas, threads)
        self.device = device
        #: What the replicas' Generators counted for the requests that came back, summed:
        #: the totals one Generator would show for them (thread-safe).
        self.totals = StatsTotals()
        options = {"model": None if model is None else os.fspath(model),
                   "draft_model": None if draft_model is None else os.fspath(draft_model),
                   "device": device, "threads": self.threads, "speculation": speculation,
                   "pack": pack, "int8_activations": int8_activations}
        from structspec.models import default_model_dir, is_default_model

        if is_default_model(None if model is None else os.fspath(model)):
            default_model_dir()  # a first run converts the embedded model here, not N times
        context = multiprocessing.get_context("spawn")
        self._pool = cf.ProcessPoolExecutor(
            max_workers=self.replicas, mp_context=context, initializer=_start,
            initargs=(options, context.Value("i", 0), context.Barrier(self.replicas)))
        #: ``(index, device)`` of each replica, in the order they reported.
        self.devices: list[tuple[int, str]] = []
        try:
            self._hello(start_timeout)
        except BaseException:
            self._abort()  # a replica may hang in its start: waiting for it would hang too
            raise

    def _hello(self, timeout: float) -> None:
        """Wait for every replica to load the model; raise the first one's error."""
        futures = [self._pool.submit(_report, timeout) for _ in range(self.replicas)]
        pending = cf.wait(futures, timeout=timeout + 5.0).not_done
        if pending:
            raise DistributedError(f"the {self.replicas} replicas did not load the model "
                                   f"within {timeout:.0f} s")
        errors = []
        for future in futures:
            try:
                index, device, error = future.result()
            except BrokenProcessPool as exc:
                raise DistributedError(f"a replica died while it loaded the model: "
                                       f"{exc}") from exc
            except threading.BrokenBarrierError as exc:
                raise DistributedError(f"the {self.replicas} replicas did not load the "
                                       f"model within {timeout:.0f} s") from exc
            self.devices.append((index, device))
            if error is not None:
                errors.append(error)
        if errors:
            raise errors[0]

    def _check(self, request: Mapping[str, Any], where: str) -> dict[str, Any]:
        """``request`` as keyword arguments of :meth:`Generator.run`; ``ValueError`` naming
        ``where`` and the field for what would otherwise fail in a replica or be ignored."""
        if not isinstance(request, Mapping):
            raise ValueError(f"{where}: a request is a mapping of Generator.run's arguments, "
                             f"not a {type(request).__name__}")
        unknown = sorted(str(k) for k in request if k not in RUN_PARAMETERS)
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {', '.join(unknown)} (known: "
                             f"{', '.join(sorted(RUN_PARAMETERS))})")
        if "prompt" not in request:
            raise ValueError(f"{where}: no 'prompt'")
        return dict(request)

    def submit(self, prompt: str, **kwargs: Any) -> cf.Future[Any]:
        """Queue one request (the arguments of :meth:`Generator.run`); its future gives the
        :class:`~structspec.api.Result` or raises what ``run`` raised (a replica that died:
        :class:`DistributedError`). Does not block.

        Raises:
            ValueError: an argument ``run`` does not take.
            DistributedError: the pool lost a replica before."""
        return self._submit(self._check({"prompt": prompt, **kwargs}, "request"))

    def _submit(self, kwargs: dict[str, Any]) -> cf.Future[Any]:
        """The pool's future for one request, wrapped so that it counts the request's
        statistics and names a dead replica as :class:`DistributedError`."""
        try:
            inner = self._pool.submit(_request, kwargs)
        except BrokenProcessPool as exc:
            raise DistributedError(f"a replica process died earlier: {exc}") from exc
        outer: cf.Future[Any] = cf.Future()
        outer.add_done_callback(lambda f: inner.cancel() if f.cancelled() else None)
        inner.add_done_callback(lambda f: self._settle(f, outer))
        return outer

    def _settle(self, inner: cf.Future[Any], outer: cf.Future[Any]) -> None:
        """Pass a finished request on to ``outer``, its statistics to :attr:`totals`."""
        if inner.cancelled():
            outer.cancel()
            return
        result, error = None, inner.exception()
        if isinstance(error, BrokenProcessPool):
            error = DistributedError(f"a replica process died while decoding: {error}")
        elif error is None:
            result, error, totals = inner.result()
            self.totals.merge(totals)
        if not outer.set_running_or_notify_cancel():
            return
        if error is not None:
            outer.set_exception(error)
        else:
            outer.set_result(result)

    def run(self, prompt: str, **kwargs: Any) -> Any:
        """One request, on the next free replica: :meth:`Generator.run`'s arguments and
        result, and its errors (a replica that died: :class:`DistributedError`)."""
        return self.submit(prompt, **kwargs).result()

    def map(self, requests: Iterable[Mapping[str, Any]], *, errors: str = "raise",
            window: int | None = None) -> Iterator[Any]:
        """Results of ``requests`` (mappings of :meth:`Generator.run`'s arguments), in their
        order, while the replicas work on the next ones (at most ``window`` in flight;
        default four per replica, so a long or endless iterable is read as it goes).

        Args:
            errors: ``"raise"``: the first request that fails raises its error (the ones
                queued behind it are cancelled); ``"return"``: a failed request's error is
                yielded in its place (a :class:`StructSpecError` or ``ValueError``; a dead
                replica still raises).

        Raises:
            ValueError: a malformed request (its index and field named), ``errors`` or
                ``window`` not understood."""
        if errors not in ("raise", "return"):
            raise ValueError(f"errors must be 'raise' or 'return', not {errors!r}")
        if window is None:
            window = 4 * self.replicas
        if not isinstance(window, int) or window < 1:
            raise ValueError(f"window must be a positive integer, not {window!r}")
        pending: collections.deque[cf.Future[Any]] = collections.deque()
        source = iter(enumerate(requests))
        try:
            while True:
                while len(pending) < window:
                    item = next(source, None)
                    if item is None:
                        break
                    pending.append(self._submit(self._check(item[1], f"request {item[0]}")))
                if not pending:
                    return
                future = pending.popleft()
                try:
                    yield future.result()
                except (StructSpecError, ValueError) as exc:
                    if errors == "raise" or isinstance(exc, DistributedError):
                        raise
                    yield exc
        finally:
            for future in pending:
                future.cancel()

    def close(self) -> None:
        """Stop the replicas once their running requests end (queued ones are cancelled).
        Idempotent."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def _abort(self) -> None:
        """Stop the replicas now, whatever they are doing."""
        processes = list((getattr(self._pool, "_processes", None) or {}).values())
        self._pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.kill()
        for process in processes:
            process.join(timeout=30)

    def __enter__(self) -> Replicas:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
