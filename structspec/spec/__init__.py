"""Speculative decoding with grammar-aware draft trees (torch side).

- :mod:`~structspec.spec.tree`: :class:`DraftTree`, tree attention mask and positions;
- :mod:`~structspec.spec.verify`: one forward pass over a tree, KV-cache compaction;
- :mod:`~structspec.spec.accept`: greedy and seeded sampled acceptance (both plain decoding's
  tokens), multi-draft rejection for sampled drafts, typical acceptance;
- :mod:`~structspec.spec.drafters`: the drafters (alternatives, lookup, values, closers, ...)
  and :func:`~structspec.spec.drafters.build_tree`; what they see,
  :mod:`~structspec.spec.draft_context`; the forced chain, :mod:`~structspec.spec.forced`;
  their tables: :mod:`~structspec.spec.canonical` (tokenization in context),
  :mod:`~structspec.spec.ngram` (n-gram index), :mod:`~structspec.spec.literals` (the
  request's values);
- :mod:`~structspec.spec.draft_model`: a small model with the same tokenizer as a drafter;
- :mod:`~structspec.spec.schedule`: adaptive speculation budget;
- :mod:`~structspec.spec.cost`: the device cost curve and tree sizing by expected tokens/s;
- :mod:`~structspec.spec.decode`: :func:`speculative_decode`, the loop; its settings
  :class:`SpecConfig` (:mod:`~structspec.spec.config`) and statistics :class:`SpecStats`
  (:mod:`~structspec.spec.stats`);
- :mod:`~structspec.spec.totals`: :class:`StatsTotals`, the statistics of many requests;
- :mod:`~structspec.spec.fastlinear`: packed linears (our AVX2 panel kernel, or oneDNN) that
  make multi-row passes cheap on CPU;
- :mod:`~structspec.spec.prompt_rows`: a prompt's rows prefilled on coarser integer blocks
  (both decoders, the prompt's rows only: a faster prefill, speculation still lossless);
- :mod:`~structspec.spec.block_quant`: the exact block quantization of weights dequantized
  from GGUF (the default model's), which the panel kernel reads at a third of the bytes;
- :mod:`~structspec.spec.sparse_logits`: logits only for the tokens a row's state allows,
  where they are few (bitwise the whole rows'), in plain and speculative passes;
- :mod:`~structspec.spec.attention`: grouped-query SDPA under tree masks on CPU;
- :mod:`~structspec.spec.hugepages`: the packed panels in one huge-page arena (Linux);
- :mod:`~structspec.spec.heap`: packing's freed heap handed back, file-backed memory told apart;
- :mod:`~structspec.spec.cpu_paths`: all of these, in one call (:func:`use_fast_cpu_paths`);
- :mod:`~structspec.spec.kv_cache`: a key-value cache that grows in place (CPU decodes).
"""

from __future__ import annotations

from structspec.spec.config import SpecConfig
from structspec.spec.cost import CostCurve
from structspec.spec.cpu_paths import use_fast_cpu_paths
from structspec.spec.decode import speculative_decode
from structspec.spec.draft_model import DraftModel, DraftModelMismatchError
from structspec.spec.fastlinear import pack_linears, packing_available, unpack_linears
from structspec.spec.stats import SpecStats
from structspec.spec.totals import StatsTotals
from structspec.spec.tree import DraftTree, TreeBuilder, tree_attention
from structspec.spec.verify import UnsupportedModelError, keep_path, verify_tree

__all__ = [
    "CostCurve",
    "DraftModel",
    "DraftModelMismatchError",
    "DraftTree",
    "SpecConfig",
    "SpecStats",
    "StatsTotals",
    "TreeBuilder",
    "UnsupportedModelError",
    "keep_path",
    "pack_linears",
    "packing_available",
    "speculative_decode",
    "tree_attention",
    "unpack_linears",
    "use_fast_cpu_paths",
    "verify_tree",
]
