"""Learned draft head: a tiny recurrent network drafts from the target's own hidden state.

No smaller model shares the default model's tokenizer, so the draft comes from the target
itself, in the manner of ReDrafter (Cheng et al. 2024) and EAGLE (Li et al. 2024): the
verification pass hands back the target's final-norm hidden state ``h`` at the node whose
logits chose the bonus token; the head takes ``h`` and the bonus token's embedding and
predicts the next hidden state, hence the next token, then recurs on its own prediction:

    s_0 = h;  s_{k+1} = s_k + W2 · silu(W1 · [norm(s_k); norm(emb(x_k))]);  logits = W_r · s_{k+1}

``W_r`` holds the rows of the target's tied output embedding for a reduced vocabulary (the
few thousand most frequent tokens of the training data, as in FR-Spec, Zhao et al. 2025), so
a step costs a few hundredths of a target pass and the file stores only the ids. There is no
KV cache: the recurrent state is one vector per branch. Trained by self-distillation on the
target's own greedy outputs (``scripts/train_draft_head.py``).

Drafting is deterministic (top-k of the head's logits among legal tokens, no sampling), and
every node goes through the :class:`~structspec.spec.tree.TreeBuilder`, which refuses
illegal tokens, so greedy and sampling acceptance stay lossless. The drafter grows a dynamic
tree by the head's path probabilities (EAGLE-2, Li et al. 2024) and scores each node with
the head's probability of it, which the cost plan reads (:class:`DraftHeadDrafter`).

A head file belongs to one target: it records the target's :func:`fingerprint` (a hash of
its configuration and of a sample of its embedding), and :meth:`DraftHead.load` refuses any
other model with :class:`DraftHeadMismatchError`. :func:`packaged_head` finds the head
shipped in ``structspec/spec/heads/`` for a model, if any.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
from torch import nn

from structspec import _native
from structspec.errors import StructSpecError
from structspec.hf_compat import base_model
from structspec.spec.drafters import register_drafter
from structspec.spec.tree import TreeBuilder

if TYPE_CHECKING:
    from structspec.spec.fastlinear import PackedLinear

SOURCE = "draft_head"
#: Source of the head's other nodes (off its greedy chain): counted apart from the chain, so
#: the statistics show the chain's (higher) acceptance.
SOURCE_ALT = "draft_head_alt"
HEADS_DIR = Path(__file__).resolve().parent / "heads"
FORMAT = 1
#: The drafter's options where the context names none; ``SpecConfig``'s defaults are these.
OPTION_DEFAULTS: dict[str, float] = {
    "draft_head_topk": 3, "draft_head_branch_levels": 6, "draft_head_max_depth": 6,
    "draft_head_min_prob": 0.10, "draft_head_first_min_prob": 0.0, "draft_head_max_feed": 8,
}
_SPARE = 3  # candidates tried beyond the k wanted, in case the best are illegal


class DraftHeadMismatchError(StructSpecError, ValueError):
    """A draft head file does not belong to the target model (other weights, sizes or
    vocabulary), or is not a draft head file at all."""


def head_path(model_name: str) -> Path:
    """Where the packaged head of ``model_name`` lives (it may not exist)."""
    return HEADS_DIR / f"{model_name}.pt"


def fingerprint(model: Any) -> str:
    """A short hash identifying the target's weights: its sizes and a strided sample of its
    input embedding, rounded to bfloat16 (the same model loaded in float32 or bfloat16 gets
    the same fingerprint). Pure; memoized on the model object."""
    cached = getattr(model, "_structspec_fingerprint", None)
    if cached is not None:
        return cached
    config = model.config
    emb = model.get_input_embeddings().weight.detach()  # [V, H]
    step = max(1, emb.shape[0] // 509)
    sample = emb[::step, ::7].to(torch.bfloat16).view(torch.int16).cpu().numpy()  # [~509, H/7]
    h = hashlib.sha256()
    h.update(repr((getattr(config, "model_type", ""), emb.shape[0], emb.shape[1],
                   getattr(config, "num_hidden_layers", 0))).encode())
    h.update(sample.tobytes())
    value = h.hexdigest()[:24]
    with contextlib.suppress(AttributeError, TypeError):  # exotic wrappers: no memo
        model._structspec_fingerprint = value
    return value


_F = TypeVar("_F", bound=Callable[..., Any])


def _inference(fn: _F) -> _F:
    """``fn`` under ``torch.inference_mode``, entered only where it is not on already. The
    head's methods run inside a decode, which is: there entering it again for each call cost
    ~15-20 us right after a verification pass (the guard's code is cold then), against ~2 us
    for this check (session 62; a prose request makes ~400 such calls)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        if torch.is_inference_mode_enabled():
            return fn(*args, **kwargs)
        with torch.inference_mode():
            return fn(*args, **kwargs)

    return cast("_F", run)


class _RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., H] -> [..., H]
        # torch's fused op: one dispatch instead of six (a drafted level runs two norms)
        return nn.functional.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def _add_block_layers(module: nn.Module, hidden_size: int, hidden_dim: int) -> None:
    """Give ``module`` one step block's layers (``norm_s``, ``norm_e``, ``fc1``, ``fc2``); the
    output layer starts at zero, so a new block starts as the identity."""
    module.norm_s = _RMSNorm(hidden_size)
    module.norm_e = _RMSNorm(hidden_size)
    module.fc1 = nn.Linear(2 * hidden_size, hidden_dim)
    module.fc2 = nn.Linear(hidden_dim, hidden_size)
    nn.init.zeros_(module.fc2.weight)
    nn.init.zeros_(module.fc2.bias)


