"""Train the learned draft head of the default model by self-distillation, on CPU.

The draft head (:mod:`structspec.spec.draft_head`) predicts the target's next tokens from
the target's last hidden state and the embedding of the token just chosen, recurrently
(ReDrafter, Cheng et al. 2024; EAGLE, Li et al. 2024, without the attention layer). It is
trained to imitate the *target model itself*:

1. ``data``: the target writes greedy answers to many prompts made from templates × topics
   written here (prose mostly, some code and JSON; none of them a benchmark prompt — the
   benchmark's prose prompts are checked to be absent); then one teacher-forced pass over
   prompt + answer stores, per position, the target's final-norm hidden state (fp16) and
   its argmax. Shards go to ``--work`` as they are made, so a partial run is usable.
2. ``train``: a reduced output vocabulary (the ``--vocab-size`` most frequent target
   tokens in the data, as in FR-Spec; their rows of the target's tied embedding / lm_head
   are used, not stored), then the head is unrolled ``--unroll`` steps from each position
   with teacher-forced input tokens; loss = soft cross-entropy against the target's own
   distribution over the reduced vocabulary at each step (computed from the stored hidden
   states) + a small feature-regression term. Writes fp16 weights, the reduced vocabulary,
   and the target's fingerprint to ``structspec/spec/heads/<model>.pt``.

Reproducible: fixed seeds, one torch thread, prompts in order. Roughly (1 thread, this CPU):
data 25 min for ~700 answers, training 25 min. Run under ``nice``:

    nice -n 10 .venv/bin/python scripts/train_draft_head.py all [--prompts 700] [--steps 6000]
    nice -n 10 .venv/bin/python scripts/train_draft_head.py data --prompts 700
    nice -n 10 .venv/bin/python scripts/train_draft_head.py train --steps 6000
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

SEED = 1234

# -- prompts: templates × topics (disjoint from benchmarks/speculative.py's prose prompts) --

PROSE_TEMPLATES = [
    "Write a short paragraph about {t}.",
    "Explain {t} to a ten-year-old.",
    "What are the main advantages and disadvantages of {t}?",
    "Give me three interesting facts about {t}.",
    "Describe {t} in a few sentences.",
    "Write a brief introduction to {t} for a school report.",
    "Why do people care about {t}?",
    "Summarize what you know about {t}.",
    "Write a short story that involves {t}.",
    "How has {t} changed over the last hundred years?",
    "List some common misconceptions about {t}.",
    "Write a persuasive paragraph in favour of {t}.",
    "What should a beginner know about {t}?",
    "Compare {t} with something similar and explain the differences.",
    "Write a friendly email to a colleague about {t}.",
    "Give some practical tips related to {t}.",
    "What is the future of {t}?",
    "Write a haiku and then a short explanation about {t}.",
    "Describe a typical day for someone who works with {t}.",
    "What are the environmental effects of {t}?",
]
PROSE_TOPICS = [
    "volcanoes", "the printing press", "honey bees", "solar panels", "the Roman Empire",
    "coffee", "chess", "rainforests", "electric cars", "the human heart", "jazz music",
    "public libraries", "the moon landing", "recycling", "photosynthesis", "social media",
    "ancient Egypt", "earthquakes", "vaccines", "the internet", "dinosaurs", "gardening",
    "the Olympic Games", "renewable energy", "sleep", "mountains", "the ocean tides",
    "artificial intelligence", "bread baking", "whales", "democracy", "the stock market",
    "video games", "the water cycle", "castles", "trains", "meditation", "birds migrating",
    "the Great Wall of China", "cheese making", "deserts", "antibiotics", "robots",
    "remote work", "the piano", "glaciers", "tea", "bridges", "comets", "the French Revolution",
    "friendship", "urban parks", "cats", "dogs", "spiders", "climate change", "photography",
    "the telephone", "penguins", "wind turbines", "chocolate", "museums", "marathons",
    "the immune system", "the alphabet", "lighthouses", "space telescopes", "forests in winter",
    "street food", "origami", "the Silk Road", "paper money", "submarines", "rice farming",
    "the violin", "hurricanes", "kindness", "time management", "board games", "coral reefs",
]
CODE_TEMPLATES = [
    "Write a Python function that {t}.",
    "Write a Python function that {t}, with a docstring.",
    "Show a short Python example that {t}.",
]
CODE_TOPICS = [
    "reverses a string", "checks whether a number is prime", "computes the factorial of n",
    "finds the largest element of a list", "removes duplicates from a list while keeping order",
    "counts the vowels in a string", "converts Celsius to Fahrenheit",
    "returns the sum of the digits of an integer", "flattens a nested list",
    "sorts a list of dictionaries by a key", "reads a CSV file and prints each row",
    "computes the average of a list of numbers", "checks whether two strings are anagrams",
    "returns the greatest common divisor of two numbers", "generates the first n primes",
    "capitalizes every word in a sentence", "finds the second smallest number in a list",
    "computes the power set of a list", "counts word frequencies in a text",
    "implements binary search on a sorted list", "validates an email address with a regex",
    "transposes a matrix", "returns the longest word in a sentence",
    "converts a Roman numeral to an integer", "merges two dictionaries",
]
JSON_TEMPLATES = [
    "Return a JSON object describing {t} with a name, a short description and three tags.",
    "Give me a JSON list of three facts about {t}, each with a 'fact' and a 'source' field.",
]


def build_prompts(n: int, seed: int = SEED) -> list[str]:
    """``n`` training prompts (about 80% prose, 12% code, 8% JSON), deterministic, none of
    them a benchmark prose prompt."""
    prose = [t.format(t=x) for t, x in itertools.product(PROSE_TEMPLATES, PROSE_TOPICS)]
    code = [t.format(t=x) for t, x in itertools.product(CODE_TEMPLATES, CODE_TOPICS)]
    js = [t.format(t=x) for t, x in itertools.product(JSON_TEMPLATES, PROSE_TOPICS)]
    rng = random.Random(seed)
    for pool in (prose, code, js):
        rng.shuffle(pool)
    n_code, n_json = int(n * 0.12), int(n * 0.08)
    out = prose[:n - n_code - n_json] + code[:n_code] + js[:n_json]
    rng.shuffle(out)
    banned = set(benchmark_prose())
    clash = banned.intersection(out)
    if clash:
        raise SystemExit(f"training prompts overlap the benchmark's: {sorted(clash)[:3]}")
    return out


def benchmark_prose() -> list[str]:
    """The benchmark's prose prompts (``benchmarks/speculative.py``: ``PROSE``), which
    training must not see."""
    import ast

    tree = ast.parse((ROOT / "benchmarks" / "speculative.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PROSE"
                                                for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise SystemExit("benchmarks/speculative.py defines no PROSE list")


# -- data ------------------------------------------------------------------------------------


def _load(pack: bool = True):
    from structspec.api import Generator
    from structspec.spec.fastlinear import pack_linears, packing_available

    gen = Generator(None, pack=False)
    if pack and packing_available(gen.loaded.model):
        pack_linears(gen.loaded.model)
    return gen


@torch.inference_mode()
def make_data(work: Path, n_prompts: int, batch: int, max_new: int) -> None:
    """Greedy answers + teacher-forced hidden states / argmax, in shards under ``work``."""
    gen = _load()
    model, tok = gen.loaded.model, gen.loaded.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = sorted(gen.loaded.eos_token_ids)
    prompts = build_prompts(n_prompts)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    total = 0
    for b, start in enumerate(range(0, len(prompts), batch)):
        shard = work / f"shard_{b:04d}.pt"
        if shard.exists():
            continue
        group = [gen.prompt_ids(p) for p in prompts[start:start + batch]]
        width = max(len(g) for g in group)
        ids = torch.tensor([[pad] * (width - len(g)) + g for g in group])  # [B, P] left-padded
        att = torch.tensor([[0] * (width - len(g)) + [1] * len(g) for g in group])
        out = model.generate(ids, attention_mask=att, max_new_tokens=max_new, do_sample=False,
                             pad_token_id=pad, eos_token_id=eos)
        seqs = []
        for i, g in enumerate(group):
            answer = out[i, width:].tolist()
            cut = next((k + 1 for k, t in enumerate(answer) if t in eos), len(answer))
            seqs.append(g + answer[:cut])
        # Teacher-forced pass, right-padded: final-norm hidden states and argmax per position.
        length = max(len(s) for s in seqs)
        ids = torch.tensor([s + [pad] * (length - len(s)) for s in seqs])  # [B, T]
        att = torch.tensor([[1] * len(s) + [0] * (length - len(s)) for s in seqs])
        hidden = model.model(input_ids=ids, attention_mask=att).last_hidden_state  # [B, T, H]
        argmax = model.lm_head(hidden).argmax(-1)  # [B, T]
        rec = {"ids": [], "hidden": [], "argmax": [], "prompt_len": []}
        for i, s in enumerate(seqs):
            rec["ids"].append(torch.tensor(s, dtype=torch.int32))
            rec["hidden"].append(hidden[i, :len(s)].to(torch.float16).clone())
            rec["argmax"].append(argmax[i, :len(s)].to(torch.int32).clone())
            rec["prompt_len"].append(len(group[i]))
            total += len(s) - len(group[i])
        torch.save(rec, shard)
        print(f"shard {b}: {len(seqs)} answers, {total} answer tokens so far, "
              f"{time.time() - t0:.0f} s", flush=True)


# -- training --------------------------------------------------------------------------------


def _load_shards(work: Path):
    """All shards concatenated: ids, hidden, argmax ``[N]``/``[N, H]``, and per position the
    end of its sequence, the start of its answer, and its sequence number."""
    ids, hidden, argmax, starts, answer = [], [], [], [], []
    n = 0
    for shard in sorted(work.glob("shard_*.pt")):
        rec = torch.load(shard, weights_only=True)
        for s, h, a, p in zip(rec["ids"], rec["hidden"], rec["argmax"], rec["prompt_len"],
                              strict=True):
            ids.append(s)
            hidden.append(h)
            argmax.append(a)
            starts.append(n)
            answer.append(n + p - 1)  # the prompt's last position: its hidden state anchors
            n += len(s)
    seq_end = torch.cat([torch.full((len(s),), st + len(s), dtype=torch.int64)
                         for s, st in zip(ids, starts, strict=True)])
    seq_answer = torch.cat([torch.full((len(s),), a, dtype=torch.int64)
                            for s, a in zip(ids, answer, strict=True)])
    seq_no = torch.cat([torch.full((len(s),), i, dtype=torch.int64) for i, s in enumerate(ids)])
    return (torch.cat(ids).long(), torch.cat(hidden), torch.cat(argmax).long(), seq_end,
            seq_answer, seq_no)


def train(work: Path, out: Path, *, vocab_size: int, hidden_dim: int, steps: int, batch: int,
          unroll: int, lr: float, feature_weight: float, holdout: float,
          minutes: float | None = None) -> None:
    """Fit the head on the shards; write ``out``; print held-out acceptance per depth."""
    from structspec.spec.draft_head import DraftHeadNet, fingerprint, save_head

    torch.manual_seed(SEED)
    gen = _load(pack=False)
    model = gen.loaded.model
    emb = model.get_input_embeddings().weight.detach()  # [V, H]
    lm = model.get_output_embeddings().weight.detach()  # [V, H]
    ids, hidden, argmax, seq_end, seq_answer, seq_no = _load_shards(work)
    n = len(ids)
    counts = torch.bincount(argmax, minlength=lm.shape[0])
    vocab = torch.argsort(counts, descending=True)[:vocab_size].sort().values  # [Vr]
    cover = counts[vocab].sum().item() / counts.sum().item()
    print(f"{n} positions, reduced vocabulary {vocab_size}: covers {cover:.3f} of targets")
    w_red = lm[vocab].contiguous()  # [Vr, H]
    # Starts: positions p with an input token after them, in the answers (what decoding
    # sees) — the shared chat header is nearly all the same and would dominate otherwise.
    # Held out: whole answers (their prompts unseen in training).
    pos = torch.arange(n)
    valid = pos[((pos + 1) < seq_end) & (pos >= seq_answer)]
    g = torch.Generator().manual_seed(SEED)
    n_seq = int(seq_no[-1]) + 1
    held_seqs = torch.randperm(n_seq, generator=g)[:max(1, int(n_seq * holdout))]
    is_held = torch.isin(seq_no[valid], held_seqs)
    hold, fit = valid[is_held], valid[~is_held]
    hold = hold[torch.randperm(len(hold), generator=g)]
    print(f"{len(fit)} training starts, {len(hold)} held-out starts ({len(held_seqs)} answers)")
    net = DraftHeadNet(lm.shape[1], hidden_dim)
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01)
    def lr_at(s: int) -> float:  # warm-up, then cosine decay
        return min(1.0, (s + 1) / 200) * 0.5 * (1 + math.cos(math.pi * min(s, steps) / steps))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)

    def unrolled(starts: torch.Tensor, train_mode: bool):
        s = hidden[starts].float()  # [B, H]
        loss = torch.zeros(())
        hits = []
        alive = torch.ones(len(starts), dtype=torch.bool)
        for k in range(unroll):
            q = starts + 1 + k  # input token position; the head predicts the target's choice there
            ok = q < seq_end[starts]
            q = torch.where(ok, q, starts)
            if train_mode:  # robustness to the head's own errors (EAGLE's feature noise)
                s = s + (torch.rand(s.shape, generator=g) - 0.5) * 0.2
            s = net.step(s, emb[ids[q]])  # [B, H]
            logits = s @ w_red.T  # [B, Vr]
            with torch.no_grad():
                teacher = (hidden[q].float() @ w_red.T).log_softmax(-1)  # [B, Vr]
            logp = logits.log_softmax(-1)
            ce = -(teacher.exp() * logp).sum(-1)  # [B]
            feat = torch.nn.functional.smooth_l1_loss(s, hidden[q].float(), reduction="none"
                                                      ).mean(-1)  # [B]
            w = ok.float()
            loss = loss + ((ce + feature_weight * feat) * w).sum() / w.sum().clamp(min=1)
            with torch.no_grad():
                pred = vocab[logits.argmax(-1)]
                alive = alive & ok & (pred == argmax[q])
                hits.append((alive.float().sum() / max(1, int(ok.sum()))).item())
        return loss / unroll, hits

    t0 = time.time()
    for step in range(steps):
        if minutes is not None and time.time() - t0 > 60 * minutes:
            print(f"time budget reached at step {step}")
            break
        idx = fit[torch.randint(len(fit), (batch,), generator=g)]
        loss, hits = unrolled(idx, True)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 250 == 0 or step == steps - 1:
            with torch.no_grad():
                _, hh = unrolled(hold[:4096], False)
            print(f"step {step} loss {loss.item():.3f} train chain acc "
                  f"{[round(h, 3) for h in hits]} held-out {[round(h, 3) for h in hh]} "
                  f"{time.time() - t0:.0f} s", flush=True)
    save_head(out, net, vocab, fingerprint(model), name=gen.loaded.name,
              meta={"positions": n, "steps": step + 1, "batch": batch, "unroll": unroll,
                    "vocab_cover": round(cover, 4), "seed": SEED})
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["data", "train", "all"])
    ap.add_argument("--work", default=str(ROOT / "build" / "draft_head_data"))
    ap.add_argument("--out", default=None, help="default: the packaged head of the model")
    ap.add_argument("--prompts", type=int, default=700)
    ap.add_argument("--gen-batch", type=int, default=16)
    ap.add_argument("--max-new", type=int, default=192)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--hidden-dim", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--unroll", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--feature-weight", type=float, default=0.5)
    ap.add_argument("--holdout", type=float, default=0.05)
    ap.add_argument("--minutes", type=float, default=None,
                    help="stop training after this many minutes (the schedule still spans "
                         "--steps)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    random.seed(SEED)
    torch.manual_seed(SEED)
    work = Path(args.work)
    if args.what in ("data", "all"):
        make_data(work, args.prompts, args.gen_batch, args.max_new)
    if args.what in ("train", "all"):
        from structspec.spec.draft_head import head_path

        out = Path(args.out) if args.out else head_path("smollm2-135m-instruct")
        train(work, out, vocab_size=args.vocab_size, hidden_dim=args.hidden_dim,
              steps=args.steps, batch=args.batch, unroll=args.unroll, lr=args.lr,
              feature_weight=args.feature_weight, holdout=args.holdout,
              minutes=args.minutes)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
