"""Train the learned draft head of the default model by self-distillation, on CPU.

The draft head (:mod:`structspec.spec.draft_head`) predicts the target's next tokens from
the target's last hidden state and the embedding of the token just chosen, recurrently
(ReDrafter, Cheng et al. 2024; EAGLE, Li et al. 2024, without the attention layer). It is
trained to imitate the *target model itself*:

1. ``data``: the target writes greedy answers to a few thousand prompts made here — some
   sixty instruction styles × three hundred topics from every domain, how-to tasks,
   comparisons, letters and messages, open questions, a little code and JSON (none of them
   a benchmark prompt or on a benchmark prompt's topic; the benchmark's prose prompts are
   checked to be absent) — in left-padded batches of ``--gen-batch`` rows; a hook on the
   final norm records, per position, the target's final-norm hidden state (fp16) as the
   generation computes it, and the labels are the greedy tokens themselves, so no second
   pass is needed. Shards go to ``--work`` as they are made, so a partial run is usable
   and an interrupted one resumes. ``--work/eval`` gets the answers to ``EVAL_PROMPTS``,
   whose wordings and topics no training prompt uses: the honest held-out figure.
   ``--source code`` (or ``both``) adds raw continuations of the standard library's
   documented functions (:func:`code_prompts`; shards ``code_*.pt``), as a completion
   backend prompts the model. ``--mid-layer K`` also records decoder layer ``K``'s output
   per position (the shards' ``mid``); ``--seed`` draws another sample of the prompts,
   without the default sample's.
2. ``train``: a reduced output vocabulary (the ``--vocab-size`` most frequent target
   tokens in the answers, as in FR-Spec; their rows of the target's tied embedding /
   lm_head are used, not stored), then the head is unrolled ``--unroll`` steps from each
   answer position with teacher-forced input tokens; loss = soft cross-entropy against the
   target's own distribution over the reduced vocabulary at each step (its top 32, computed
   once from the stored hidden states) + a small feature-regression term. ``--minutes``
   fits the cosine schedule into a time budget; ``--init HEAD`` starts from a head file,
   keeping its vocabulary and adding the data's most frequent other tokens up to
   ``--vocab-size``. Prints the chain accuracy per depth on training batches, on held-out
   answers (prompts unseen, templates seen; the held-out code answers apart) and on the
   evaluation answers; writes fp16 weights, the reduced vocabulary, and the target's
   fingerprint to ``structspec/spec/heads/<model>.pt``. With ``--mid-layer K`` (shards made
   with the same ``K``) the head's first state also reads that layer's output. ``--init HEAD
   --steps 0`` only evaluates a head file.

Reproducible: fixed seeds, one torch thread, prompts in order (``--minutes`` makes the
step count the machine's). The shipped head is two runs. First (session 11, an AVX2 EPYC,
one thread, shared with other jobs at load 2-5): data 72 min for 5,280 answers (55 shards
of 96 rows, 128 new tokens at most; 604k answer tokens), trained together with the 691
answers (110k tokens) of the first head (``git show 7854161:scripts/train_draft_head.py``,
``data --prompts 700``, linked in as ``shard_v1_*.pt``), training 18 min (3,252 steps) after
the teacher pass:

    nice -n 10 .venv/bin/python scripts/train_draft_head.py data --prompts 6000 \
        --shards 55 --gen-batch 96 --max-new 128 --work /tmp/headwork
    nice -n 10 .venv/bin/python scripts/train_draft_head.py train --work /tmp/headwork \
        --minutes 18 --steps 100000

Then (session 38, the Xeon of ``docs/performance.md``, both cores) the same prose data made
again (``data --prompts 6000 --shards 55 --threads 2``; no ``shard_v1_*``), code answers
added (``data --source code``: 16 shards, 1,536 answers, 195k answer tokens, 19 min), and
that head fine-tuned on both with 2,048 more tokens in its vocabulary, mostly code's (8,321
steps in 20 min):

    .venv/bin/python scripts/train_draft_head.py data --source code --work /tmp/headwork \
        --threads 2
    .venv/bin/python scripts/train_draft_head.py train --work /tmp/headwork \
        --init structspec/spec/heads/smollm2-135m-instruct.pt --vocab-size 10240 \
        --lr 1e-3 --minutes 20 --steps 100000 --threads 2

Chain accuracy at depths 1 / 2 / 3 before / after: held-out code answers 0.33 / 0.10 / 0.03
→ 0.56 / 0.30 / 0.17, the evaluation answers 0.456 / 0.202 / 0.087 → 0.471 / 0.208 / 0.094.
(Session 12 had tried the same on less prose data, 88k tokens, and lost on prose.)
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

SEED = 1234
TEACHER_TOP = 32  # the target's distribution is kept as its top 32 reduced-vocabulary tokens

# -- prompts (disjoint from benchmarks/speculative.py's prose prompts and their topics) ------
#
# Diversity matters more than volume: a head trained on a few templates learns their
# answers' phrasing (62% first-token accuracy on held-out answers to the training
# templates, 25% on new prompts). So: many instruction styles × many topics from every
# domain, plus how-to tasks, comparisons, writing tasks with a recipient, and open questions.

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
    # added for diversity
    "Tell me about {t}.",
    "What is {t}?",
    "Can you explain {t} in simple terms?",
    "In two sentences, what is important about {t}?",
    "Write a poem about {t}.",
    "Write a limerick about {t}.",
    "Write a diary entry from someone who just discovered {t}.",
    "Write a dialogue between two friends discussing {t}.",
    "Give me a quick overview of {t}.",
    "What is the history of {t}?",
    "Who would be interested in {t}, and why?",
    "What are five key facts about {t}? Use a numbered list.",
    "List the pros and cons of {t}.",
    "Write an encyclopedia-style entry on {t}.",
    "Explain the science behind {t}.",
    "Write a news headline and a short article about {t}.",
    "Give a one-paragraph answer: how does {t} affect everyday life?",
    "I am writing an essay about {t}. Can you give me an outline?",
    "Write a short speech about {t} for a school assembly.",
    "Describe {t} to someone who has never heard of it.",
    "What questions would a curious child ask about {t}? Answer two of them.",
    "Write a product description inspired by {t}.",
    "Write a blog post introduction about {t}.",
    "What are the biggest challenges related to {t} today?",
    "Tell a short, funny anecdote involving {t}.",
    "Give me a fun fact about {t} and explain it.",
    "Write a short mystery story in which {t} plays a part.",
    "Write a motivational message that uses {t} as a metaphor.",
    "Describe {t} using all five senses.",
    "Explain {t} in one paragraph, then give an example.",
    "What is a good book or film about {t}, and what is it about?",
    "Write a tweet about {t}.",
    "What would the world be like without {t}?",
    "Briefly, what are the ethical questions around {t}?",
    "Write three quiz questions about {t}, with answers.",
    "How would you teach {t} to a group of adults?",
    "Please write a short essay on {t}.",
    "Write a letter to your future self about {t}.",
    "Imagine you are a tour guide. Describe {t} to visitors.",
    "Give me a simple definition of {t} and a few related terms.",
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
    # added for diversity
    "the Renaissance", "the Industrial Revolution", "the Vikings", "ancient Greece",
    "the Aztecs", "the Cold War", "medieval knights", "the invention of writing",
    "the steam engine", "the discovery of penicillin",
    "the Moon", "Mars", "the Sun", "Jupiter", "the Milky Way", "the International Space Station",
    "gravity", "magnetism", "electricity", "atoms", "DNA", "evolution", "the periodic table",
    "plate tectonics", "rainbows", "tornadoes", "snowflakes", "fog", "rivers",
    "caves", "islands", "wetlands", "the Amazon River", "the Sahara", "Antarctica",
    "the Arctic", "Mount Everest", "the Pacific Ocean", "tigers", "elephants", "octopuses",
    "ants", "wolves", "horses", "owls", "frogs", "sharks", "dolphins", "bats", "pandas",
    "kangaroos", "crows", "jellyfish", "mushrooms", "oak trees", "cactus plants", "sunflowers",
    "bamboo", "the human brain", "the skeleton", "digestion", "blood types", "vitamins",
    "nutrition", "yoga", "running", "swimming", "football", "basketball", "tennis",
    "cricket", "cycling races", "skiing", "surfing", "the World Cup", "martial arts",
    "smartphones", "computers", "the World Wide Web", "email", "cybersecurity", "passwords",
    "open-source software", "cloud computing", "virtual reality", "3D printing", "drones",
    "batteries", "nuclear power", "hydroelectric dams", "the electric grid", "satellites",
    "GPS navigation", "self-driving cars", "blockchain", "quantum computers", "search engines",
    "pizza", "sushi", "pasta", "spices", "vegetarian cooking", "fermentation", "breakfast",
    "ice cream", "olive oil", "wine making", "baking cookies", "soup",
    "painting", "sculpture", "poetry", "theatre", "opera", "ballet", "hip hop",
    "classical music", "the guitar", "the drums", "film making", "animation", "comic books",
    "novels", "fairy tales", "mythology", "architecture", "skyscrapers", "gothic cathedrals",
    "the pyramids", "ancient Rome's roads", "bridges of Venice", "tiny houses",
    "cities", "villages", "public transport", "traffic jams", "airports", "the post office",
    "banks", "taxes", "inflation", "small businesses", "advertising", "shopping online",
    "teamwork", "leadership", "creativity", "curiosity", "patience",
    "honesty", "courage", "happiness", "stress", "habits", "procrastination", "goal setting",
    "journaling", "minimalism", "volunteering", "charity", "family dinners", "grandparents",
    "siblings", "raising children", "pets", "travel", "camping",
    "road trips", "packing a suitcase", "learning to swim", "learning to cook",
    "studying for exams", "homework", "online courses", "universities", "scholarships",
    "science fairs", "mathematics", "prime numbers", "geometry", "statistics", "probability",
    "the number zero", "calendars", "clocks", "maps", "flags", "writing letters",
    "handwriting", "libraries of the ancient world",
    "newspapers", "radio", "television", "podcasts", "journalism", "elections",
    "human rights", "the United Nations", "laws", "courts", "the police", "firefighters",
    "doctors", "nurses", "farmers", "scientists", "astronauts", "engineers",
    "chefs", "artists", "carpenters", "plastic pollution", "air pollution", "deforestation",
    "endangered species", "national parks", "zoos", "composting",
    "wildfires", "floods", "droughts", "spring", "summer holidays",
    "winter storms", "birthdays", "weddings", "festivals", "New Year celebrations",
    "holidays around the world", "fireworks", "circuses", "amusement parks", "toys",
    "puzzles", "magic tricks", "kites", "hot air balloons", "sailing", "fishing",
    "beekeeping", "knitting", "woodworking", "pottery", "calligraphy", "bird watching",
    "stargazing", "the color blue", "silence", "music festivals", "sleepovers", "cereal",
]
HOWTO_TEMPLATES = [
    "How do I {t}?",
    "What is the best way to {t}?",
    "Give me step-by-step instructions to {t}.",
    "I want to {t}. Where should I start?",
    "Explain how to {t} in a few simple steps.",
    "What mistakes should I avoid when I {t}?",
    "Can you give me some advice on how to {t}?",
]
HOWTO_TASKS = [
    "make a cup of tea", "plant tomatoes", "save money each month", "write a good résumé",
    "fall asleep faster", "start running", "bake bread",
    "clean a laptop keyboard", "organize my desk", "make new friends as an adult",
    "learn to draw", "speak confidently in public", "train a puppy", "change a flat tyre",
    "cook rice", "take better photos with a phone", "study more effectively",
    "reduce food waste", "keep houseplants alive", "write a short story",
    "plan a birthday party", "start a small garden on a balcony", "learn to juggle",
    "make a budget", "remember names", "stay focused while working from home",
    "brew coffee with a French press", "write a polite complaint", "make pancakes",
    "build a bookshelf", "choose a good password", "back up my computer",
    "start a podcast", "paint a room", "take care of a cat", "pack for a long trip",
    "make a simple website", "learn chess", "improve my handwriting", "meditate",
    "negotiate a salary", "sew on a button", "stay safe in hot weather",
    "set up a fish tank", "make homemade pizza", "write a poem", "keep a journal",
    "wake up early", "reduce stress before an exam", "make a paper airplane",
]
PAIR_TEMPLATES = [
    "What is the difference between {a} and {b}?",
    "Compare {a} and {b}.",
    "Which is better, {a} or {b}? Explain your answer.",
    "How are {a} and {b} similar, and how are they different?",
]
PAIRS = [
    ("cats", "dogs"), ("tea", "coffee"), ("weather", "climate"), ("a virus", "a bacterium"),
    ("a lake", "a sea"), ("reading books", "watching films"), ("trains", "cars"),
    ("summer", "winter"), ("a city", "a village"), ("speed", "velocity"),
    ("a crocodile", "an alligator"), ("a comet", "an asteroid"), ("frogs", "toads"),
    ("renting", "buying a home"), ("baking", "frying"), ("email", "letters"),
    ("solar power", "wind power"), ("a hurricane", "a tornado"), ("chess", "checkers"),
    ("the piano", "the guitar"), ("Mars", "Venus"), ("a novel", "a short story"),
    ("weight", "mass"), ("democracy", "monarchy"), ("rice", "pasta"),
    ("a turtle", "a tortoise"), ("jam", "jelly"), ("a poem", "a song"),
    ("working alone", "working in a team"), ("a mountain", "a hill"),
]
WRITING_TEMPLATES = [
    "Write a short {k} to {w} {p}.",
    "Help me write a {k} to {w} {p}.",
    "Draft a brief {k} to {w} {p}.",
]
WRITING_KINDS = ["email", "letter", "message", "note", "text message", "card"]
WRITING_WHO = ["my boss", "a friend", "my grandmother", "a customer", "my landlord",
               "my team", "a new colleague", "my sports club", "a hotel", "my cousin",
               "the city council", "a local newspaper"]
WRITING_WHY = [
    "asking for a day off", "inviting them to a party", "apologizing for being late",
    "congratulating them on a promotion", "asking for feedback on a project",
    "complaining about a noisy street", "saying goodbye before moving abroad",
    "wishing them a happy birthday", "asking about a missing package",
    "announcing a new product", "cancelling a meeting", "recommending a good book",
    "asking for advice about a career change", "explaining a delay in a project",
    "suggesting a weekend trip",
]
OPEN_QUESTIONS = [
    "Why do cats purr?", "How do bees make honey?", "Why is the ocean salty?",
    "How do vaccines work?", "Why do we dream?", "How does the internet work?",
    "What causes earthquakes?", "Why do birds sing in the morning?",
    "How do plants know which way is up?", "Why do we yawn?", "How are rainbows formed?",
    "What is inflation and why does it happen?", "How does a battery store energy?",
    "Why do onions make you cry?", "How do fish breathe underwater?",
    "What is the speed of light?", "How do submarines dive?",
"What is the tallest mountain in the world?",
    "How does a microwave oven heat food?", "Why do stars twinkle?",
    "What is the difference between a planet and a star?", "How do magnets work?",
    "Why do we need sleep?", "How does the heart pump blood?", "What is a calorie?",
    "How do glaciers move?", "What is machine learning?", "How do elections work?",
    "Why is biodiversity important?", "How is paper made?", "How is glass made?",
    "What is the greenhouse effect?", "Why do some animals hibernate?",
    "What makes a story interesting?", "What makes a good leader?",
    "What is the meaning of the word 'serendipity'?", "Is it better to read or to listen?",
    "What is your favourite season and why?", "Tell me a joke about computers.",
    "Tell me a bedtime story about a brave mouse.", "What should I cook for dinner tonight?",
    "Suggest a name for a new bakery and explain it.", "Write a riddle and give the answer.",
    "What are some good habits for a healthy life?", "What is the capital of Australia?",
    "Who was Marie Curie?", "Who was Leonardo da Vinci?", "Who invented the telephone?",
    "What is the largest animal on Earth?", "How many continents are there? Name them.",
    "Why do we celebrate birthdays?", "What is a haiku? Give an example.",
    "Describe your ideal weekend.", "What would you do with a free day in Paris?",
    "Recommend three hobbies for someone who likes being outdoors.",
    "What are some ways to be more productive in the morning?",
    "Plan a three-day trip to Rome.", "Create a simple weekly meal plan.",
    "Give me a short motivational quote and explain what it means.",
]
CODE_TEMPLATES = [
    "Write a Python function that {t}.",
    "Write a Python function that {t}, with a docstring.",
    "Show a short Python example that {t}.",
    "Explain in words how you would write a program that {t}.",
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


#: Prompts for the held-out evaluation only (``eval`` data): topics and wordings used by no
#: training list above and by no benchmark prompt, so their acceptance predicts new prompts'.
EVAL_PROMPTS = [
    "Explain how a lock and key work.", "Write a short paragraph about the history of soap.",
    "Describe the life of a lighthouse keeper's cat.", "What makes a good neighbourhood café?",
    "Give three reasons why people collect stamps.", "Summarize the story of Cinderella.",
    "Describe a quiet beach in the early morning.", "Explain why bread goes stale.",
    "Write a short note congratulating a friend on passing a driving test.",
    "What are the benefits of learning to type quickly?", "Explain how a zipper works.",
    "Describe the smell of a bakery.", "Give advice to someone adopting a rabbit.",
    "Write a paragraph about the importance of street lighting.",
    "Explain what an eclipse is in simple terms.", "Why do people keep aquariums?",
    "Describe a snowy village at night.", "What is the role of a referee in a match?",
    "Explain how a hot water bottle stays warm.", "Write a short story about a lost umbrella.",
    "Give three tips for keeping a tidy kitchen.", "What were the effects of the gold rush?",
    "Describe the inside of an old clock shop.", "Explain how rain gauges measure rainfall.",
    "Write a few sentences about the first postage stamp.",
    "What is the purpose of a museum guard?", "Explain why bubbles are round.",
    "Give some advice for a first camping trip in the mountains with children.",
    "Write a paragraph about the invention of the umbrella.",
    "Describe the taste of a ripe mango.", "Explain how escalators work.",
    "What makes a joke funny? Answer briefly.",
]


def build_prompts(n: int, seed: int = SEED) -> list[str]:
    """Up to ``n`` distinct training prompts (a few fewer when the code pool runs out),
    deterministic, none of them a benchmark prose or an evaluation prompt: every open
    question, pair and how-to, writing tasks (8%), code (4%), JSON (3%), and templates ×
    topics for the rest, shuffled."""
    prose = [t.format(t=x) for t, x in itertools.product(PROSE_TEMPLATES, PROSE_TOPICS)]
    howto = [t.format(t=x) for t, x in itertools.product(HOWTO_TEMPLATES, HOWTO_TASKS)]
    pairs = [t.format(a=a, b=b) for t, (a, b) in itertools.product(PAIR_TEMPLATES, PAIRS)]
    writing = [t.format(k=k, w=w, p=p) for t, k, w, p in itertools.product(
        WRITING_TEMPLATES, WRITING_KINDS, WRITING_WHO, WRITING_WHY)]
    code = [t.format(t=x) for t, x in itertools.product(CODE_TEMPLATES, CODE_TOPICS)]
    js = [t.format(t=x) for t, x in itertools.product(JSON_TEMPLATES, PROSE_TOPICS)]
    rng = random.Random(seed)
    for pool in (prose, howto, pairs, writing, code, js):
        rng.shuffle(pool)
    fixed = OPEN_QUESTIONS + pairs + howto
    n_write, n_code, n_json = int(n * 0.08), int(n * 0.04), int(n * 0.03)
    rest = max(0, n - len(fixed) - n_write - n_code - n_json)
    out = list(dict.fromkeys(fixed + writing[:n_write] + code[:n_code] + js[:n_json]
                             + prose[:rest]))[:n]
    rng.shuffle(out)
    banned = set(benchmark_prose()) | set(EVAL_PROMPTS)
    clash = banned.intersection(out)
    if clash:
        raise SystemExit(f"training prompts overlap the benchmark's: {sorted(clash)[:3]}")
    return out


def code_prompts(n: int, seed: int = SEED, group: int = 96) -> list[str]:
    """Up to ``n`` raw code prompts (no chat template): the standard library's functions and
    methods that have a docstring, as a completion backend sees them — up to six of the
    module's import lines, the ``class`` line of a method, the ``def`` line and the
    docstring, and half of the time the first few lines of the body too; the model writes
    the rest. Deterministic for a given Python version (it reads the running interpreter's
    library). The standard library shares no code with the benchmark's HumanEval prompts;
    test suites and vendored packages are left out. Ordered in runs of ``group`` prompts of
    similar length (one generation batch each), the runs shuffled."""
    import ast
    import sysconfig

    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "tests", "idlelib", "lib2to3", "site-packages", "ensurepip", "turtledemo")
    rng = random.Random(seed)
    out: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if any(part in skip for part in path.relative_to(root).parts):
            continue
        try:
            source = path.read_text(encoding="utf-8")
            module = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines()
        imports = [ln for ln in lines if ln.startswith(("import ", "from "))][:6]
        functions = [(None, node) for node in module.body]
        functions += [(cls, node) for cls in module.body if isinstance(cls, ast.ClassDef)
                      for node in cls.body]
        for cls, node in functions:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            doc = ast.get_docstring(node)
            body = node.body[1:]
            if doc is None or len(body) < 2 or node.decorator_list:
                continue
            head = [] if cls is None else [lines[cls.lineno - 1], ""]
            head += lines[node.lineno - 1:node.body[0].end_lineno]
            rest = lines[node.body[0].end_lineno:node.end_lineno]
            if rng.random() < 0.5 and len(rest) > 1:
                head += rest[:rng.randrange(1, min(len(rest), 8))]
            text = "\n".join(imports) + ("\n\n\n" if imports else "") + "\n".join(head) + "\n"
            if len(text) <= 1600:
                out.append(text)
    rng.shuffle(out)
    # Batches of similar lengths (left padding to the longest costs prefill), in random order.
    out = sorted(out[:n], key=len)
    chunks = [out[i:i + group] for i in range(0, len(out), group)]
    rng.shuffle(chunks)
    return [p for chunk in chunks for p in chunk]


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
def answer_records(model: Any, norm: torch.nn.Module, group: list[list[int]], *, pad: int,
                   eos: list[int], max_new: int,
                   mid: torch.nn.Module | None = None) -> dict[str, list[torch.Tensor | int]]:
    """Greedy answers to the prompts ``group`` (token ids) in one left-padded batched
    ``generate``, with the final-norm hidden state and the argmax at every position.

    A hook on ``norm`` (the module ``lm_head`` reads) records the states the generation
    itself computes (the prefill's for the prompt, then one per step), so no second pass is
    needed: an answer position's argmax is the next greedy token; the last answer token is
    dropped when no pass ran on it. A prompt position's "argmax" is the next prompt token
    (training reads answer positions only). Batched left-padded greedy answers can differ
    slightly from single-row ones; states and labels stay consistent with each other.

    Returns:
        ``{"ids", "hidden", "argmax", "prompt_len"}``: per answered prompt, ``[T]`` int32,
        ``[T, H]`` float16, ``[T]`` int32, and its prompt length.
    """
    calls: list[torch.Tensor] = []
    mids: list[torch.Tensor] = []
    hook = norm.register_forward_hook(
        lambda _m, _i, out: calls.append(out.detach().to(torch.float16)))  # [B, T, H]
    hook_mid = None if mid is None else mid.register_forward_hook(
        lambda _m, _i, out: mids.append(
            (out[0] if isinstance(out, tuple) else out).detach().to(torch.float16)))
    try:
        width = max(len(g) for g in group)
        ids = torch.tensor([[pad] * (width - len(g)) + g for g in group])  # [B, P]
        att = torch.tensor([[0] * (width - len(g)) + [1] * len(g) for g in group])
        out = model.generate(ids, attention_mask=att, max_new_tokens=max_new, do_sample=False,
                             pad_token_id=pad, eos_token_id=eos)  # [B, P + N]
    finally:
        hook.remove()
        if hook_mid is not None:
            hook_mid.remove()
    # calls[0]: [B, P, H] (prefill); calls[k]: [B, 1, H] after answer token k-1.
    steps = torch.cat([c[:, -1:] for c in calls[1:]], 1) if len(calls) > 1 else None
    mid_steps = torch.cat([c[:, -1:] for c in mids[1:]], 1) if len(mids) > 1 else None
    rec: dict[str, list] = {"ids": [], "hidden": [], "argmax": [], "prompt_len": []}
    if mid is not None:
        rec["mid"] = []
    for i, g in enumerate(group):
        answer = out[i, width:].tolist()
        cut = next((k + 1 for k, t in enumerate(answer) if t in eos), len(answer))
        m = min(cut, len(calls) - 1)  # answer tokens whose position has a state
        if m < 1 or steps is None:
            continue
        nxt = g[1:] + answer[:m + 1]  # [P + m]: what follows each position
        if m == cut:  # the end-of-sequence token: nothing follows it
            nxt[-1] = answer[cut - 1]
        rec["ids"].append(torch.tensor(g + answer[:m], dtype=torch.int32))
        rec["hidden"].append(torch.cat([calls[0][i, width - len(g):], steps[i, :m]]).clone())
        if mid is not None and mid_steps is not None:
            rec["mid"].append(torch.cat([mids[0][i, width - len(g):], mid_steps[i, :m]]).clone())
        rec["argmax"].append(torch.tensor(nxt, dtype=torch.int32))
        rec["prompt_len"].append(len(g))
    return rec


def make_data(work: Path, prompts: list[str], batch: int, max_new: int,
              shards: int | None = None, *, raw: bool = False, name: str = "shard",
              mid_layer: int | None = None) -> None:
    """:func:`answer_records` for ``prompts``, ``batch`` at a time, one shard per batch under
    ``work`` named ``<name>_NNNN.pt`` (shards already there are kept, so an interrupted run
    resumes); at most ``shards`` shards. ``raw``: the prompts are given to the model as
    they are (code), not through the chat template."""
    from structspec.spec.draft_head import decoder_layer, final_norm

    gen = _load()
    model, tok = gen.loaded.model, gen.loaded.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    eos = sorted(gen.loaded.eos_token_ids)
    norm = final_norm(model)
    if norm is None:
        raise SystemExit("the model has no recognisable final norm")
    mid = None if mid_layer is None else decoder_layer(model, mid_layer)
    if mid_layer is not None and mid is None:
        raise SystemExit(f"--mid-layer {mid_layer}: the model has no such decoder layer")
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    total = 0
    for b, start in enumerate(range(0, len(prompts), batch)):
        shard = work / f"{name}_{b:04d}.pt"
        if shards is not None and b >= shards:
            break
        if shard.exists():
            continue
        group = [gen.prompt_ids(p, chat=False if raw else None)
                 for p in prompts[start:start + batch]]
        rec = answer_records(model, norm, group, pad=pad, eos=eos, max_new=max_new, mid=mid)
        total += sum(len(s) - p for s, p in zip(rec["ids"], rec["prompt_len"], strict=True))
        torch.save(rec, shard)
        print(f"shard {b}: {len(rec['ids'])} answers, {total} answer tokens so far, "
              f"{time.time() - t0:.0f} s", flush=True)


# -- training --------------------------------------------------------------------------------


def _load_shards(shards: list[Path]):
    """The shards concatenated: ids, hidden, argmax ``[N]``/``[N, H]``, and per position the
    end of its sequence, the start of its answer, and its sequence number; then the number
    of sequences in each shard, and the middle layer's outputs ``[N, H]`` (``None`` unless
    every shard has them)."""
    ids, hidden, argmax, starts, answer, mids = [], [], [], [], [], []
    per_shard: list[int] = []
    n = 0
    for shard in shards:
        rec = torch.load(shard, weights_only=True)
        per_shard.append(len(rec["ids"]))
        mids.extend(rec.get("mid") or [None] * len(rec["ids"]))
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
    mid = torch.cat(mids) if mids and all(m is not None for m in mids) else None
    return (torch.cat(ids).long(), torch.cat(hidden), torch.cat(argmax).long(), seq_end,
            seq_answer, seq_no, per_shard, mid)


def train(work: Path, out: Path, *, vocab_size: int, hidden_dim: int, steps: int, batch: int,
          unroll: int, lr: float, feature_weight: float, holdout: float,
          minutes: float | None = None, init: Path | None = None,
          mid_layer: int | None = None, blocks: int = 1) -> None:
    """Fit the head on the shards; write ``out``; print held-out acceptance per depth.
    ``mid_layer``: the head's first state also reads that layer's outputs (the shards'
    ``mid``, made by ``data --mid-layer`` with the same layer)."""
    from structspec.spec.draft_head import DraftHeadNet, fingerprint, save_head

    torch.manual_seed(SEED)
    gen = _load(pack=False)
    model = gen.loaded.model
    emb = model.get_input_embeddings().weight.detach()  # [V, H]
    lm = model.get_output_embeddings().weight.detach()  # [V, H]
    # The evaluation answers (``EVAL_PROMPTS``, under ``work/eval``) come last: never trained on.
    train_shards = sorted(work.glob("shard_*.pt")) + sorted(work.glob("code_*.pt"))
    ids, hidden, argmax, seq_end, seq_answer, seq_no, per_shard, mid = _load_shards(
        train_shards + sorted((work / "eval").glob("shard_*.pt")))
    if mid_layer is not None and mid is None:
        raise SystemExit("--mid-layer: some shards have no middle-layer outputs")
    per_shard = per_shard[:len(train_shards)]
    n_train_seq = sum(per_shard)
    n_prose_seq = sum(c for s, c in zip(train_shards, per_shard, strict=True)
                      if s.name.startswith("shard_"))  # then the code answers
    n = len(ids)
    pos = torch.arange(n)
    in_answer = (pos >= seq_answer) & (seq_no < n_train_seq)
    counts = torch.bincount(argmax[in_answer], minlength=lm.shape[0])
    vocab = torch.argsort(counts, descending=True)[:vocab_size].sort().values  # [Vr]
    if init is not None:  # start from (or, with --steps 0, just evaluate) a head file
        blob = torch.load(init, map_location="cpu", weights_only=True)
        hidden_dim = blob["hidden_dim"]
        blocks = max(blocks, int(blob.get("blocks", 1)))  # new blocks start as the identity
        # The head's weights do not depend on its vocabulary (its logits are the target's
        # lm_head rows): keep the file's tokens, add this data's most frequent others.
        kept = blob["vocab"].long()
        extra = torch.argsort(counts, descending=True)
        extra = extra[~torch.isin(extra, kept) & (counts[extra] > 0)]
        vocab = torch.cat([kept, extra[:max(0, vocab_size - len(kept))]]).sort().values
        vocab_size = len(vocab)
    cover = counts[vocab].sum().item() / counts.sum().item()
    print(f"{n} positions, reduced vocabulary {vocab_size}: covers {cover:.3f} of targets")
    w_red = lm[vocab].contiguous()  # [Vr, H]
    # Starts: positions p with an input token after them, in the answers (what decoding
    # sees) — the shared chat header is nearly all the same and would dominate otherwise.
    # Held out: whole answers (their prompts unseen in training).
    # Held out: whole answers (their prompts unseen in training, their templates and topics
    # seen), and the evaluation answers (wordings and topics unseen: the honest figure).
    valid = pos[((pos + 1) < seq_end) & (pos >= seq_answer)]
    g = torch.Generator().manual_seed(SEED)
    held_seqs = torch.randperm(n_train_seq, generator=g)[:max(1, int(n_train_seq * holdout))]
    is_eval = seq_no[valid] >= n_train_seq
    is_held = torch.isin(seq_no[valid], held_seqs) & ~is_eval
    hold, fit, evals = valid[is_held], valid[~is_held & ~is_eval], valid[is_eval]
    hold = hold[torch.randperm(len(hold), generator=g)]
    hold_code = hold[seq_no[hold] >= n_prose_seq]  # held-out code answers, reported apart
    print(f"{len(fit)} training starts, {len(hold)} held-out starts ({len(held_seqs)} answers), "
          f"{len(evals)} evaluation starts ({int(seq_no[-1]) + 1 - n_train_seq} answers)")
    net = DraftHeadNet(lm.shape[1], hidden_dim, mid=mid_layer is not None, blocks=blocks)
    if init is not None:  # (a head without the middle-layer input or a block starts it at 0)
        missing, unexpected = net.load_state_dict(
            {k: v.float() for k, v in blob["state"].items()}, strict=False)
        if unexpected or any(not k.startswith(("mid_in.", "norm_m.", "extra.")) for k in missing):
            raise SystemExit(f"--init {init}: another head layout ({missing}, {unexpected})")
    # the steps of the head this run starts from (recorded in the new file's meta)
    init_steps = int(blob.get("meta", {}).get("steps", 0)) if init is not None else 0
    opt = torch.optim.AdamW(net.parameters(), lr=lr, weight_decay=0.01)
    t0 = time.time()

    def progress(s: int) -> float:  # of the schedule: by steps, or by time under --minutes
        by_time = (time.time() - t0) / (60 * minutes) if minutes is not None else 0.0
        return min(1.0, max(s / max(1, steps), by_time))

    def lr_at(s: int) -> float:  # warm-up, then cosine decay
        return min(1.0, (s + 1) / 200) * 0.5 * (1 + math.cos(math.pi * progress(s)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)

    # The target's distribution over the reduced vocabulary at every answer position (the
    # positions predicted), kept as its top TEACHER_TOP renormalized: computed once, not at
    # every step.
    teacher_p = torch.zeros(n, TEACHER_TOP)  # [N, k]
    teacher_ix = torch.zeros(n, TEACHER_TOP, dtype=torch.int16 if len(vocab) < 2**15
                             else torch.int32)  # [N, k]
    t1 = time.time()
    targets = pos[pos > seq_answer]
    with torch.no_grad():
        for a in range(0, len(targets), 8192):
            at = targets[a:a + 8192]
            top = (hidden[at].float() @ w_red.T).topk(TEACHER_TOP, -1)  # [c, k]
            teacher_p[at] = top.values.softmax(-1)
            teacher_ix[at] = top.indices.to(teacher_ix.dtype)
    print(f"teacher top-{TEACHER_TOP} of {len(targets)} positions: {time.time() - t1:.0f} s",
          flush=True)

    def unrolled(starts: torch.Tensor, train_mode: bool):
        s = hidden[starts].float()  # [B, H]
        if mid_layer is not None and mid is not None:
            s = net.start(s, mid[starts].float())
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
            logp = logits.log_softmax(-1)
            ce = -(teacher_p[q] * logp.gather(-1, teacher_ix[q].long())).sum(-1)  # [B]
            feat = torch.nn.functional.smooth_l1_loss(s, hidden[q].float(), reduction="none"
                                                      ).mean(-1)  # [B]
            w = ok.float()
            loss = loss + ((ce + feature_weight * feat) * w).sum() / w.sum().clamp(min=1)
            with torch.no_grad():
                pred = vocab[logits.argmax(-1)]
                alive = alive & ok & (pred == argmax[q])
                hits.append((alive.float().sum() / max(1, int(ok.sum()))).item())
        return loss / unroll, hits

    def report(step: int, loss: float, hits: list[float]) -> None:
        with torch.no_grad():
            _, hh = unrolled(hold[:4096], False)
            _, hc = unrolled(hold_code[:4096], False) if len(hold_code) else (None, [])
            _, he = unrolled(evals, False) if len(evals) else (None, [])
        print(f"step {step} loss {loss:.3f} train chain acc {[round(h, 3) for h in hits]} "
              f"held-out {[round(h, 3) for h in hh]} (code {[round(h, 3) for h in hc]}) "
              f"evaluation {[round(h, 3) for h in he]} "
              f"{time.time() - t0:.0f} s", flush=True)

    step, loss, hits = 0, torch.zeros(()), []
    for step in range(steps):
        if progress(step) >= 1.0:
            print(f"time budget reached at step {step}")
            break
        idx = fit[torch.randint(len(fit), (batch,), generator=g)]
        loss, hits = unrolled(idx, True)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 250 == 0:
            report(step, loss.item(), hits)
    report(step, loss.item(), hits)
    save_head(out, net, vocab, fingerprint(model), name=gen.loaded.name,
              meta={"positions": n, "steps": step + 1, "batch": batch, "unroll": unroll,
                    "blocks": net.blocks,
                    **({} if init is None else {"init_steps": init_steps}),
                    "vocab_cover": round(cover, 4), "seed": SEED,
                    **({} if mid_layer is None else {"mid_layer": mid_layer})})
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=["data", "train", "all"])
    ap.add_argument("--work", default=str(ROOT / "build" / "draft_head_data"))
    ap.add_argument("--out", default=None, help="default: the packaged head of the model")
    ap.add_argument("--prompts", type=int, default=6000)
    ap.add_argument("--source", choices=["prose", "code", "both"], default="prose",
                    help="data: chat answers to the prompts made here, raw continuations of "
                         "the standard library's functions (code_*.pt shards), or both")
    ap.add_argument("--code-prompts", type=int, default=1536)
    ap.add_argument("--code-shards", type=int, default=None)
    ap.add_argument("--gen-batch", type=int, default=96)
    ap.add_argument("--shards", type=int, default=None,
                    help="stop after this many shards of --gen-batch answers")
    ap.add_argument("--max-new", type=int, default=128)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--hidden-dim", type=int, default=1024)
    ap.add_argument("--blocks", type=int, default=1,
                    help="residual MLP blocks per head step; with --init, blocks beyond the "
                         "file's start as the identity")
    ap.add_argument("--steps", type=int, default=6000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--unroll", type=int, default=3)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--feature-weight", type=float, default=0.5)
    ap.add_argument("--holdout", type=float, default=0.05)
    ap.add_argument("--minutes", type=float, default=None,
                    help="stop training after this many minutes (the schedule still spans "
                         "--steps)")
    ap.add_argument("--init", default=None,
                    help="start from this head file (its vocabulary and width); with "
                         "--steps 0, only evaluate it")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=SEED,
                    help="data: another sample of the training prompts; with a seed other "
                         "than the default, the default sample's prompts are left out")
    ap.add_argument("--mid-layer", type=int, default=None,
                    help="data: also record this decoder layer's output per position "
                         "(shards' 'mid'); train: the head's first state reads it")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    random.seed(SEED)
    torch.manual_seed(SEED)
    work = Path(args.work)
    if args.what in ("data", "all"):
        make_data(work / "eval", EVAL_PROMPTS, args.gen_batch, args.max_new,
                  mid_layer=args.mid_layer)
        if args.source in ("prose", "both"):
            prompts = build_prompts(args.prompts, args.seed)
            if args.seed != SEED:  # a new sample: none of the default sample's prompts
                seen = set(build_prompts(args.prompts))
                prompts = [p for p in prompts if p not in seen]
            make_data(work, prompts, args.gen_batch, args.max_new, args.shards,
                      mid_layer=args.mid_layer)
        if args.source in ("code", "both"):
            make_data(work, code_prompts(args.code_prompts, group=args.gen_batch),
                      args.gen_batch, args.max_new, args.code_shards, raw=True, name="code")
    if args.what in ("train", "all"):
        from structspec.spec.draft_head import head_path

        out = Path(args.out) if args.out else head_path("smollm2-135m-instruct")
        train(work, out, vocab_size=args.vocab_size, hidden_dim=args.hidden_dim,
              steps=args.steps, batch=args.batch, unroll=args.unroll, lr=args.lr,
              feature_weight=args.feature_weight, holdout=args.holdout,
              minutes=args.minutes, init=Path(args.init) if args.init else None,
              mid_layer=args.mid_layer, blocks=args.blocks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
