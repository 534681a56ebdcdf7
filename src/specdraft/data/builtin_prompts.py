"""Builtin single-turn prompts: templates x topic lists x small parameters, written for
specdraft (no public dataset is copied). They give a drafter something to learn from when
the user has no data: `specdraft prepare --conversations builtin --regenerate` lets the target answer.

The pool is fixed (its own RNG, independent of `seed`); a stable hash of each prompt puts
about 1 in 8 of them in a held-out slice that never appears in `train`, so later stages can
benchmark on prompts the drafter never saw. `seed` only shuffles the order.
"""

from __future__ import annotations

import hashlib
import random
from functools import lru_cache
from itertools import product

from specdraft.errors import SpecdraftError

HOLDOUT_EVERY = 8  # about 1 prompt in 8 is held out

SCIENCE = ["photosynthesis", "gravity", "the water cycle", "plate tectonics", "how vaccines work",
           "black holes", "the greenhouse effect", "DNA replication", "electric circuits", "magnetism",
           "the speed of light", "ocean tides", "the seasons on Earth", "how rainbows form", "friction",
           "the immune system", "evolution by natural selection", "nuclear fusion in the Sun",
           "sound waves", "how airplanes fly", "the periodic table", "chemical bonds", "entropy",
           "how batteries store energy", "volcanoes", "earthquakes", "the carbon cycle", "antibiotics",
           "how the heart pumps blood", "how eyes see color"]
COMPUTING = ["recursion", "hash tables", "binary search", "how the internet routes packets",
             "public-key encryption", "garbage collection", "virtual memory", "database indexes",
             "version control with git", "unit testing", "big-O notation", "how compilers work",
             "caching", "REST APIs", "multithreading", "deadlocks", "regular expressions",
             "how a CPU executes instructions", "floating-point numbers", "containers like Docker",
             "machine learning", "neural networks", "gradient descent", "overfitting",
             "how search engines rank pages", "DNS", "TCP versus UDP", "sorting algorithms",
             "linked lists", "speculative decoding in language models"]
EVERYDAY = ["compound interest", "inflation", "how credit scores work", "budgeting",
            "how a mortgage works", "supply and demand", "why bread rises", "how a refrigerator works",
            "how to read a nutrition label", "sleep cycles", "why we yawn", "how muscles grow",
            "jet lag", "how noise-cancelling headphones work", "how a microwave oven heats food",
            "why the sky is blue", "how elections are counted", "how a bill becomes a law",
            "time zones", "leap years"]
HISTORY = ["the printing press", "the Industrial Revolution", "the invention of the telephone",
           "the first moon landing", "the Silk Road", "ancient Roman aqueducts", "the Renaissance",
           "the history of the bicycle", "the invention of paper money", "the first computers"]
EXPLAIN_TOPICS = SCIENCE + COMPUTING + EVERYDAY + HISTORY
AUDIENCES = ["a ten-year-old", "a high school student", "a busy manager", "a complete beginner",
             "someone who knows the basics", "an engineer from another field"]
EXPLAIN_TEMPLATES = ["Explain {topic} to {audience}.",
                     "Can you explain {topic} in simple terms for {audience}?",
                     "What is the main idea behind {topic}? Keep it suitable for {audience}.",
                     "Give {audience} a short explanation of {topic}, with one example."]
SHORT_EXPLAIN = ["Why does {topic} matter?", "What are common misconceptions about {topic}?",
                 "Summarize {topic} in three sentences.", "What is a good analogy for {topic}?"]

HOWTO_TASKS = ["make a cup of pour-over coffee", "change a flat bicycle tire", "start a vegetable garden",
               "write a good cover letter", "prepare for a job interview", "learn a new language faster",
               "organize a small closet", "bake simple bread at home", "set up a home Wi-Fi network",
               "back up the files on my laptop", "clean a cast iron pan", "plan a weekend trip on a budget",
               "train for a first 5K run", "keep houseplants alive", "take better photos with a phone",
               "give a short presentation", "write a clear bug report", "set up a Python virtual environment",
               "resolve a merge conflict in git", "make a simple monthly budget", "fold a fitted sheet",
               "brew iced tea", "remove a coffee stain from a shirt", "sharpen a kitchen knife",
               "study for a math exam", "run an effective meeting", "stop procrastinating",
               "make a basic tomato sauce", "paint a small room", "teach a dog to sit",
               "write unit tests for a function", "read a research paper efficiently",
               "negotiate a salary offer", "meditate for five minutes", "repot a plant",
               "store fresh herbs", "choose a strong password", "speed up a slow computer",
               "make friends in a new city", "write a haiku"]
