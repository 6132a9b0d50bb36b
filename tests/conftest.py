"""Shared fixtures: toy vocabularies (no model), the real tokenizer, a tiny random model."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import ClassVar

import pytest

from structspec.vocab import Vocabulary

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(script: str):
    """The module ``benchmarks/<script>``, loaded from its file (the benchmarks' folder on
    ``sys.path`` meanwhile, for the scripts that import each other)."""
    import importlib.util
    import sys

    path = BENCHMARKS / script
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(f"{path.stem}_bench", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(path.parent))

# Thousands of schemas are compiled by the tests: keep them off the user's disk cache (the
# cache's own tests point it at a temporary directory).
os.environ.setdefault("STRUCTSPEC_COMPILE_CACHE", "off")

# Multi-byte tokens that cross JSON lexeme boundaries, as real BPE vocabularies have them.
JSON_PIECES = [
    '{"', '":', '",', '"}', '},', '},{', '}]', '[{', '":"', '","', 'true', 'false', 'null',
    'name', 'age', '":[', '"]', '00', '12', ' "', ': ', ', ',
]


def make_byte_vocab(extra: list[str] | None = None) -> Vocabulary:
    """EOS (id 0), then every single byte, then ``extra`` multi-byte tokens."""
    tokens: list[bytes] = [b""] + [bytes([b]) for b in range(256)]
    tokens += [p.encode() for p in (extra if extra is not None else JSON_PIECES)]
    return Vocabulary.from_tokens(tokens, eos_token_ids=[0])


@pytest.fixture(scope="session")
def byte_vocab() -> Vocabulary:
    """A byte-level toy vocabulary with JSON-ish multi-byte tokens; id 0 is EOS."""
    return make_byte_vocab()


@pytest.fixture(scope="session")
def smollm_tokenizer():
    """The tokenizer of the embedded default model (converted once into the user cache)."""
    from structspec.errors import ModelLoadError
    from structspec.models import load_tokenizer

    try:
        return load_tokenizer(None)
    except ModelLoadError as exc:
        pytest.skip(f"embedded default model unavailable: {exc}")


@pytest.fixture(scope="session")
def smollm_vocab(smollm_tokenizer) -> Vocabulary:
    """The default model's vocabulary."""
    return Vocabulary.from_tokenizer(smollm_tokenizer)


