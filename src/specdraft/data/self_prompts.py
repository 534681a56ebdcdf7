"""`--conversations self:N`: the target writes its own questions.

The chat template is rendered up to the opening of a user turn (system prompt and role header,
no content) and the target samples what a user would ask there; regeneration then answers each
question as usual. Prompts written this way follow the target's own idea of a user, not the
templates of a fixed prompt pool, which is what a drafter meets on unseen prompts.

Resumable like regeneration: every batch of questions is appended to OUT/questions.jsonl (fsync'ed)
and a re-run reuses what is there; each batch is sampled with its own seed, so a re-run writes
the same questions.

Second turns (`prepare --follow-ups SHARE`): after the target answered a self-written question,
the conversation so far is rendered up to the opening of the next user turn and the target writes
the user's follow-up there, the same way (OUT/follow_ups.jsonl, resumable); regeneration then
answers it with the first answer kept.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from pathlib import Path

import torch

from specdraft.data.regenerate import append_progress, load_progress
from specdraft.data.render import Chat, decode_question, encode
from specdraft.errors import SpecdraftError
from specdraft.progress import progress as progress_of

QUESTIONS_FILE = "questions.jsonl"
FOLLOW_UPS_FILE = "follow_ups.jsonl"
SELF_WRITTEN = "self-written question"   # Conversation.where of the questions written here
FOLLOW_UP_CANDIDATES = 4       # rows sampled per follow-up: the first usable one is kept
MARK = "\u0000SPECDRAFT_QUESTION\u0000"
MIN_WORDS = 3                  # shorter outputs are openings the target abandoned, not questions


def user_turn_opening(chat: Chat, before: list[dict] | None = None) -> str:
    """The template's text up to where a user turn's content starts (system prompt included),
    after the turns `before` (a follow-up's conversation so far, rendered as the template renders
    history: earlier reasoning dropped where it drops it) if given."""
    text = chat.text([*(before or []), {"role": "user", "content": MARK}], add_generation_prompt=False,
                     where="--conversations self")
    if MARK not in text:
        raise SpecdraftError("--conversations self: the chat template does not render the user's text verbatim; "
                             "pass conversations (a file or dataset) instead")
    return text[:text.index(MARK)]


@torch.no_grad()
def sample_questions(target, opening_ids: list[int], rows: int, seed: int, max_new_tokens: int,
                     temperature: float, end_ids: list[int]) -> list[str]:
    """`rows` questions sampled from the user-turn opening (all rows share it: no padding)."""
    tok = target.tokenizer
    device = next(target.model.parameters()).device
    opening = torch.tensor([opening_ids] * rows, device=device)                         # [rows, T]
    torch.manual_seed(seed)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else end_ids[0]
    output = target.model.generate(input_ids=opening, attention_mask=torch.ones_like(opening), do_sample=True,
                                   temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=max_new_tokens,
                                   eos_token_id=list(end_ids), pad_token_id=pad_id)
    texts = [decode_question(tok, ids, True, end_ids) for ids in output[:, opening.shape[1]:].tolist()]
    return [text for text, truncated in texts if not truncated and len(text.split()) >= MIN_WORDS]


def written_by(target, chat: Chat) -> dict:
    """The target, the dtype it computed in and the template arguments, as settings of the questions written
    (float32 and no arguments add nothing: the keys of older runs hold). A bf16 target writes other questions."""
    dtype = str(next(target.model.parameters()).dtype).removeprefix("torch.")
    return {"target": target.identity["fingerprint"], **({"compute_dtype": dtype} if dtype != "float32" else {}),
            **({"chat_template_kwargs": chat.kwargs} if chat.kwargs else {})}


def batch_seed(seed: int, batch: int) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:questions:{batch}".encode()).digest()[:8], "big") % (2**63)


def write_questions(target, count: int, out: Path, chat: Chat, seed: int = 0, batch_size: int = 64,
                    max_new_tokens: int = 96, temperature: float = 1.0, console=None,
                    deadline: float | None = None) -> list[list[dict]]:
    """`count` distinct questions the target wrote, as one-user-turn conversations (resumable). `deadline`
    (time.perf_counter(), prepare --budget-minutes): no batch starts after it once one question is written,
    and fewer questions come back, said in a note (a slow target wrote 64 questions for hours past a budget)."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / QUESTIONS_FILE
    batches = sorted(load_progress(path).values(), key=lambda r: r["batch"])
    written = list(dict.fromkeys(q for r in batches for q in r["questions"]))
    settings = {"seed": seed, "max_new_tokens": max_new_tokens, "temperature": temperature,
                **written_by(target, chat)}
    if batches and batches[0].get("settings") != settings:
        raise SpecdraftError(f"{path}: written with other settings ({batches[0].get('settings')}); "
                             "delete it or use another --out")
    opening_ids = encode(target.tokenizer, user_turn_opening(chat))   # rendered once, every batch starts here
    with progress_of("writing questions", count, min(len(written), count), "questions", console=console) as tracker:
        batch, empty_batches = len(batches), 0
        while len(written) < count and not (deadline is not None and written and time.perf_counter() > deadline):
            new = sample_questions(target, opening_ids, batch_size, batch_seed(seed, batch), max_new_tokens,
                                   temperature, chat.end_ids)
            append_progress(path, [{"key": f"batch-{batch}", "batch": batch, "settings": settings,
                                    "questions": new}])
            before = len(written)
            written = list(dict.fromkeys(written + new))
            tracker.advance(min(len(written), count) - min(before, count))
            empty_batches = empty_batches + 1 if len(written) == before else 0
            if empty_batches >= 3:
                raise SpecdraftError(f"--conversations self: the target wrote no new usable question in 3 batches "
                                     f"({len(written)} so far); use a chat model or pass conversations")
            batch += 1
    if len(written) < count:
        print(f"note: --budget-minutes: the budget ran out while the target wrote questions; {len(written)} of "
              f"{count} written (the rest are written by a later prepare into this --out)", file=sys.stderr)
    return [[{"role": "user", "content": q}] for q in written[:count]]