HOWTO_TEMPLATES = ["How do I {task}?", "Give me step-by-step instructions to {task}.",
                   "What is the easiest way to {task}?", "I'm a beginner. How should I {task}?",
                   "List the mistakes people make when they try to {task}."]

LIST_THINGS = ["healthy breakfast ideas", "ways to save money on groceries", "board games for families",
               "tips for writing clean code", "questions to ask in an interview", "indoor hobbies",
               "ways to reduce stress", "classic science fiction themes", "uses for baking soda",
               "names for a pet turtle", "tips for learning to cook", "ideas for a birthday party",
               "programming project ideas for beginners", "ways to be more productive in the morning",
               "exercises that need no equipment", "benefits of reading every day",
               "things to pack for a camping trip", "ways to conserve water at home",
               "icebreaker questions for a team meeting", "features of a good website",
               "reasons to learn a second language", "tips for a long flight",
               "snacks for a road trip", "ways to make a small room feel bigger",
               "common logical fallacies", "habits of good listeners", "facts about the ocean",
               "ways to practice gratitude", "kitchen tools every cook needs", "rainy-day activities for kids"]
LIST_TEMPLATES = ["List {k} {things}.", "Give me {k} {things}, one line each.",
                  "What are {k} {things}? Number them."]

LANGUAGES = ["Python", "JavaScript", "Rust", "Go", "C", "Java", "TypeScript", "Bash"]
CODE_TASKS = ["reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
              "counts the words in a text", "removes duplicates from a list while keeping order",
              "computes the factorial of n", "checks whether a string is a palindrome",
              "merges two sorted lists", "finds the largest element in an array",
              "converts Celsius to Fahrenheit", "computes the average of a list of numbers",
              "flattens a nested list", "counts how often each character appears",
              "validates a simple email address", "returns the greatest common divisor of two numbers",
              "sorts a list of names alphabetically", "reads a file and prints its line count",
              "implements binary search", "transposes a matrix", "checks whether brackets are balanced"]
CODE_TEMPLATES = ["Write a {lang} function that {task}.",
                  "Show a short {lang} example that {task}, and explain it briefly.",
                  "In {lang}, how would I write code that {task}?"]
CODE_REVIEW = ["What does this Python code do?\n\n```python\n{code}\n```",
               "Find the bug in this Python code and fix it:\n\n```python\n{code}\n```"]
SNIPPETS = ["def f(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total / len(xs)",
            "def g(s):\n    return s == s[::-1]",
            "def h(n):\n    if n <= 1:\n        return n\n    return h(n - 1) + h(n - 2)",
            "nums = [3, 1, 2]\nnums.sort()\nprint(nums[len(nums)])",
            "def count(words):\n    c = {}\n    for w in words:\n        c[w] = c.get(w, 0) + 1\n    return c",
            "def last(xs):\n    return xs[len(xs)]",
            "with open('data.txt') as f:\n    lines = f.readlines()\nprint(len(lines))",
            "def add_item(item, items=[]):\n    items.append(item)\n    return items"]

NAMES = ["Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Goran", "Hana", "Ivan", "Jia", "Kofi", "Lena",
         "Mateo", "Nia", "Omar", "Priya"]
WORD_PROBLEMS = [
    "{name} has {a} apples and buys {b} more. Then {name} gives away {c}. How many apples are left?",
    "A bakery makes {a} loaves of bread each day. How many loaves does it make in {b} days?",
    "A train travels at {a} km per hour for {b} hours. How far does it go?",
    "{name} saves {a} dollars a week. How many weeks until {name} has saved {t} dollars?",
    "A class has {a} students split equally into {b} groups, with the remainder helping the teacher. "
    "How many students are in each group, and how many help the teacher?",
    "A shirt costs {a} dollars and is on sale for {p} percent off. What is the sale price?",
    "{name} reads {a} pages a day. The book has {t} pages. How many days to finish it?",
    "A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?",
    "{name} buys {b} notebooks at {a} dollars each and pays with a {t}-dollar bill. How much change?",
    "A tank holds {t} liters and fills at {a} liters per minute. How long until it is full?",
]