def tiny_llama(tokenizer, seed: int = 0, vocab_size: int | None = None):
    """A tiny randomly initialised Llama for ``tokenizer`` (weights from ``seed``)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size or len(tokenizer), hidden_size=32, intermediate_size=64,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=4096, tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id, bos_token_id=1,
    )
    return LlamaForCausalLM(config).eval()


def q4_llama(seed: int = 0, hidden: int = 64, vocab_size: int = 49152):
    """A tiny randomly initialised Llama whose body weights are exact Q4_1 numbers and whose
    output layer is exact Q8_0 (as the default model ships; widths multiples of 64), not yet
    packed: once packed (``use_fast_cpu_paths``), every pass runs the integer kernels and a
    prompt's rows the prompt panels, as the default model's do."""
    import numpy as np
    import torch
    from torch import nn
    from transformers import LlamaConfig, LlamaForCausalLM

    from structspec.spec.block_quant import dequantize, quantize_q4_1, quantize_q8_0

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=4096, tie_word_embeddings=True,
                         eos_token_id=2, bos_token_id=1)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, mod in model.named_modules():
            if type(mod) is nn.Linear:
                w = mod.weight.detach().numpy()
                q = quantize_q8_0(w) if name == "lm_head" else quantize_q4_1(w)
                mod.weight.copy_(torch.from_numpy(np.ascontiguousarray(dequantize(q))))
    return model


def random_draft_head(model, seed: int = 0, vocab_size: int = 4096,
                      mid_layer: int | None = None, blocks: int = 1, hidden_dim: int = 48):
    """A head with random weights over a random reduced vocabulary (ids of ``model``);
    with ``mid_layer``, one that also reads that decoder layer's output; ``blocks``
    residual blocks per step of inner width ``hidden_dim``."""
    import torch

    from structspec.spec.draft_head import DraftHead, DraftHeadNet

    g = torch.Generator().manual_seed(seed)
    hidden = model.config.hidden_size
    net = DraftHeadNet(hidden, hidden_dim, mid=mid_layer is not None, blocks=blocks)
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    n = model.get_input_embeddings().weight.shape[0]
    vocab = torch.randperm(n, generator=g)[:vocab_size].sort().values
    return DraftHead(net, vocab, model, name="tiny-random-head", mid_layer=mid_layer)


def random_tree(rng, n: int, vocab_size: int):
    """A random ``DraftTree`` of ``n`` nodes (each node's parent drawn among the nodes
    before it), tokens from ``100..vocab_size``; for tests of tree passes."""
    from structspec.spec.tree import DraftTree

    parents, depths = [-1], [0]
    for i in range(1, n):
        parents.append(rng.randrange(i))
        depths.append(depths[parents[-1]] + 1)
    tokens = tuple(rng.randrange(100, vocab_size) for _ in range(n))
    return DraftTree(tokens, tuple(parents), tuple(depths), (None,) * n, ("t",) * n)


def legal_prefix(constraint, tokenizer, prefix: str):
    """``(state, last token)`` after as much of ``prefix`` (tokenized) as ``constraint``
    accepts, from its initial state (the last token is that of ``"x"`` when none is)."""
    state, root = constraint.initial, tokenizer.encode("x", add_special_tokens=False)[0]
    for t in tokenizer.encode(prefix, add_special_tokens=False):
        nxt = constraint.advance(state, t)
        if nxt is None:
            break
        state, root = nxt, t
    return state, root


def run_decode(fn, *args, **kwargs):
    """(token ids, complete, error kind, output) of a decode, errors included: the kind is
    ``"limit"`` (token budget) or ``"dead"`` (no legal token), the output ``None`` then."""
    from structspec.errors import GenerationError

    try:
        out = fn(*args, **kwargs)
        return out.token_ids, out.complete, None, out
    except GenerationError as exc:
        kind = "limit" if "max_new_tokens" in str(exc) else "dead"
        return exc.token_ids, False, kind, None


def instance_prompt(tok, description: str, instance) -> list[int]:
    """A schema's description and one of its valid instances as prompt ids: text the lookup
    and values drafters can copy from, whatever a random target does with it."""
    text = (description or "") + ("" if instance is None else " " + json.dumps(instance))
    return tok.encode(text[:600] or "{", add_special_tokens=False)[:200]


def decode_both(model, vocab, tok, prompt, constraint, sampling, *, sparse_logits=True,
                max_new_tokens=24):
    """``(plain, speculative)``: :func:`run_decode` of plain and of speculative decoding for
    one prompt, both with or both without sparse logits."""
    from structspec.engine import decode
    from structspec.spec import SpecConfig, speculative_decode

    plain = run_decode(decode, model, vocab, prompt, constraint, max_new_tokens=max_new_tokens,
                       sampling=sampling, sparse_logits=sparse_logits)
    spec = run_decode(speculative_decode, model, vocab, prompt, constraint,
                      max_new_tokens=max_new_tokens, sampling=sampling, tokenizer=tok,
                      config=SpecConfig(sparse_logits=sparse_logits))
    return plain, spec


class _FixedDrafts:
    """Opens a branch for each token list of ``drafts`` at every step (see
    :func:`fixed_drafter`)."""

    name = "fixed_drafts_test"
    drafts: ClassVar[list[list[int]]] = []

    def propose(self, ctx, builder, frontier):
        for d in self.drafts:
            builder.add_branch(frontier, d, self.name)


def fixed_drafter(drafts: list[list[int]]) -> str:
    """The registry name of a drafter that opens one branch per token list of ``drafts``
    below every step's root (registered on first use; the lists replace the last call's)."""
    from structspec.spec.drafters import register_drafter

    _FixedDrafts.drafts = [list(d) for d in drafts]
    register_drafter(_FixedDrafts.name, _FixedDrafts)
    return _FixedDrafts.name


def exact_pairs(model, prompt: list[int], constraint, params, k: int = 3) -> dict:
    """``{(a, b): P(a) P(b | a)}`` for the ``k`` likeliest first tokens ``a`` after ``prompt``
    and each one's ``k`` likeliest followers ``b``: the target's exact distribution of
    two-token outputs under ``params`` (top-k sampling with ``k``) and the first state's
    mask of ``constraint`` (a constraint that allows the same tokens everywhere)."""
    import torch

    from structspec.masks import apply_mask, mask_to_bool
    from structspec.sampling import probabilities

    allowed = mask_to_bool(constraint.allowed(constraint.initial), model.config.vocab_size)

    def dist(seq):
        with torch.inference_mode():
            row = model(input_ids=torch.tensor([seq])).logits[0, -1]
        return probabilities(apply_mask(row, allowed), params)

    p1 = dist(prompt)
    exact = {}
    for a in torch.topk(p1, k).indices.tolist():
        p2 = dist([*prompt, a])
        for b in torch.topk(p2, k).indices.tolist():
            exact[(a, b)] = float(p1[a] * p2[b])
    return exact


def sampled_pairs_chi_square(model, vocab, tok, prompt: list[int], constraint, config,
                             exact: dict, n: int, temperature: float = 1.0, top_k: int = 3):
    """``(chi-square statistic, counts, the first run's stats)`` of ``n`` speculative
    two-token samples (seeds ``0..n-1``) against ``exact`` (:func:`exact_pairs`)."""
    from structspec.sampling import SamplingParams
    from structspec.spec import speculative_decode

    counts = dict.fromkeys(exact, 0)
    first = None
    for seed in range(n):
        out = speculative_decode(model, vocab, prompt, constraint, max_new_tokens=2,
                                 sampling=SamplingParams(temperature=temperature, top_k=top_k,
                                                         seed=seed),
                                 config=config, tokenizer=tok)
        counts[tuple(out.token_ids)] += 1
        first = first or out.stats
    stat = sum((counts[key] - n * p) ** 2 / (n * p) for key, p in exact.items())
    return stat, counts, first


def run_generate(gen, **kwargs):
    """``(text, token ids, complete)`` of ``gen.run(**kwargs)``, or the partial output (with
    ``complete`` False) when the token budget ran out."""
    from structspec.errors import GenerationError

    try:
        r = gen.run(**kwargs)
        return r.text, r.token_ids, True
    except GenerationError as exc:
        return exc.text, exc.token_ids, False


@pytest.fixture(scope="session")
def tiny_model(smollm_tokenizer):
    """A tiny randomly initialised Llama with the real tokenizer: fast, deterministic, no
    download. For tests that need a model's mechanics but not its quality."""
    from structspec.models import LoadedModel

    model = tiny_llama(smollm_tokenizer, seed=0)
    eos = frozenset({smollm_tokenizer.eos_token_id})
    return LoadedModel(model, smollm_tokenizer, "tiny-random", eos)


@pytest.fixture(scope="session")
def tiny_model_dir(tiny_model, tmp_path_factory):
    """The tiny random model saved as a local model directory: what a ``--model`` flag or
    another process (``structspec.replicas``) loads."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny_model.model.save_pretrained(path)
    tiny_model.tokenizer.save_pretrained(path)
    return path


def write_json_tasks(path: Path) -> Path:
    """Two small schema-constrained tasks in ``benchmarks/speculative.py``'s ``--data``
    format (a name of at most 8 characters and an integer age), written to ``path``."""
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer"}},
              "required": ["name", "age"]}
    path.write_text("".join(json.dumps({"id": f"t{i}", "prompt": p, "schema": schema}) + "\n"
                            for i, p in enumerate(["Ann is 31.", "Bo, 7 years old."])))
    return path


@contextlib.contextmanager
def torch_threads(count: int):
    """Run the block with ``count`` torch threads, then restore the number before."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(params=["avx2", "avx512"])
def kernel_isa(request):
    """Run the test with the panel kernels' AVX2 versions, then their AVX-512 ones (skipped
    where the CPU has no AVX-512F); the previous choice is restored afterwards."""
    from structspec.spec.fastlinear import avx512, use_avx512

    if request.param == "avx512":
        before = use_avx512(True)
        if not avx512():
            use_avx512(before)
            pytest.skip("this CPU has no AVX-512F")
    else:
        before = use_avx512(False)
    try:
        yield request.param
    finally:
        use_avx512(before)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny matmuls run faster on one thread than two (and the CI box is shared)."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data`` beside the checkout; skips when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"external test data not found at {SHARED_DATA}")
    return SHARED_DATA


SUITE = SHARED_DATA / "json-schema-test-suite" / "tests" / "draft2020-12"
MASKBENCH = SHARED_DATA / "maskbench" / "maskbench_dev.jsonl.gz"


def suite_groups() -> list[tuple[str, dict]]:
    """``(name, group)`` for every test group of the JSON-Schema-Test-Suite (draft 2020-12):
    ``group["schema"]`` and its ``tests`` (``data``, ``valid``). Skips the test without it."""
    if not SUITE.is_dir():
        pytest.skip(f"JSON-Schema-Test-Suite not found at {SUITE} (see ../shared/data/README.md)")
    return [(f"{path.name}#{i} {group['description']}", group)
            for path in sorted(SUITE.glob("*.json"))
            for i, group in enumerate(json.loads(path.read_text()))]


def maskbench_rows(stride: int, start: int = 0) -> list[dict]:
    """Every ``stride``-th MaskBench row from ``start`` (``id``, ``description``, ``schema``,
    ``tests``): a fixed sample of a file sorted by source. Skips the test without it."""
    import gzip

    if not MASKBENCH.is_file():
        pytest.skip(f"MaskBench not found at {MASKBENCH} (see ../shared/data/README.md)")
    with gzip.open(MASKBENCH, "rt") as f:
        return [json.loads(line) for n, line in enumerate(f) if n % stride == start]


def humaneval_programs(shared_data: Path, n: int) -> list[str]:
    """The first ``n`` distinct HumanEval single-line infilling programs (prompt + canonical
    solution + suffix), as real Python for the grammar tests."""
    out: list[str] = []
    path = shared_data / "code" / "HumanEval-SingleLineInfilling.jsonl"
    for line in path.read_text().splitlines():
        task = json.loads(line)
        text = task["prompt"] + task["canonical_solution"] + task["suffix"]
        if text not in out:
            out.append(text)
        if len(out) == n:
            break
    return out


def pytest_configure(config):
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def fixed_cost_curve(monkeypatch):
    """Speculation sizes its trees from a pass-time curve measured on the device; measured on
    a loaded CI machine it changes from run to run, and tree shapes and pass counts with it.
    Tests use one fixed curve of the usual CPU shape (the measurement's own tests call
    ``measure_cost_curve`` directly)."""
    from structspec.spec import cost

    curve = cost.CostCurve((1, 2, 4, 8, 16, 32), (1.0, 1.05, 1.1, 1.2, 1.6, 2.6))
    monkeypatch.setattr(cost, "measure_cost_curve", lambda model, **kw: curve)


def run_node(script: str, rows: list, *flags: str, why: str = "to judge JavaScript") -> list:
    """Run ``script`` with node (``flags`` before ``-e``), ``rows`` as JSON on its stdin;
    its stdout parsed as JSON. Skips the test without node on the PATH."""
    node = shutil.which("node")
    if node is None:
        pytest.skip(f"no node on the PATH {why}")
    out = subprocess.run([node, *flags, "-e", script], input=json.dumps(rows), text=True,
                         capture_output=True, check=True)
    return json.loads(out.stdout)
