"""Speculative decoding with grammar-aware draft trees (torch side).

- :mod:`~structspec.spec.tree`: :class:`DraftTree`, tree attention mask and positions;
- :mod:`~structspec.spec.verify`: one forward pass over a tree, KV-cache compaction;
- :mod:`~structspec.spec.accept`: greedy, lossless multi-draft rejection, typical acceptance;
- :mod:`~structspec.spec.drafters`: forced / alternatives / lookup / values / top-k drafters;
- :mod:`~structspec.spec.draft_model`: a small model with the same tokenizer as a drafter;
- :mod:`~structspec.spec.schedule`: adaptive speculation budget;
- :mod:`~structspec.spec.cost`: the device cost curve and tree sizing by expected tokens/s;
- :mod:`~structspec.spec.decode`: :func:`speculative_decode` and :class:`SpecConfig`;
- :mod:`~structspec.spec.fastlinear`: packed oneDNN linears that make multi-row passes cheap
  on CPU.
"""

from __future__ import annotations

from structspec.spec.cost import CostCurve
from structspec.spec.decode import SpecConfig, SpecStats, speculative_decode
from structspec.spec.draft_model import DraftModel, DraftModelMismatchError
from structspec.spec.fastlinear import pack_linears, packing_available, unpack_linears
from structspec.spec.tree import DraftTree, TreeBuilder, tree_attention
from structspec.spec.verify import UnsupportedModelError, keep_path, verify_tree

__all__ = [
    "CostCurve",
    "DraftModel",
    "DraftModelMismatchError",
    "DraftTree",
    "SpecConfig",
    "SpecStats",
    "TreeBuilder",
    "UnsupportedModelError",
    "keep_path",
    "pack_linears",
    "packing_available",
    "speculative_decode",
    "tree_attention",
    "unpack_linears",
    "verify_tree",
]
