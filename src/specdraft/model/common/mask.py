"""The mask slots' token of the families that draft a round in one forward (mask slots after
the last accepted token)."""

from __future__ import annotations


def mask_token_of(target_config) -> int:
    """The mask slots' token: the target's pad token, else its (first) EOS, else 0. Its embedding is
    the target's, frozen; the learned part of a mask slot is mask_hidden."""
    from specdraft.adapter import text_config

    tc = text_config(target_config)           # a vision-language wrapper keeps its ids on either config
    for name in ("pad_token_id", "eos_token_id"):
        value = getattr(target_config, name, None)
        value = getattr(tc, name, None) if value is None else value
        value = value[0] if isinstance(value, (list, tuple)) and value else value
        if isinstance(value, int) and 0 <= value < tc.vocab_size:
            return value
    return 0
