"""`prepare --conversations builtin:0.5,self:0.5`: a mixture of the sources prepare already reads.

Each part is SOURCE:WEIGHT, SOURCE one of `builtin`, `self`, `pydoc`, a .jsonl/.json/.parquet file or a
hub dataset id (org/name). The weights are shares of --limit (positive, normalised), and the
mixture holds exactly --limit conversations: each part's count is its share of --limit, rounded
by largest remainder so that the counts sum to --limit. Each part draws its count in a seeded
order (builtin: its pool in --seed's order; a file or dataset: its records shuffled with --seed;
self: the questions the target writes with --seed), and the parts are interleaved by
`interleave`, so the same command gives the same conversations in the same order.
"""

from __future__ import annotations

import math
import random
import re
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

from specdraft.data.conversations import Conversation, load_conversations, source_kind
from specdraft.errors import SpecdraftError

HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")
PARTS_HELP = "each part is builtin, self, pydoc, a .jsonl/.json/.parquet file or a hub dataset id (org/name)"


@dataclass
class Part:
    source: str     # builtin, self, pydoc, a file path or a hub dataset id
    weight: float   # as written
    share: float    # weight / sum of the weights
    samples: int    # conversations drawn from it: its share of --limit

    def record(self) -> dict:
        """The part in prepare.json's `mixture`."""
        return asdict(self)


def is_mixture(source: str) -> bool:
    """A comma list, or one SOURCE:WEIGHT (`self:N` keeps its meaning: N questions; a file that
    exists is that file)."""
    if "," in source:
        return True
    if source == "self" or source.startswith("self:") or Path(source).expanduser().exists():
        return False
    name, sep, weight = source.rpartition(":")
    return bool(sep) and (name in ("builtin", "pydoc") or bool(name) and is_number(weight))


def is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def parse_mixture(source: str, limit: int | None) -> list[Part]:
    """The parts of --conversations SOURCE with their samples of --limit; one-line errors."""
    where = f"--conversations {source}"
    names, weights = [], []
    for raw in source.split(","):
        text = raw.strip()
        name, sep, weight_text = text.rpartition(":")
        if not text:
            raise SpecdraftError(f"{where}: an empty part; remove the extra comma")
        if not sep or not name:
            raise SpecdraftError(f"{where}: part '{text}' has no weight; write SOURCE:WEIGHT, e.g. {text}:0.5")
        try:
            weight = float(weight_text)
        except ValueError:
            raise SpecdraftError(f"{where}: part '{text}': weight '{weight_text}' is not a number; "
                                 f"write SOURCE:WEIGHT, e.g. {name}:0.5") from None
        if not (math.isfinite(weight) and weight > 0):
            raise SpecdraftError(f"{where}: part '{text}': the weight must be a positive number "
                                 f"(a share of --limit), e.g. {name}:0.5; drop the part to leave it out")
        check_part(where, name)
        if name in names:
            raise SpecdraftError(f"{where}: part '{name}' is given twice; give it once, with the sum of its weights")
        names.append(name)
        weights.append(weight)
    if limit is None:
        raise SpecdraftError(f"{where}: a mixture needs --limit (the number of conversations of the whole "
                             "mixture, shared by the weights), e.g. --limit 256")
    total = sum(weights)
    return [Part(source=name, weight=weight, share=weight / total, samples=count)
            for name, weight, count in zip(names, weights, part_counts(weights, limit))]


def check_part(where: str, name: str) -> None:
    kind = source_kind(name)
    if kind == "self" and name != "self":
        raise SpecdraftError(f"{where}: part '{name}': in a mixture self takes its count from its weight; "
                             "write self:WEIGHT, e.g. self:0.5")
    if kind == "file" and not Path(name).expanduser().is_file():
        raise SpecdraftError(f"{where}: part '{name}': file not found; check the path ({PARTS_HELP})")
    if kind == "hub" and not HUB_ID.fullmatch(name):
        raise SpecdraftError(f"{where}: unknown part '{name}'; {PARTS_HELP}")


def part_counts(weights: list[float], limit: int) -> list[int]:
    """limit x each weight's share, rounded by largest remainder (ties: the earlier part) so that
    the counts sum to limit."""
    total = sum(map(Fraction, weights))
    quotas = [Fraction(w) * limit / total for w in weights]
    counts = [math.floor(q) for q in quotas]
    by_remainder = sorted(range(len(weights)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[:limit - sum(counts)]:
        counts[i] += 1
    return counts


def draw(source: str, part: Part, split: str, seed: int, regenerate: bool) -> list[Conversation]:
    """The part's `samples` conversations (self: none yet, the target writes them once loaded)."""
    if part.source in ("builtin", "self") and not regenerate:
        raise SpecdraftError(f"--conversations {source}: part '{part.source}' is questions without answers; "
                             "pass --regenerate so the target writes them")
    if part.source == "builtin":
        drawn = list(load_conversations("builtin", seed=seed, limit=part.samples, regenerate=regenerate))
    elif part.source == "self":
        return []
    else:
        records = list(load_conversations(part.source, split=split, seed=seed, regenerate=regenerate))
        random.Random(seed).shuffle(records)
        drawn = records[:part.samples]
    if len(drawn) < part.samples:
        raise SpecdraftError(f"--conversations {source}: part '{part.source}' has {len(drawn)} conversations, "
                             f"its share of --limit is {part.samples}; "
                             "lower its weight or --limit")
    return drawn


def interleave(groups: list[list]) -> list:
    """The parts' items spread evenly: item j of a part of n sits at (j + 1/2) / n of the whole
    (ties: the earlier part first), so every stretch of the mixture holds about each part's share."""
    keyed = [(Fraction(2 * j + 1, 2 * len(group)), i, item)
             for i, group in enumerate(groups) for j, item in enumerate(group)]
    return [item for _, _, item in sorted(keyed, key=lambda k: (k[0], k[1]))]