PASSAGES = [
    "The town library opened a repair cafe last spring. Every Saturday, volunteers fix lamps, toasters and "
    "torn jackets for free, and visitors learn to do small repairs themselves. In six months the cafe kept "
    "about four hundred items out of the landfill, and the library now plans a second session on weekdays.",
    "Our team moved the nightly build from a single old server to a pool of cloud machines. Build times fell "
    "from ninety minutes to twenty, but costs rose by a third. We are now testing smaller machines and "
    "caching dependencies between runs to bring the bill back down without losing the speed-up.",
    "Honeybees communicate the location of flowers with a waggle dance. The angle of the dance relative to "
    "vertical tells other bees the direction of the food relative to the sun, and the length of the waggle "
    "tells them how far away it is. Scientists decoded this behaviour in the twentieth century.",
    "The meeting on Thursday is moved to Friday at 10 a.m. because the conference room is being painted. "
    "Please bring the updated sales figures and your questions about the new travel policy. Lunch will be "
    "provided, so tell the office manager about any dietary needs by Wednesday.",
    "Walking for thirty minutes a day has benefits that are easy to underestimate. It improves mood, helps "
    "with sleep and lowers blood pressure over time. Unlike many sports it needs no equipment, and short "
    "walks after meals may also help the body manage blood sugar.",
    "A small startup built a phone app that lets neighbours lend each other tools. Early users loved it, but "
    "few items were returned on time. The founders added reminders and a simple rating system, and late "
    "returns dropped by half within two months.",
    "The river through the old mill district flooded three times in ten years. The city replaced concrete "
    "banks with wetlands and parks that can absorb water. The project cost less than a new flood wall and "
    "gave residents a place to walk, cycle and watch birds.",
    "Version 2.0 of the library drops support for the old configuration format. Existing users should run "
    "the migration script, which converts settings files automatically and prints any options it could not "
    "translate. The old format will keep working with a warning until the next major release.",
    "Octopuses have three hearts and blue blood. Two hearts pump blood through the gills, while the third "
    "pumps it to the rest of the body. Their blood uses a copper-based molecule to carry oxygen, which works "
    "better than iron-based blood in cold water with little oxygen.",
    "Many people try to learn a language by memorising long word lists, then give up. A better approach is "
    "to learn the few hundred most common words first, listen to simple stories every day and speak early, "
    "even with mistakes. Regular short practice beats rare long sessions.",
    "The customer reported that the dashboard shows yesterday's numbers until the page is refreshed twice. "
    "Our investigation found that the browser cached the data request for one hour. We shortened the cache "
    "time and added a version tag to each request, and the problem no longer occurs.",
    "In the nineteenth century, ice was cut from frozen lakes in winter and shipped around the world packed "
    "in sawdust. Merchants sold it in hot cities months later. The trade ended when mechanical refrigeration "
    "became cheap and reliable early in the twentieth century.",
]
PASSAGE_TASKS = ["Summarize the following passage in one sentence:", "Summarize this in three bullet points:",
                 "Rewrite the following passage in a formal tone:", "Rewrite this passage so a child can "
                 "understand it:", "Give this passage a short, catchy title:", "Rewrite the following text "
                 "in the passive voice where possible:", "List the key facts in this passage:",
                 "Shorten this passage to under forty words:"]

RECIPIENTS = ["my manager", "a colleague", "a client", "my landlord", "a professor", "a new team member",
              "a customer support team", "a neighbour", "an old friend", "a job recruiter"]
EMAIL_PURPOSES = ["asking for a day off next Friday", "apologising for missing a deadline",
                  "thanking them for their help on a project", "requesting a meeting to discuss a proposal",
                  "following up on an unanswered message", "declining an invitation politely",
                  "reporting a broken heater", "asking for feedback on a draft",
                  "introducing myself and my role", "asking for an extension on an assignment",
                  "confirming the details of an order", "announcing that I am leaving the company"]
EMAIL_TONES = ["short", "friendly", "formal"]

COMPARE_PAIRS = [("Python", "JavaScript"), ("cats", "dogs as pets"), ("renting", "buying a home"),
                 ("electric cars", "petrol cars"), ("SQL databases", "NoSQL databases"), ("tea", "coffee"),
                 ("trains", "planes for a 500 km trip"), ("stocks", "bonds"), ("TCP", "UDP"),
                 ("e-books", "paper books"), ("running", "swimming for fitness"), ("Linux", "Windows"),
                 ("working from home", "working in an office"), ("a laptop", "a desktop computer"),
                 ("solar power", "wind power"), ("classical music", "jazz"), ("mitosis", "meiosis"),
                 ("weather", "climate"), ("viruses", "bacteria"), ("a list", "a tuple in Python"),
                 ("processes", "threads"), ("git merge", "git rebase"), ("credit cards", "debit cards"),
                 ("baking", "frying"), ("a city break", "a beach holiday")]
