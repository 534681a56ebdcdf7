"""Regeneration with torch's dynamic int8 Linear layers against fp32: tok/s and how many answers match.

    .venv/bin/python benchmarks/regen_int8.py [BATCH] [NEW_TOKENS]      (default 64 48)

One batch of builtin prompts, greedy, through `regenerate.generate_batch` (prepare's own path), fp32
and int8 interleaved twice in one process. The int8 copy quantizes every nn.Linear with per-channel
weight scales (torch.ao's quantize_dynamic, deprecated but present in torch 2.13; torchao is not a
dependency). A measurement, not a feature: on SmolLM2 it was 0.97-1.4x and matched fp32 on 0 of 64
answers (docs/recipes.md, issue 33), so prepare does not offer it.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import warnings

import torch
from torch import nn

from specdraft.data import builtin_prompts
from specdraft.data.regenerate import RegenSettings, generate_batch
from specdraft.data.render import Chat, end_of_turn_ids
from specdraft.api import cpu_label, load_target


def main() -> None:
    batch, new_tokens = (int(a) for a in (sys.argv[1:3] + ["64", "48"][len(sys.argv[1:3]):]))
    warnings.filterwarnings("ignore")
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    fp32 = load_target("default")
    int8 = copy.copy(fp32)
    int8.model = quantize_dynamic(copy.deepcopy(fp32.model), {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8)
    end = end_of_turn_ids(fp32.tokenizer, fp32.model.generation_config)
    chat = Chat(fp32.tokenizer, end)
    prompts = [chat.prompt_ids([{"role": "user", "content": p}]) for p in builtin_prompts.explanations()[:batch]]
    settings = RegenSettings(temperature=0.0, max_new_tokens=new_tokens, seed=0, target="benchmark")
    answers = {}
    print(cpu_label())
    for name, target in (("fp32", fp32), ("int8", int8)) * 2:
        started = time.perf_counter()
        answers[name] = [chat.answer(p, ids, hit).message["token_ids"]
                         for p, (ids, hit) in zip(prompts, generate_batch(target, prompts, settings, end))]
        seconds = time.perf_counter() - started
        tokens = sum(map(len, answers[name]))
        print(f"{name}: {seconds:.1f} s, {tokens} tokens, {tokens / seconds:.1f} tok/s", flush=True)
    same = sum(a == b for a, b in zip(answers["fp32"], answers["int8"]))
    prefix = [len(os.path.commonprefix([a, b])) / max(1, len(a)) for a, b in zip(answers["fp32"], answers["int8"])]
    print(f"answers equal to fp32: {same}/{batch}; mean shared prefix {sum(prefix) / batch:.1%} of the fp32 answer")


if __name__ == "__main__":
    main()
