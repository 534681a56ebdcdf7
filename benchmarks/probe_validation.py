"""Does the hidden-state probe's verdict predict whether fine-tuning beats training from scratch?

The seed: a drafter for Kimi-K2, fine-tuned for Kimi-K2.5, plateaued at 38% while from scratch
reached 74.7%. `specdraft probe --model A --model B` is meant to say so before the fine-tune. Here,
on tiny Llamas (H=64, 8 layers, byte vocab): train a drafter for target A, then for two new targets
  near: A with small Gaussian noise on every weight (a "minor revision")
  far:  an unrelated random init (another seed)
fine-tune A's drafter (lm_head remapped to the new target's draft vocab) and train one from scratch
with the same budget on the same data, and run the hidden-state probe A vs the new target. The
verdict must name the start that won: "close" -> fine-tune, "far" -> scratch.

Data for each target is its own sampled text (regeneration: drafters learn the target's own
distribution). Targets are random inits with a sharpened lm_head (specdraft.testing.tiny_llama), so
their next-token choices are structured enough for a drafter to learn.

    .venv/bin/python benchmarks/probe_validation.py            # ~5 min on 2 CPU cores
    -> benchmarks/results/probe_validation.{json,md,png}
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from specdraft import vocab as vocab_mod
from specdraft.analysis import probe
from specdraft.api import capture_samples, load_run, load_target, RunConfig, save_prepared, train
from specdraft.data.capture import recording
from specdraft.data.store import StoreWriter, new_manifest
from specdraft.targets import default_aux_layers
from specdraft.testing import tiny_llama, tiny_tokenizer

RESULTS = Path(__file__).parent / "results"
SAMPLES, PROMPT, NEW_TOKENS = 160, 4, 60     # per target: sampled continuations of random 4-byte prompts
DRAFT = 128                                  # draft vocab size
NEAR_NOISE = 0.1                             # near target: weight + N(0, (0.1 * std(weight))^2)
EPOCHS_A, EPOCHS_NEW = 5, 3                  # drafter for A; then the fine-tune / scratch budget


def save_target(folder: Path, model) -> str:
    tok = tiny_tokenizer()
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def make_targets(root: Path) -> dict[str, str]:
    tok = tiny_tokenizer()
    a = tiny_llama(vocab_size=len(tok), eos_token_id=tok.eos_token_id, seed=0)
    near = tiny_llama(vocab_size=len(tok), eos_token_id=tok.eos_token_id, seed=0)
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for p in near.parameters():
            p.add_(torch.randn(p.shape, generator=g) * NEAR_NOISE * p.float().std().clamp_min(1e-3))
    far = tiny_llama(vocab_size=len(tok), eos_token_id=tok.eos_token_id, seed=1)
    return {name: save_target(root / "targets" / name, m) for name, m in (("A", a), ("near", near), ("far", far))}


def workspace(root: Path, model: str) -> dict:
    """Sampled text from `model` (prepared data), its hidden store and draft vocab."""
    target = load_target(model)
    g = torch.Generator().manual_seed(7)
    prompts = torch.randint(7, 7 + 200, (SAMPLES, PROMPT), generator=g)       # [S, P], one batch
    torch.manual_seed(7)
    with torch.no_grad():
        out = target.model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True,
                                    temperature=0.7, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    ids = out.tolist()                                                         # [S, P + NEW_TOKENS]
    masks = [[0] * PROMPT + [1] * (len(row) - PROMPT) for row in ids]
    save_prepared(root / "data", {"input_ids": ids, "loss_mask": masks, "messages": [""] * len(ids)},
                  {"source": "probe_validation", "target": target.identity})
    layers = default_aux_layers(target.num_layers)
    writer = StoreWriter(root / "hidden", new_manifest(target.identity, layers, "float32", target.hidden_size))
    with recording(target.model, layers) as rec:
        aux, last, offsets = capture_samples(target.model, ids, layers, torch.float32, 8192, rec)
    writer.write_shard(aux, last, torch.tensor(sum(ids, [])), torch.tensor(sum(masks, []), dtype=torch.uint8),
                       offsets)
    writer.save(complete=True)
    counts = vocab_mod.count_tokens(torch.tensor(sum(ids, [])).numpy(), torch.tensor(sum(masks, [])).numpy(),
                                    target.vocab_size)
    d2t, t2d = vocab_mod.mapping_from_counts(counts, DRAFT)
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {"target_id": target.name,
                                              "fingerprint": target.identity["fingerprint"]}),
                   root / "vocab.safetensors")
    return {"root": root, "model": model, "data": str(root / "data")}


def run_config(ws: dict, out: Path, epochs: int, **kw) -> RunConfig:
    return RunConfig(out=str(out), store=str(ws["root"] / "hidden"), vocab=str(ws["root"] / "vocab.safetensors"),
                     model=ws["model"], max_tokens=256, rows_per_batch=1, epochs=epochs, lr=3e-3,
                     warmup_steps=5, log_every=5, val_fraction=0.15, progress=False, precision="fp32",
                     ttt_steps=3, **kw)


def val_per_epoch(run: Path) -> list[dict]:
    return [{"epoch": e + 1, "full_acc_0": round(r["full_acc_0"], 4), "accept_len": round(r["accept_len"], 4),
             "loss": round(r["loss"], 4)} for e, r in sorted(load_run(run).val_by_epoch().items())]


def main() -> None:
    torch.set_num_threads(2)
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp/specdraft_probe_validation")
    start = time.perf_counter()
    targets = make_targets(root)
    ws = {name: workspace(root / "ws" / name, model) for name, model in targets.items()}
    train(run_config(ws["A"], root / "runs" / "A", EPOCHS_A))
    drafter_a = root / "runs" / "A" / "best"
    result = {"settings": {"samples": SAMPLES, "tokens_per_sample": PROMPT + NEW_TOKENS, "draft_vocab": DRAFT,
                           "near_noise": NEAR_NOISE, "epochs_A": EPOCHS_A, "epochs_new": EPOCHS_NEW,
                           "thresholds": {"close": probe.CLOSE, "far": probe.FAR}},
              "drafter_A": val_per_epoch(root / "runs" / "A"), "pairs": {}}
    for name in ("near", "far"):
        w = ws[name]
        train(run_config(w, root / "runs" / f"{name}-finetune", EPOCHS_NEW, from_pretrained=str(drafter_a)))
        train(run_config(w, root / "runs" / f"{name}-scratch", EPOCHS_NEW))
        hidden = probe.run(vocabs=[], models=[targets["A"], targets[name]], data=w["data"], drafter=None,
                           samples=32, max_tokens=512, run=root / "runs" / f"{name}-finetune")[0]
        ft, sc = val_per_epoch(root / "runs" / f"{name}-finetune"), val_per_epoch(root / "runs" / f"{name}-scratch")
        winner = "finetune" if ft[-1]["full_acc_0"] > sc[-1]["full_acc_0"] else "scratch"
        verdict = hidden["verdict"].split(" ", 1)[0]
        says = {"close": "finetune", "same": "finetune", "far": "scratch"}.get(verdict, "either")
        aux = [s for s in hidden["layers"] if s["layer"].startswith("aux")]
        result["pairs"][name] = {
            "finetune": ft, "scratch": sc, "winner": winner,
            "probe": {"verdict": hidden["verdict"], "says": says,
                      "min_aux_cosine": round(min(s["cosine"] for s in aux), 4),
                      "min_aux_cka": round(min(s["cka"] for s in aux), 4), "layers": hidden["layers"]},
            "verdict_matches": says == winner}
    result["seconds"] = round(time.perf_counter() - start, 1)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "probe_validation.json").write_text(json.dumps(result, indent=2) + "\n")
    (RESULTS / "probe_validation.md").write_text(table(result))
    plot(result, RESULTS / "probe_validation.png")
    print(table(result))


def table(result: dict) -> str:
    lines = ["# Probe verdict vs fine-tune outcome (tiny Llamas, H=64)\n",
             "| pair | epoch | finetune full_acc_0 | scratch full_acc_0 | finetune accept_len | scratch accept_len |",
             "|---|---|---|---|---|---|"]
    for name, p in result["pairs"].items():
        for f, s in zip(p["finetune"], p["scratch"]):
            lines.append(f"| A -> {name} | {f['epoch']} | {f['full_acc_0']:.3f} | {s['full_acc_0']:.3f} | "
                         f"{f['accept_len']:.3f} | {s['accept_len']:.3f} |")
    lines += ["", "| pair | min aux cosine | min aux CKA | probe says | winner | match |", "|---|---|---|---|---|---|"]
    for name, p in result["pairs"].items():
        lines.append(f"| A -> {name} | {p['probe']['min_aux_cosine']:.3f} | {p['probe']['min_aux_cka']:.3f} | "
                     f"{p['probe']['says']} | {p['winner']} | {'yes' if p['verdict_matches'] else 'NO'} |")
    lines += ["", "Drafter for A (val per epoch): " + ", ".join(
        f"{r['full_acc_0']:.3f}/{r['accept_len']:.2f}" for r in result["drafter_A"]),
        f"Thresholds: close >= {result['settings']['thresholds']['close']}, far < "
        f"{result['settings']['thresholds']['far']}. Wall time {result['seconds']} s.", ""]
    return "\n".join(lines)


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, (name, p) in zip(axes, result["pairs"].items()):
        for kind, style in (("finetune", "o-"), ("scratch", "s--")):
            ax.plot([r["epoch"] for r in p[kind]], [r["full_acc_0"] for r in p[kind]], style, label=kind)
        ax.set_title(f"A -> {name}: cos {p['probe']['min_aux_cosine']:.2f}, CKA {p['probe']['min_aux_cka']:.2f} "
                     f"-> {p['probe']['says']}", fontsize=9)
        ax.set_xlabel("epoch")
        ax.set_ylabel("val full_acc_0")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()