def follow_up_indices(count: int, share: float, seed: int) -> list[int]:
    """Which of `count` self-written conversations get a follow-up: round(share x count) of them,
    drawn with `seed`, in order."""
    return sorted(random.Random(f"{seed}:follow-ups").sample(range(count), round(share * count)))


def follow_up_key(conversation: list[dict], settings: dict) -> str:
    blob = json.dumps({"messages": conversation, "settings": settings}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def write_follow_ups(target, conversations: list[list[dict]], out: Path, chat: Chat, seed: int = 0,
                     max_new_tokens: int = 96, temperature: float = 1.0, console=None) -> list[str | None]:
    """For each answered conversation, the user's next question written by the target after the
    answer (None where none of FOLLOW_UP_CANDIDATES rows gave a usable one); resumable."""
    path = out / FOLLOW_UPS_FILE
    settings = {"seed": seed, "max_new_tokens": max_new_tokens, "temperature": temperature,
                **written_by(target, chat)}
    written = load_progress(path)
    keys = [follow_up_key(c, settings) for c in conversations]
    with progress_of("writing follow-ups", len(keys), sum(k in written for k in keys), "questions",
                     console=console) as tracker:
        for key, conversation in zip(keys, conversations):
            if key in written:
                continue
            opening_ids = encode(target.tokenizer, user_turn_opening(chat, conversation))
            seed_of = int.from_bytes(hashlib.sha256(f"{seed}:follow-up:{key}".encode()).digest()[:8], "big") % 2**63
            found = sample_questions(target, opening_ids, FOLLOW_UP_CANDIDATES, seed_of, max_new_tokens,
                                     temperature, chat.end_ids)
            written[key] = {"key": key, "follow_up": found[0] if found else None}
            append_progress(path, [written[key]])
            tracker.advance(1)
    return [written[k]["follow_up"] for k in keys]