class _Block(nn.Module):
    """One residual MLP block of a step: ``s + fc2(silu(fc1([norm(s), norm(e)])))``."""

    norm_s: _RMSNorm
    norm_e: _RMSNorm
    fc1: nn.Module  # nn.Linear, or its packed replacement on CPU
    fc2: nn.Module

    def __init__(self, hidden_size: int, hidden_dim: int) -> None:
        super().__init__()
        _add_block_layers(self, hidden_size, hidden_dim)


def _block_step(block: Any, s: torch.Tensor, e: torch.Tensor,
                inplace: bool = False) -> torch.Tensor:
    """One block (a :class:`_Block`, or the net itself for its first) applied to state ``s``
    ``[n, H]`` with token embeddings ``e`` ``[n, H]``. The modules' forwards are called
    directly: a drafted level is a few small matrix products, where each module call's
    dispatch showed up (~0.1 ms per level of a ~0.8 ms level). ``inplace``: the activation
    overwrites its input (no autograd: drafting only)."""
    z = torch.cat([block.norm_s.forward(s), block.norm_e.forward(e)], dim=-1)  # [n, 2H]
    return s + block.fc2.forward(nn.functional.silu(block.fc1.forward(z), inplace=inplace))


class DraftHeadNet(nn.Module):
    """The trainable part: one recurrent step ``(s, e) -> s'`` over target hidden states.

    Args:
        hidden_size: the target's hidden size ``H``.
        hidden_dim: width of the step's inner layers ``D``.
        mid: the first state also reads a middle layer's output (see :meth:`start`).
        blocks: residual MLP blocks per step (Hydra, Ankner et al. 2024, found a deeper
            step drafts better; each block reads the token's embedding again).
    """

    norm_s: _RMSNorm
    norm_e: _RMSNorm
    fc1: nn.Module  # nn.Linear, or its packed replacement on CPU
    fc2: nn.Module

    def __init__(self, hidden_size: int, hidden_dim: int, mid: bool = False,
                 blocks: int = 1) -> None:
        super().__init__()
        if blocks < 1:
            raise ValueError(f"blocks must be >= 1, got {blocks}")
        self.hidden_size = hidden_size
        self.hidden_dim = hidden_dim
        # The first block's parameters keep their original names (head files of one block).
        _add_block_layers(self, hidden_size, hidden_dim)
        self.extra = nn.ModuleList(_Block(hidden_size, hidden_dim) for _ in range(blocks - 1))
        # Optional: a middle layer's output at the anchor, added to the first state (see
        # start); zero at first, so a head fine-tuned with it starts as the head without.
        self.norm_m: _RMSNorm | None = None
        self.mid_in: nn.Linear | None = None
        if mid:
            self.norm_m = _RMSNorm(hidden_size)
            self.mid_in = nn.Linear(hidden_size, hidden_size, bias=False)
            nn.init.zeros_(self.mid_in.weight)

    @property
    def blocks(self) -> int:
        """Residual MLP blocks per step."""
        return 1 + len(self.extra)

    @property
    def has_mid(self) -> bool:
        """Whether the first state also reads a middle layer's output."""
        return self.mid_in is not None

    def start(self, h: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
        """The first state from the target's last hidden state ``h`` ``[n, H]`` and, for a
        head with a middle-layer input, that layer's output ``m`` ``[n, H]`` at the same
        position (EAGLE-3, Li et al. 2025, reads lower layers too: the last one is shaped
        for the next token alone)."""
        if self.mid_in is None or self.norm_m is None or m is None:
            return h
        return h + self.mid_in(self.norm_m(m))

    def step(self, s: torch.Tensor, e: torch.Tensor, inplace: bool = False) -> torch.Tensor:
        """Next state from state ``s`` ``[n, H]`` and token embeddings ``e`` ``[n, H]``
        (``inplace``: as :func:`_block_step`, drafting only)."""
        for block in (self, *self.extra):
            s = _block_step(block, s, e, inplace=inplace)
        return s


def save_head(path: Path, net: DraftHeadNet, vocab: torch.Tensor, model_fingerprint: str, *,
              name: str, meta: dict[str, Any] | None = None) -> None:
    """Write a head file: fp16 weights, the reduced vocabulary ids, the target's
    fingerprint and name, and training metadata."""
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({
        "format": FORMAT, "kind": "structspec-draft-head", "name": name,
        "fingerprint": model_fingerprint, "hidden_size": net.hidden_size,
        "hidden_dim": net.hidden_dim, "blocks": net.blocks,
        "vocab": vocab.to(torch.int32).cpu(),
        # (a packed net's linears keep their weights under ``.original``)
        "state": {k.replace(".original.", "."): v.detach().to(torch.float16).cpu()
                  for k, v in net.state_dict().items()},
        "meta": dict(meta or {}),
    }, path)


class DraftHead:
    """A trained head bound to its target model, ready to draft.

    Attributes:
        name: the target's name recorded in the file (for messages and stats).
        vocab: ``[Vr]`` long: the reduced vocabulary (target token ids), ascending.
    """

    def __init__(self, net: DraftHeadNet, vocab: torch.Tensor, model: Any, *,
                 name: str = "draft-head", mid_layer: int | None = None) -> None:
        device = model.get_input_embeddings().weight.device
        self.name = name
        #: The decoder layer whose output the first state also reads (``None``: none).
        self.mid_layer = mid_layer if net.has_mid else None
        if self.mid_layer is not None and decoder_layer(model, self.mid_layer) is None:
            raise DraftHeadMismatchError(
                f"draft head {name!r} reads decoder layer {self.mid_layer}, which this model "
                f"does not have")
        self.net = net.float().to(device).eval()
        self.vocab = vocab.long().to(device)  # [Vr]
        #: The same ids as a list: the drafter maps a few dozen candidates a call, and a
        #: tensor index costs microseconds each.
        self.vocab_ids: list[int] = self.vocab.tolist()
        self.embedding = model.get_input_embeddings()
        from structspec.spec.fastlinear import (
            PackedLinear,
            available_kernels,
            pack_linears,
            replace_linears,
            rounded_int8,
        )

        head = model.get_output_embeddings()
        # (a packed output layer gives its rows without bringing a released original back)
        rows = (head.weight_rows(self.vocab) if isinstance(head, PackedLinear)
                else head.weight.detach()[self.vocab].float())  # [Vr, H]
        reduced = nn.Linear(rows.shape[1], len(self.vocab), bias=False).to(device)
        with torch.no_grad():
            reduced.weight.copy_(rows)
        #: The output rows over the reduced vocabulary (a ``PackedLinear`` where packed).
        self.reduced: nn.Module = reduced
        self._dtype = torch.float32

        # The output rows are the target's: where its output layer is exactly Q8_0 (the
        # default model's), they run on integer panels with 8-bit activations, as the
        # target's own output layer does — 1.25 bytes per weight instead of 2, and a
        # drafted level reads them from memory each time (every verification pass evicts
        # them); its numbers only rank drafts. Session 22: 2.2 -> 2.1 ms per prose draft.
        if "panel_int8" in available_kernels(approx=True) and device.type == "cpu":
            packed = PackedLinear(self.reduced, "panel_int8")
            if packed.int8:
                self.reduced = packed
            # The step's own layers, rounded to 8-bit blocks on the same integer kernel:
            # 1.06 bytes per weight instead of half panels' 2, for the same reason. Session
            # 38 (Xeon, one thread, right after a verification pass): a head step 0.54 ->
            # 0.31 ms, and the same passes within the wander (prose 1,146 -> 1,137, code
            # functions 10-39 612 -> 607, 40-99 1,291 -> 1,294; docs/performance.md).
            replace_linears(self.net, rounded_int8)
        holder = nn.ModuleDict({"net": self.net, "reduced": self.reduced})
        # The layers left (no integer kernel here, or an input width it does not take):
        # half-precision panels where they run — a drafted level's weights are evicted from
        # cache by every verification pass, and its numbers only rank drafts (its weights
        # are stored in fp16 anyway). Elsewhere the best lossless kernel, if any.
        half = "panel_f16" in available_kernels(lossy=True)
        pack_linears(holder, "panel_f16" if half else None)  # a no-op off CPU float32
        # Its panels are read right after each verification pass, which evicts them: from
        # huge pages, two cold levels 0.95x the time (session 54, one thread).
        from structspec.spec.heap import trim_heap
        from structspec.spec.hugepages import use_huge_pages

        use_huge_pages(holder)
        trim_heap()  # what packing and the move freed (structspec.spec.heap)
        self.reduced = holder["reduced"]
        #: Per step block, what :meth:`step`'s lean path reads (``None``: the modules' path).
        self._lean = self._lean_blocks()
        self._lean_logits = isinstance(self.reduced, PackedLinear) and self.reduced.int8
        # Where the native kernels run, a step and a level's choices are one call each
        # (structspec/_native/headstep.c: right after a verification pass every torch
        # operator's first call is cold, 15-40 us each).
        hs = _native.runnable("headstep") if device.type == "cpu" else None
        #: Per step block, headstep.step's arguments after the state's (``None``: torch's).
        self._native_blocks: list[tuple[Any, ...]] | None = None
        if hs is not None and self._lean is not None:
            hidden = self.net.hidden_size
            self._native_blocks = []
            for weights, eps, fc1, fc2 in self._lean:
                if fc1.in_features != 2 * hidden or fc2.out_features != hidden \
                        or fc2.in_features != fc1.out_features:
                    self._native_blocks = None
                    break
                p1, d, b1, sgn1, nar1 = fc1.native_args()
                p2, _, b2, sgn2, nar2 = fc2.native_args()
                self._native_blocks.append((weights.data_ptr(), eps, p1, d, b1, sgn1, nar1,
                                            p2, b2, sgn2, nar2))
        #: headstep.top's arguments after the states' (``None``: torch's ops).
        self._native_top: tuple[Any, ...] | None = None
        if hs is not None and self._lean_logits:
            panels, rows, _, sgn, nar = cast("PackedLinear", self.reduced).native_args()
            self._native_top = (panels, rows, sgn, nar)
        #: The native module (``None``: not built, or not runnable here).
        self._headstep: Any = hs

    def _lean_blocks(self) -> list[tuple[torch.Tensor, float, Any, Any]] | None:
        """``(norm weights [2, H], eps, fc1, fc2)`` per block where every block's inner
        layers run on integer panels and its two norms share an eps, else ``None``. Read
        once: a head drafts with the weights it was bound with."""
        from structspec.spec.fastlinear import PackedLinear

        out = []
        for block in (self.net, *self.net.extra):
            fc1, fc2 = block.fc1, block.fc2
            if not (isinstance(fc1, PackedLinear) and fc1.int8 and isinstance(fc2, PackedLinear)
                    and fc2.int8 and block.norm_s.eps == block.norm_e.eps):
                return None
            weights = torch.stack([block.norm_s.weight.detach(), block.norm_e.weight.detach()])
            out.append((weights.float().contiguous(), float(block.norm_s.eps), fc1, fc2))
        return out

    @classmethod
    def load(cls, path: str | Path, model: Any) -> DraftHead:
        """Load a head file for ``model``.

        Raises:
            DraftHeadMismatchError: the file is not a draft head, was trained for another
                model (fingerprint or sizes differ; the message names both), or its weights
                do not match the layout it declares.
            FileNotFoundError: no such file.
        """
        return cls._from_blob(_read_head_file(Path(path)), Path(path), model)

    @classmethod
    def _from_blob(cls, blob: dict[str, Any], path: Path, model: Any) -> DraftHead:
        """:meth:`load` of a file :func:`_read_head_file` has read."""
        mine = fingerprint(model)
        if blob["fingerprint"] != mine:
            raise DraftHeadMismatchError(
                f"draft head {path} was trained for model {blob.get('name')!r} (fingerprint "
                f"{blob['fingerprint']}), not this one (fingerprint {mine}); train one for it "
                f"with scripts/train_draft_head.py or set SpecConfig(draft_head=False)")
        hidden = int(model.get_input_embeddings().weight.shape[1])
        vocab = blob["vocab"].long()
        if blob["hidden_size"] != hidden or int(vocab.max()) >= model.get_input_embeddings(
                ).weight.shape[0]:
            raise DraftHeadMismatchError(f"draft head {path} does not fit this model's sizes")
        mid = "mid_in.weight" in blob["state"]
        blocks = blob.get("blocks", 1)
        if not isinstance(blocks, int) or blocks < 1:
            raise DraftHeadMismatchError(f"{path}: 'blocks' must be a positive integer, got "
                                         f"{blocks!r}")
        net = DraftHeadNet(blob["hidden_size"], blob["hidden_dim"], mid=mid, blocks=blocks)
        try:
            net.load_state_dict({k: v.float() for k, v in blob["state"].items()})
        except RuntimeError as exc:  # weights of another layout than the file declares
            raise DraftHeadMismatchError(f"{path}: its weights do not match its declared "
                                         f"layout ({blocks} block(s)): {exc}") from exc
        mid_layer = blob.get("meta", {}).get("mid_layer") if mid else None
        if mid and not isinstance(mid_layer, int):
            raise DraftHeadMismatchError(f"{path}: the head reads a middle layer but does "
                                         f"not say which")
        return cls(net, vocab, model, name=str(blob.get("name")), mid_layer=mid_layer)

    @_inference
    def start(self, h: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
        """The head's first state ``[n, H]`` from the target's last hidden states ``h``
        ``[n, H]`` and, for a head that reads one, the middle layer's outputs ``m``."""
        return self.net.start(h.float(), None if m is None else m.float())

    @_inference
    def step(self, s: torch.Tensor, tokens: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """Next states ``[n, H]`` after ``tokens`` (``[n]`` ids, a tensor or a list) from
        states ``s`` ``[n, H]``."""
        weight = self.embedding.weight
        if isinstance(tokens, torch.Tensor):
            e = weight[tokens]
        elif len(tokens) == 1:  # a view: no index tensor, no copy
            e = weight[tokens[0]:tokens[0] + 1]
        else:
            e = weight[list(tokens)]
        # No dtype conversion's dispatch where none is needed; the activation in place.
        if e.dtype != torch.float32:
            e = e.float()
        s = s.float()
        if self._lean is not None and s.device.type == "cpu":
            return self._lean_step(s.contiguous(), e)
        return self.net.step(s, e, inplace=True)

    def _lean_step(self, s: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """:meth:`DraftHeadNet.step` on the integer layers: one native call per block where
        headstep runs (its numbers to float rounding), else :meth:`_torch_step`'s."""
        blocks = self._native_blocks
        if blocks is None:
            return self._torch_step(s, e)
        hs, (n, hidden) = self._headstep, s.shape
        e = e.contiguous()
        threads = torch.get_num_threads()
        for wn, eps, p1, d, b1, sgn1, nar1, p2, b2, sgn2, nar2 in blocks:
            out = torch.empty(n, hidden, dtype=torch.float32)
            hs.step(s.data_ptr(), e.data_ptr(), n, hidden, wn, eps, p1, d, b1, sgn1, nar1, p2,
                    b2, sgn2, nar2, out.data_ptr(), threads)
            s = out
        return s

    def _torch_step(self, s: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        """:meth:`DraftHeadNet.step`'s numbers, bit for bit, in fewer operator calls: both
        norms in one (a norm without weight, times the two weights, is how torch's norm
        computes them), the integer layers without their module calls, the activation and
        the residual in place. A drafted level is a few steps of ~10 µs of arithmetic each,
        and the module path spent ~90 µs a step (two threads, Zen 4; this path ~45)."""
        hidden = s.shape[-1]
        for weights, eps, fc1, fc2 in self._lean or ():
            n = s.shape[0]
            z = torch.stack([s, e], 1)  # [n, 2, H]
            z = nn.functional.rms_norm(z, (hidden,), None, eps).mul_(weights).view(n, 2 * hidden)
            h = fc1.int8_rows(z)  # [n, D]
            nn.functional.silu(h, inplace=True)
            s = fc2.int8_rows(h).add_(s)  # [n, H]
        return s

    @_inference
    def logits(self, s: torch.Tensor) -> torch.Tensor:
        """Reduced-vocabulary logits ``[n, Vr]`` of states ``s`` ``[n, H]``."""
        s = s.float()
        if self._lean_logits and s.device.type == "cpu" and s.dim() == 2:
            return cast("PackedLinear", self.reduced).int8_rows(s.contiguous())
        return self.reduced.forward(s)

    @_inference
    def top(self, s: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
        """Each row of states ``s`` ``[n, H]``: its ``k`` likeliest reduced-vocabulary
        entries as log-probabilities, descending, and their indices into :attr:`vocab`
        (fewer where the reduced vocabulary has fewer). What a drafted level chooses from."""
        k = min(k, len(self.vocab_ids))
        native = self._native_top
        if native is not None and s.device.type == "cpu" and s.dim() == 2 and 0 < k <= 64:
            s = s.float().contiguous()
            panels, rows, sgn, nar = native
            vals, ids = self._headstep.top(s.data_ptr(), s.shape[0], s.shape[1], panels, rows,
                                           sgn, nar, k, torch.get_num_threads())
            return vals, ids
        best = torch.topk(torch.log_softmax(self.logits(s), -1), k)  # [n, k]
        return best.values.tolist(), best.indices.tolist()


_PACKAGED: dict[int, tuple[Any, DraftHead | None]] = {}


def _read_head_file(path: Path) -> dict[str, Any]:
    """The contents of a head file, checked to be one of this version's format.

    Raises:
        DraftHeadMismatchError: not a readable draft head file of this format.
        FileNotFoundError: no such file.
    """
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as exc:
        raise DraftHeadMismatchError(f"{path}: not a readable draft head file ({exc})"
                                     ) from exc
    return _checked_head(blob, path)


def _checked_head(blob: Any, path: Path) -> dict[str, Any]:
    """``blob``, a head file's contents, if it is a draft head of this version's format.

    Raises:
        DraftHeadMismatchError: it is not.
    """
    if not isinstance(blob, dict) or blob.get("kind") != "structspec-draft-head":
        raise DraftHeadMismatchError(f"{path}: not a structspec draft head file")
    if blob.get("format") != FORMAT:
        raise DraftHeadMismatchError(
            f"{path}: draft head format {blob.get('format')!r}, this version reads {FORMAT}")
    return blob


def per_model(memo: dict[int, tuple[Any, Any]], model: Any, compute: Callable[[], Any]) -> Any:
    """``compute()`` once per live model object, kept in ``memo`` (keyed by ``id`` with a
    weak reference, so a model freed and another allocated at its address is not
    mistaken for it)."""
    hit = memo.get(id(model))
    if hit is not None and hit[0]() is model:
        return hit[1]
    value = compute()
    memo[id(model)] = (weakref.ref(model), value)
    return value


def packaged_head(model: Any) -> DraftHead | None:
    """The head shipped in :data:`HEADS_DIR` whose fingerprint matches ``model``, loaded once
    per model object; ``None`` when none matches."""

    def find() -> DraftHead | None:
        mine = fingerprint(model)
        for path in sorted(HEADS_DIR.glob("*.pt")):
            try:
                blob = torch.load(path, map_location="cpu", weights_only=True)
            except Exception:  # an unreadable file is just not a match
                continue
            if isinstance(blob, dict) and blob.get("fingerprint") == mine:  # read once
                return DraftHead._from_blob(_checked_head(blob, path), path, model)
        return None

    return per_model(_PACKAGED, model, find)


def resolve_head(spec: Any, model: Any) -> DraftHead | None:
    """The head a :class:`~structspec.spec.config.SpecConfig` ``draft_head`` value asks for:
    ``"auto"`` → the packaged one if it matches (else ``None``); ``False``/``None`` → none; a
    path → that file (mismatch raises); a :class:`DraftHead` → itself.

    Raises:
        DraftHeadMismatchError: an explicit head does not fit ``model``.
    """
    if spec is None or spec is False:
        return None
    if isinstance(spec, DraftHead):
        if spec.embedding is not model.get_input_embeddings():
            raise DraftHeadMismatchError(f"draft head {spec.name!r} is bound to another model")
        return spec
    if spec == "auto" or spec is True:
        return packaged_head(model)
    return _head_file(Path(spec), model)


_FILES: dict[int, tuple[Any, dict[tuple[str, int, int], DraftHead]]] = {}
#: Head files kept loaded per model (the latest used).
_FILES_KEPT = 4


def _head_file(path: Path, model: Any) -> DraftHead:
    """The head file ``path`` loaded for ``model``, once per model object and version of the
    file (its resolved path, modification time and size): loading packs the head's layers
    (~0.1 s for the default model's), which a decode per request would otherwise pay every
    time. A file changed on disk is loaded again."""
    stat = path.stat()  # FileNotFoundError for a missing file, as DraftHead.load raises
    key = (str(path.resolve()), stat.st_mtime_ns, stat.st_size)
    loaded: dict[tuple[str, int, int], DraftHead] = per_model(_FILES, model, dict)
    head = loaded.pop(key, None)
    if head is None:
        head = DraftHead.load(path, model)
    loaded[key] = head  # the latest last
    while len(loaded) > _FILES_KEPT:
        del loaded[next(iter(loaded))]
    return head


def final_norm(model: Any) -> nn.Module | None:
    """The module whose output is the target's last hidden state (what ``lm_head`` reads),
    or ``None`` if the model has no recognisable one."""
    norm = getattr(base_model(model), "norm", None)
    return norm if isinstance(norm, nn.Module) else None


def decoder_layer(model: Any, index: int) -> nn.Module | None:
    """Decoder layer ``index`` of ``model`` (what a head's middle-layer input reads), or
    ``None`` if the model has no recognisable layer list or no such layer."""
    layers = getattr(base_model(model), "layers", None)
    if not isinstance(layers, nn.ModuleList) or not 0 <= index < len(layers):
        return None
    return layers[index]


@contextlib.contextmanager
def captured_outputs(module: nn.Module | None) -> Iterator[list[torch.Tensor]]:
    """A list that receives ``module``'s output at each forward call while the block runs
    (a forward hook, removed on exit; stays empty for ``None``). The decoders read the
    final norm's output this way: the rows the logits came from."""
    outputs: list[torch.Tensor] = []
    hook = None if module is None else module.register_forward_hook(
        lambda _module, _args, output: outputs.append(
            output[0] if isinstance(output, tuple) else output))  # (decoder layers: tuples)
    try:
        yield outputs
    finally:
        if hook is not None:
            hook.remove()


class DraftHeadDrafter:
    """Registered as ``"draft_head"``; reads ``ctx.draft_head`` and ``ctx.head_anchor``.

    ``ctx.head_anchor`` is ``(h, tokens)``: the target's hidden state ``[H]`` at a committed
    position and the committed tokens after it, the root last (usually just the bonus token;
    more after tokens committed without a pass). The head runs those tokens and the forced
    chain, then grows a dynamic tree below the frontier (EAGLE-2, Li et al. 2024): level by
    level, the ``draft_head_topk`` likeliest paths so far (by the product of the head's
    probabilities) are expanded by their ``draft_head_topk`` likeliest legal tokens, one
    batched head step per level, for at most ``draft_head_max_depth`` levels (side branches
    only in the first ``draft_head_branch_levels``); then the likeliest of all the expanded
    tokens are added, as many as the tree has room for, each scored with the head's
    probability of it (the cost plan reads the scores: the head's probabilities track its
    acceptance closely). Paths whose probability falls below ``draft_head_min_prob`` are
    neither drafted nor expanded, except at the first level, whose guesses cost no further
    head step: there the bound is ``draft_head_first_min_prob`` (default 0). On held-out
    answers, at equal node counts, this accepts 5-18% more tokens per pass than a greedy
    chain plus one side branch.

    The head's greedy chain is counted as ``draft_head``, the other nodes as
    ``draft_head_alt``. It stays silent when more than ``draft_head_max_feed`` tokens
    (committed without a pass, or forced) separate the frontier from the target's last
    hidden state. Not thread-safe.
    """

    name = SOURCE

    def propose(self, ctx: Any, builder: TreeBuilder, frontier: int) -> None:
        """Add the head's drafts below ``frontier``. Mutates ``builder`` only."""
        head: DraftHead | None = getattr(ctx, "draft_head", None)
        anchor = getattr(ctx, "head_anchor", None)
        # Node budget (a tree, not a chain: ``room`` would also cap it by the depth left).
        room = builder.max_nodes - builder.counted
        if head is None or anchor is None or room <= 0 or builder.room(frontier) <= 0:
            return
        opts = ctx.options

        def opt(name: str) -> float:
            return opts.get(name, OPTION_DEFAULTS[name])

        width = max(1, int(opt("draft_head_topk")))
        branch_levels = int(opt("draft_head_branch_levels"))
        min_prob = float(opt("draft_head_min_prob"))
        min_logp = math.log(min_prob) if min_prob > 0 else -math.inf
        first = float(opt("draft_head_first_min_prob"))
        first_logp = math.log(first) if first > 0 else -math.inf
        max_depth = min(builder.room(frontier), int(opt("draft_head_max_depth")))
        max_feed = int(opt("draft_head_max_feed"))
        chain = [frontier]
        while chain[-1] > 0:
            chain.append(builder.parents[chain[-1]])
        chain.reverse()
        h, tokens = anchor
        feed = list(tokens) + [builder.tokens[i] for i in chain[1:]]
        if len(feed) > max_feed:  # far from the target's last state: weak and slow drafts
            return
        s = h.reshape(1, -1)  # [1, H]
        vocab_ids = head.vocab_ids
        for tok in feed:
            s = head.step(s, [tok])  # [1, H]
        constraint = builder.constraint
        eos = builder.eos_ids
        # Candidates: (cumulative logp, depth, parent candidate or -1, token, logp, main,
        # constraint state after it). ``layer``: the candidates being expanded (-1: the
        # frontier), whose head states are the rows of ``states``, in order.
        cands: list[tuple[float, int, int, int, float, bool, Any]] = []
        layer: list[int] = [-1]
        states = s  # [m, H]
        floor = -math.inf  # the room-th best cumulative logp so far: deeper can only be less
        for level in range(max_depth):
            k = width if level < branch_levels else 1
            top_lp, top_idx = head.top(states, k + _SPARE)  # [m][<= k + spare] each
            new: list[int] = []
            for row, parent in enumerate(layer):
                pcum, pstate = ((0.0, builder.states[frontier]) if parent < 0
                                else (cands[parent][0], cands[parent][6]))
                main = parent < 0 or cands[parent][5]
                taken = 0
                for lp, idx in zip(top_lp[row], top_idx[row], strict=True):
                    if taken >= k:
                        break
                    cum = pcum + lp
                    if not math.isfinite(lp) or cum < max(first_logp if level == 0
                                                          else min_logp, floor):
                        break
                    tok = vocab_ids[idx]
                    # EOS and tokens the constraint refuses are skipped (the builder would
                    # refuse them too): the next candidate takes their place.
                    nxt = None if tok in eos else constraint.advance(pstate, tok)
                    if nxt is None:
                        continue
                    cands.append((cum, level + 1, parent, tok, lp, main and taken == 0, nxt))
                    new.append(len(cands) - 1)
                    taken += 1
            if len(cands) >= room:
                floor = sorted((c[0] for c in cands), reverse=True)[room - 1]
            new = sorted((c for c in new if cands[c][0] >= max(floor, min_logp)),
                         key=lambda c: -cands[c][0])[:width]
            if not new or level + 1 >= max_depth:
                break
            rows = [layer.index(cands[c][2]) for c in new]
            states = head.step(states[rows], [cands[c][3] for c in new])  # [m', H]
            layer = new
        # The likeliest candidates, parents before children (a child is never likelier).
        order = sorted(range(len(cands)), key=lambda c: (-cands[c][0], cands[c][1]))
        nodes: dict[int, int] = {-1: frontier}
        for c in order:
            if builder.counted >= builder.max_nodes:
                break
            _, _, parent, tok, lp, main, _ = cands[c]
            node = nodes.get(parent)
            if node is None:
                continue
            source = self.name if main else SOURCE_ALT
            if node == frontier or builder.num_children(node):
                child = builder.add_branch(node, [tok], source, score=math.exp(lp))
            else:
                child = builder.add(node, tok, source, score=math.exp(lp))
            if child is not None:
                nodes[c] = child


register_drafter(SOURCE, DraftHeadDrafter)
