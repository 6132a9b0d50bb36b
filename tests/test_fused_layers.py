"""Fused projections and norms (structspec/spec/fused_layers.py): bitwise the numbers of the
layers they stand for, in every pass size and call order, and undone cleanly."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import run_decode
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from structspec.engine import decode, free_text
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, speculative_decode
from structspec.spec.block_quant import dequantize, quantize_q4_1
from structspec.spec.cpu_paths import use_fast_cpu_paths
from structspec.spec.fastlinear import PackedLinear, available_kernels, unpack_linears
from structspec.spec.fused_layers import (
    FusedPart,
    fuse_layers,
    fuse_norms,
    fuse_projections,
    unfuse_layers,
)
from structspec.vocab import Vocabulary

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif("panel_int8" not in available_kernels(approx=True),
                       reason="the integer linear kernel does not run here"),
]


def _q4(linear: nn.Linear) -> None:
    """Round ``linear``'s weight to GGUF Q4_1 numbers (as the default model's body is)."""
    with torch.no_grad():
        w = dequantize(quantize_q4_1(linear.weight.detach().numpy()))
        linear.weight.copy_(torch.from_numpy(np.ascontiguousarray(w)))


@pytest.fixture(scope="module")
def q4_llama(smollm_tokenizer):
    """A tiny random Llama (hidden 64: a multiple of the 32-input blocks) whose every linear
    holds Q4_1 numbers, unpacked."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=len(smollm_tokenizer), hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=smollm_tokenizer.eos_token_id, bos_token_id=1)
    model = LlamaForCausalLM(config).eval()
    for module in model.modules():
        if isinstance(module, nn.Linear):
            _q4(module)
    with torch.no_grad():  # norms that are not all ones: their weights reach the output
        for module in model.modules():
            if type(module).__name__ == "LlamaRMSNorm":
                module.weight.uniform_(0.5, 1.5)
    return model


def _fast(model: nn.Module, fused: bool) -> nn.Module:
    out = use_fast_cpu_paths(copy.deepcopy(model))
    return out if fused else unfuse_layers(out)


def test_the_fast_paths_fuse_each_attentions_projections_and_every_norm(q4_llama):
    model = _fast(q4_llama, fused=True)
    attn = model.model.layers[0].self_attn
    assert all(isinstance(getattr(attn, n), FusedPart) for n in ("q_proj", "k_proj", "v_proj"))
    assert isinstance(attn.o_proj, PackedLinear)  # alone: nothing to fuse it with
    assert fuse_layers(model) == (2, 5)  # idempotent: 2 attentions, 2 x 2 norms + the final
    assert attn.q_proj.weight is attn.q_proj.own.original.weight
    unpack_linears(model)
    assert type(attn.q_proj) is nn.Linear
    assert not any("forward" in m.__dict__ for m in model.modules())
    assert not any(isinstance(m, (PackedLinear, FusedPart)) for m in model.modules())


@pytest.mark.parametrize("rows", [1, 2, 3, 9, 17, 40, 130])
def test_fused_layers_give_the_models_bits_in_every_pass_size(q4_llama, rows):
    fused, alone = _fast(q4_llama, True), _fast(q4_llama, False)
    ids = torch.arange(100, 100 + rows + 5).reshape(1, -1)
    with torch.inference_mode():
        for m in (fused, alone):  # a cached prefix, then the pass
            m._out = m(ids[:, :5], use_cache=True)
        a = fused(ids[:, 5:], cache=fused._out.past_key_values).logits
        b = alone(ids[:, 5:], cache=alone._out.past_key_values).logits
    assert torch.equal(a, b)


@pytest.mark.parametrize("words", ["the weather in Paris", "id is 42 and"])
def test_speculation_on_fused_layers_equals_plain_decoding_unfused(q4_llama, smollm_tokenizer,
                                                                   words):
    vocab = Vocabulary.from_tokenizer(smollm_tokenizer,
                                      eos_token_ids=frozenset({smollm_tokenizer.eos_token_id}))
    fused, alone = _fast(q4_llama, True), _fast(q4_llama, False)
    prompt = smollm_tokenizer.encode(words, add_special_tokens=False)
    greedy = SamplingParams()
    plain = run_decode(decode, alone, vocab, prompt, free_text(vocab), max_new_tokens=20,
                       sampling=greedy)
    spec = run_decode(speculative_decode, fused, vocab, prompt, free_text(vocab),
                      max_new_tokens=20, sampling=greedy, config=SpecConfig(max_nodes=8),
                      tokenizer=smollm_tokenizer)
    assert plain[:3] == spec[:3]


def _group_parts(seed: int) -> list[PackedLinear]:
    torch.manual_seed(seed)
    parts = []
    for n in (96, 32, 32):
        linear = nn.Linear(64, n, bias=seed % 2 == 1)
        _q4(linear)
        parts.append(PackedLinear(linear, "panel_int8"))
    return parts


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 3), calls=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2),
                                                         st.booleans()), min_size=1,
                                               max_size=12))
def test_a_part_returns_its_own_layers_bits_whatever_the_order_of_calls(seed, calls):
    """Parts called in any order, some twice, with inputs switched or changed in place in
    between: each call returns bitwise what the part's own layer gives for that input."""
    parts = _group_parts(seed)
    holder = nn.Module()
    holder.q_proj, holder.k_proj, holder.v_proj = parts
    assert fuse_projections(holder) == 1
    fused = [holder.q_proj, holder.k_proj, holder.v_proj]
    gen = torch.Generator().manual_seed(seed)
    inputs = [torch.randn(1, r, 64, generator=gen) for r in (1, 5, 17)]
    with torch.no_grad():
        for index, which, change in calls:
            x = inputs[which]
            if change:
                x.mul_(1.5)  # in place: a cached result for it is stale
            assert torch.equal(fused[index](x), parts[index](x))


def test_groups_that_cannot_give_the_same_bits_are_left_alone():
    holder = nn.Module()
    widths = nn.Module()
    parts = _group_parts(0)
    holder.q_proj, holder.k_proj = parts[:2]
    holder.v_proj = PackedLinear(nn.Linear(64, 32), "panel_int8")  # float numbers: no int8
    wide = nn.Linear(96, 32)
    _q4(wide)
    widths.q_proj, widths.k_proj, widths.v_proj = (*_group_parts(1)[:2],
                                                   PackedLinear(wide, "panel_int8"))
    assert fuse_projections(holder) == 0 and fuse_projections(widths) == 0
    assert type(holder.q_proj) is PackedLinear and type(widths.v_proj) is PackedLinear


def test_norms_of_other_classes_and_training_keep_their_own_forward(q4_llama):
    model = _fast(q4_llama, fused=True)
    norm = model.model.norm

    class OtherRMSNorm(nn.Module):  # same attributes, unknown class: not fused
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(64))
            self.variance_epsilon = 1e-6

        def forward(self, x):
            return x * 2

    other = OtherRMSNorm()
    assert fuse_norms(other) == 0 and "forward" not in other.__dict__
    x = torch.randn(3, 64, requires_grad=True)
    out = norm(x)  # autograd on: the module's own forward
    out.sum().backward()
    assert x.grad is not None