COMPARE_TEMPLATES = ["Compare {a} and {b}.", "What are the pros and cons of {a} versus {b}?",
                     "Should I choose {a} or {b}? Explain the trade-offs.",
                     "Make a short table comparing {a} and {b}."]


def explanations() -> list[str]:
    out = [t.format(topic=topic, audience=aud)
           for t, topic, aud in product(EXPLAIN_TEMPLATES, EXPLAIN_TOPICS, AUDIENCES)]
    out += [t.format(topic=topic) for t, topic in product(SHORT_EXPLAIN, EXPLAIN_TOPICS)]
    return out


def howtos() -> list[str]:
    return [t.format(task=task) for t, task in product(HOWTO_TEMPLATES, HOWTO_TASKS)]


def lists() -> list[str]:
    return [t.format(k=k, things=things) for t, things, k in product(LIST_TEMPLATES, LIST_THINGS, (3, 5, 7))]


def code() -> list[str]:
    out = [t.format(lang=lang, task=task) for t, lang, task in product(CODE_TEMPLATES, LANGUAGES, CODE_TASKS)]
    out += [t.format(code=snippet) for t, snippet in product(CODE_REVIEW, SNIPPETS)]
    return out


def word_problems(rng: random.Random, count: int = 600) -> list[str]:
    """Arithmetic word problems with small random numbers (the answer is checkable by hand)."""
    out = set()
    while len(out) < count:
        template = rng.choice(WORD_PROBLEMS)
        a, b = rng.randint(2, 40), rng.randint(2, 12)
        out.add(template.format(name=rng.choice(NAMES), a=a, b=b, c=rng.randint(1, a + b - 1),
                                t=a * rng.randint(3, 20), p=rng.choice((10, 15, 20, 25, 30, 40, 50))))
    return sorted(out)


def passages() -> list[str]:
    return [f"{task}\n\n{text}" for task, text in product(PASSAGE_TASKS, PASSAGES)]


def emails() -> list[str]:
    return [f"Write a {tone} email to {who} {why}."
            for tone, who, why in product(EMAIL_TONES, RECIPIENTS, EMAIL_PURPOSES)]


def comparisons() -> list[str]:
    return [t.format(a=a, b=b) for t, (a, b) in product(COMPARE_TEMPLATES, COMPARE_PAIRS)]


def is_holdout(prompt: str) -> bool:
    """Stable across runs, Python versions and seeds (sha256, not hash())."""
    return int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:4], "big") % HOLDOUT_EVERY == 0


@lru_cache(maxsize=1)
def prompt_groups() -> tuple[tuple[str, ...], ...]:
    """Every builtin prompt by kind, in a fixed order that does not depend on any seed."""
    rng = random.Random(20240611)
    groups = [explanations(), howtos(), lists(), code(), word_problems(rng), passages(), emails(),
              comparisons()]
    seen: set[str] = set()
    unique = []
    for group in groups:
        unique.append(tuple(p for p in dict.fromkeys(group) if p not in seen))
        seen.update(unique[-1])
    return tuple(unique)


def prompt_pool() -> list[str]:
    return [p for group in prompt_groups() for p in group]


def builtin_prompts(n: int | None = None, seed: int = 0, split: str = "train") -> list[str]:
    """`n` distinct prompts of `split` ('train' or 'holdout'); None = all.

    Each kind is shuffled by `seed`, then the kinds are interleaved round-robin, so that even a
    short prefix (--limit 64) mixes explanations, how-tos, lists, code, arithmetic, passages,
    emails and comparisons.
    """
    if split not in ("train", "holdout"):
        raise SpecdraftError(f"builtin prompts: unknown split {split!r}; use 'train' or 'holdout'")
    if n is not None and n < 0:
        raise SpecdraftError(f"builtin prompts: n must be >= 0, got {n}")
    want_holdout = split == "holdout"
    rng = random.Random(seed)
    queues = []
    for group in prompt_groups():
        kept = [p for p in group if is_holdout(p) == want_holdout]
        rng.shuffle(kept)
        queues.append(kept)
    prompts = []
    for i in range(max(len(q) for q in queues)):
        prompts.extend(q[i] for q in queues if i < len(q))
    return prompts if n is None else prompts[:n]
