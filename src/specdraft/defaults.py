"""Defaults that several stages share, written once so that they cannot drift apart (issue 28):
the draft length bench, generate, eval, probe and export use when -k is not given, and the
longest chain that -k auto and `plan` consider; how -k, --draft-stop and --compute-dtype are read."""

from __future__ import annotations

from typing import Optional

from specdraft.errors import SpecdraftError

DRAFT_LENGTH = 3     # draft tokens per round (vLLM's num_speculative_tokens) when -k is not given: the
                     # default TTT depth and a block family's default block (4 slots = anchor + 3), so it serves
                     # as trained
LONGEST_CHAIN = 8    # the longest draft chain -k auto and `specdraft plan` consider
K_MAX = 256          # draft tokens per round: far beyond any drafter's use, far below a typo's
NUM_SPEC = "--num-speculative-tokens"
COMPUTE_DTYPES = ("auto", "float32", "bfloat16", "float16")     # --compute-dtype of prepare, capture, bench, generate


def check_compute_dtype(value: str) -> None:
    if value not in COMPUTE_DTYPES:
        raise SpecdraftError(f"--compute-dtype {value}: use {', '.join(COMPUTE_DTYPES)}")


def draft_length_option(text: Optional[str]) -> int | str | None:
    """-k as the CLI reads it: a whole number 1..K_MAX, "auto", or None (not given)."""
    if text is None:
        return None
    if text.strip().lower() == "auto":
        return "auto"
    try:
        k = int(text)
    except ValueError:
        raise SpecdraftError(f"{NUM_SPEC} {text}: expected a whole number >= 1 or auto") from None
    if not 1 <= k <= K_MAX:
        raise SpecdraftError(f"{NUM_SPEC} {k}: must be 1..{K_MAX} (or auto)")
    return k


def draft_length(option: int | str | None, default_auto: bool = False) -> Optional[int]:
    """The K of a -k option (draft_length_option's): None = auto, chosen by the cost model. Not
    given: auto where `default_auto` (a drafter's chain in bench/generate), else DRAFT_LENGTH."""
    if option is None:
        return None if default_auto else DRAFT_LENGTH
    return None if option == "auto" else option


def parse_draft_stop(text: Optional[str]):
    """--draft-stop: None (off), a probability in [0, 1], or "auto"."""
    if text is None or text.strip().lower() == "auto":
        return None if text is None else "auto"
    try:
        p = float(text)
    except ValueError:
        raise SpecdraftError(f"--draft-stop {text}: expected a probability in [0, 1] or auto") from None
    if not 0.0 <= p <= 1.0:
        raise SpecdraftError(f"--draft-stop {text}: must lie in [0, 1] (a probability), or auto")
    return p
