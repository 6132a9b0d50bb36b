"""The corpus drafter: n-gram index against brute force, drafts that occur in the corpus,
files, mismatches, and speculative greedy == plain greedy with a corpus in use."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import legal_prefix, run_decode
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from structspec.automata.regex import compile_regex
from structspec.engine import decode, free_text
from structspec.sampling import SamplingParams
from structspec.spec import SpecConfig, speculative_decode
from structspec.spec.canonical import CanonicalTokenizer
from structspec.spec.corpus import (
    CorpusDrafter,
    CorpusMismatchError,
    TokenCorpus,
    _frequent_paths,
    resolve_corpus,
)
from structspec.spec.cost import CostCurve
from structspec.spec.draft_context import DraftContext
from structspec.spec.ngram import NgramIndex
from structspec.spec.tree import TreeBuilder
from structspec.vocab import Vocabulary

pytestmark = pytest.mark.usefixtures("one_thread")

GREEDY = SamplingParams()
FLAT = CostCurve((1, 64), (1.0, 1.0))  # every tree size costs the same: nothing is pruned

sequences = st.lists(st.lists(st.integers(0, 5), max_size=30), min_size=1, max_size=6)


def _occurrences(seqs: list[list[int]], gram: list[int]) -> list[tuple[int, int]]:
    """(sequence, index after) of every occurrence of ``gram``, by brute force."""
    n = len(gram)
    return [(i, j + n) for i, s in enumerate(seqs) for j in range(len(s) - n + 1)
            if s[j:j + n] == gram]


@settings(max_examples=150, deadline=None)
@given(seqs=sequences, gram=st.lists(st.integers(0, 5), min_size=1, max_size=4))
def test_the_index_finds_exactly_the_occurrences_brute_force_finds(seqs, gram):
    corpus = TokenCorpus(seqs, max_n=4)
    starts = np.cumsum([0] + [len(s) + 1 for s in seqs])  # each sequence, then a separator
    expected = sorted(int(starts[i]) + j for i, j in _occurrences(seqs, gram))
    assert corpus._ends(gram).tolist() == expected


@settings(max_examples=150, deadline=None)
@given(seqs=sequences, context=st.lists(st.integers(0, 5), min_size=1, max_size=8),
       length=st.integers(1, 6), branches=st.integers(1, 3),
       share=st.sampled_from([0.0, 0.3, 0.6]))
def test_every_draft_continues_an_occurrence_of_the_longest_matching_suffix(
        seqs, context, length, branches, share):
    corpus = TokenCorpus(seqs, max_n=3)
    drafts = corpus.continuations(context, length, branches=branches, min_share=share)
    longest = next((n for n in range(min(3, len(context)), 0, -1)
                    if _occurrences(seqs, context[-n:])), 0)
    if not longest:
        assert drafts == []
        return
    follows = [seqs[i][j:j + length] for i, j in _occurrences(seqs, context[-longest:])]
    assert drafts or not any(follows)  # something follows some occurrence: a draft
    assert len(drafts) <= branches
    assert len({d[0] for d in drafts}) == len(drafts)  # branches start differently
    for draft in drafts:
        assert 1 <= len(draft) <= length
        assert any(f[:len(draft)] == draft for f in follows)  # no draft crosses a separator


def test_drafts_follow_the_most_common_continuation_while_enough_agree():
    seqs = [[1, 2, 3, 4]] * 3 + [[1, 2, 3, 5]] * 2 + [[1, 2, 9]]
    corpus = TokenCorpus(seqs, max_n=2)
    assert corpus.continuations([7, 1, 2], 3) == [[3, 4]]  # 5 of 6 say 3, then 3 of 5 say 4
    assert corpus.continuations([1, 2], 3, min_share=0.7) == [[3]]  # 3 of 5 < 0.7
    assert corpus.continuations([1, 2], 3, branches=2, min_share=0.1) == [[3, 4], [9]]
    assert corpus.continuations([8, 8], 3) == []  # no suffix matches
    assert corpus.continuations([1, 2], 0) == []
    assert TokenCorpus([]).continuations([1], 3) == []


def test_frequent_paths_stop_at_separators():
    rows = np.array([[4, -1, 7], [4, -1, 7], [5, 6, 7]])
    assert _frequent_paths(rows, 2, 0.0) == [[4], [5, 6, 7]]


def test_a_corpus_file_round_trips_and_bad_files_are_refused(tmp_path):
    corpus = TokenCorpus([[1, 2, 3], [70000, 2]], max_n=3, vocab_fingerprint="v",
                         meta={"answers": 2})
    path = tmp_path / "c.npz"
    corpus.save(path)
    back = TokenCorpus.load(path)
    assert back.tokens.tolist() == corpus.tokens.tolist()  # int32 storage: ids above 65535
    assert (back.max_n, back.vocab_fingerprint, back.meta) == (3, "v", {"answers": 2})
    small = TokenCorpus([[1, 2, 3], [4]])
    small.save(path)  # uint16 storage
    assert TokenCorpus.load(path).tokens.tolist() == small.tokens.tolist()
    assert len(small) == 4 and small.num_sequences == 2
    (tmp_path / "junk.npz").write_bytes(b"not a corpus")
    with pytest.raises(CorpusMismatchError, match="not a readable corpus"):
        TokenCorpus.load(tmp_path / "junk.npz")
    np.savez(tmp_path / "other.npz", tokens=np.zeros(3), header=np.array("{}"))
    with pytest.raises(CorpusMismatchError, match="not a structspec corpus"):
        TokenCorpus.load(tmp_path / "other.npz")
    with pytest.raises(FileNotFoundError):
        TokenCorpus.load(tmp_path / "missing.npz")
    with pytest.raises(ValueError, match="non-negative"):
        TokenCorpus([[1, -3]])
    with pytest.raises(ValueError, match="max_n"):
        TokenCorpus([[1]], max_n=0)


# -- with a model ---------------------------------------------------------------------------

PATTERNS = {
    "tag": r'\{"id":[0-9]{1,3},"tag":"(red|green|blue)","ok":(true|false)\}',
    "words": r"( ?[a-z]{1,8}){1,12}\.",
}
WORDS = ["weather", "in", "Paris", "for", "3", "days", "red", "the", "id", "is", "42", "hello",
         "{", '"name"', ":", "blue", "tag", ","]


@pytest.fixture(scope="module")
def tiny(tiny_model):
    model, tok = tiny_model.model, tiny_model.tokenizer
    vocab = Vocabulary.from_tokenizer(tok, eos_token_ids=tiny_model.eos_token_ids)
    constraints = {k: compile_regex(v, vocab) for k, v in PATTERNS.items()}
    constraints["free"] = free_text(vocab)
    # The corpus: the model's own greedy answers to a few prompts (so its drafts get
    # accepted), and some random text.
    answers = []
    for words in (WORDS[:6], WORDS[6:12], WORDS[12:]):
        prompt = tok.encode(" ".join(words), add_special_tokens=False)
        answers.append(run_decode(decode, model, vocab, prompt, constraints["free"],
                                  max_new_tokens=40, sampling=GREEDY)[0])
    rng = np.random.default_rng(0)
    answers += [rng.integers(0, len(vocab), 50).tolist() for _ in range(3)]
    corpus = TokenCorpus(answers, max_n=4, vocab_fingerprint=vocab.fingerprint)
    return model, tok, vocab, constraints, corpus


@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=10),
       name=st.sampled_from(sorted([*PATTERNS, "free"])), max_new=st.integers(1, 40),
       only=st.booleans(), branches=st.integers(1, 3))
def test_greedy_with_a_corpus_equals_plain_greedy(tiny, words, name, max_new, only, branches):
    model, tok, vocab, constraints, corpus = tiny
    prompt = tok.encode(" ".join(words), add_special_tokens=False)
    c = constraints[name]
    plain = run_decode(decode, model, vocab, prompt, c, max_new_tokens=max_new, sampling=GREEDY)
    cfg = SpecConfig(corpus=corpus, corpus_branches=branches, window=2, cost_curve=FLAT,
                     drafters=("corpus",) if only else SpecConfig().drafters)
    spec = run_decode(speculative_decode, model, vocab, prompt, c, max_new_tokens=max_new,
                      sampling=GREEDY, config=cfg, tokenizer=tok)
    assert spec[:3] == plain[:3]


def test_the_corpus_drafts_the_models_own_answers_and_they_are_accepted(tiny):
    model, tok, vocab, constraints, corpus = tiny
    prompt = tok.encode(" ".join(WORDS[:6]), add_special_tokens=False)  # answered in corpus
    cfg = SpecConfig(corpus=corpus, drafters=("corpus",), cost_curve=FLAT, adaptive=False,
                     draft_head=False)
    out = speculative_decode(model, vocab, prompt, constraints["free"], max_new_tokens=40,
                             sampling=GREEDY, config=cfg, tokenizer=tok)
    _proposed, accepted = out.stats.per_drafter["corpus"]
    assert accepted > 0 and out.stats.tokens_per_pass > 1.5
    off = speculative_decode(model, vocab, prompt, constraints["free"], max_new_tokens=40,
                             sampling=GREEDY, tokenizer=tok,
                             config=SpecConfig(corpus=False, draft_head=False, cost_curve=FLAT))
    assert "corpus" not in off.stats.per_drafter
    assert off.token_ids == out.token_ids


@settings(max_examples=20, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(prefix=st.text(alphabet='{}"abcdeirgtnl:0123456789,', max_size=12),
       name=st.sampled_from(sorted(PATTERNS)), branches=st.integers(1, 4))
def test_the_corpus_drafter_never_proposes_illegal_nodes(tiny, prefix, name, branches):
    _model, tok, vocab, constraints, corpus = tiny
    c = constraints[name]
    state, root = legal_prefix(c, tok, prefix)
    if not c.allowed(state).count():
        return
    ctx = DraftContext(constraint=c, vocab=vocab, canon=CanonicalTokenizer(tok, vocab),
                       history=NgramIndex(3), prompt_len=1,
                       options={"corpus_branches": branches, "corpus_min_share": 0.0})
    ctx.history.extend([root])
    ctx.corpus = corpus
    builder = TreeBuilder(c, root, state, max_depth=8, max_nodes=16, max_branches=6,
                          eos_ids=frozenset(vocab.eos_token_ids))
    CorpusDrafter().propose(ctx, builder, 0)
    tree = builder.freeze()
    for i in range(1, len(tree)):
        assert bool(c.allowed(tree.states[tree.parents[i]]).to_bool()[tree.tokens[i]])
        assert tree.tokens[i] not in vocab.eos_token_ids


def test_resolving_a_corpus(tiny, tmp_path):
    _model, tok, vocab, _constraints, corpus = tiny
    assert resolve_corpus(False, vocab) is None
    assert resolve_corpus(None, vocab) is None
    assert resolve_corpus(corpus, vocab) is corpus
    path = tmp_path / "c.npz"
    corpus.save(path)
    assert resolve_corpus(str(path), vocab).tokens.tolist() == corpus.tokens.tolist()
    read = SpecConfig(corpus=str(path)).corpus  # a path is read once, with the config
    assert isinstance(read, TokenCorpus) and read.tokens.tolist() == corpus.tokens.tolist()
    with pytest.raises(FileNotFoundError):
        SpecConfig(corpus=str(tmp_path / "missing.npz"))
    texts = TokenCorpus.from_texts(["the id is 42", "hello"], tok, vocab)
    assert texts.vocab_fingerprint == vocab.fingerprint and texts.num_sequences == 2
    assert resolve_corpus(texts, vocab) is texts
    other = TokenCorpus([[1, 2]], vocab_fingerprint="not-this-vocabulary")
    with pytest.raises(CorpusMismatchError, match="another vocabulary|vocabulary"):
        resolve_corpus(other, vocab)
    beyond = TokenCorpus([[len(vocab) + 5]])
    with pytest.raises(CorpusMismatchError, match="beyond this vocabulary"):
        resolve_corpus(beyond, vocab)
    with pytest.raises(ValueError, match="corpus must be"):
        SpecConfig(corpus=3)
    with pytest.raises(ValueError, match="corpus_min_share"):
        SpecConfig(corpus_min_share=1.5)
