"""The README.md model card `specdraft export` writes into each export folder: what the drafter is
for (target id and fingerprint, aux layers, draft vocab), how it was trained (TTT steps, data
size) and how well (τ on held-out prompts), and the serve commands to paste.

Read from the files a run leaves (config.yaml, metrics.jsonl, the checkpoint's inputs.json,
bench.json, eval.json); nothing from train/ is imported. A fact not found is written "unknown"."""

from __future__ import annotations

import json
from pathlib import Path

from filelock import FileLock

from specdraft import run_layout
from specdraft.families import family_of, layout
from specdraft.io import write_json

UNKNOWN = "unknown"


def run_folder_of(ckpt: Path) -> Path | None:
    """The run folder holding this checkpoint (RUN/best, RUN/checkpoints/epoch-N), else None."""
    for folder in (ckpt, *list(ckpt.resolve().parents)[:3]):
        if run_layout.config_file(folder).is_file() and run_layout.metrics_file(folder).is_file():
            return folder
    return None


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _yaml(path: Path) -> dict:
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
        return data if isinstance(data, dict) else {}
    except Exception:   # a broken config.yaml costs the card a line, not the export
        return {}


def _tokens_trained(metrics: Path) -> int | None:
    """tokens_seen of the last train record of metrics.jsonl (all epochs)."""
    last = None
    try:
        with open(metrics) as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("split") == "train" and "tokens_seen" in rec:
                    last = rec["tokens_seen"]
    except OSError:
        return None
    return last if isinstance(last, int) else None


def _newest_epoch_inputs(run: Path) -> dict:
    """inputs.json of the run's newest epoch checkpoint: a run's data is one for all its checkpoints,
    and best/ of runs trained before best/ carried its own copy has none."""
    epochs = [(int(p.name.split("-")[-1]), p) for p in (run / run_layout.CHECKPOINTS).glob("epoch-*")
              if p.name.split("-")[-1].isdigit()]
    return _json(max(epochs)[1] / "inputs.json") if epochs else {}


def facts(ckpt: Path, cfg, target_identity: dict | None = None) -> dict:
    """What the card says about the drafter's origin, from the run around `ckpt` when there is one."""
    run = run_folder_of(ckpt)
    inputs = _json(ckpt / "inputs.json") or (_newest_epoch_inputs(run) if run else {})
    config = _yaml(run_layout.config_file(run)) if run else {}
    target = inputs.get("target") or {}
    ident = target_identity or {}
    out = {
        "run": str(run) if run else None,
        "target": target.get("id") or cfg.verifier or ident.get("name") or UNKNOWN,
        "fingerprint": target.get("fingerprint") or ident.get("fingerprint") or UNKNOWN,
        "ttt_steps": config.get("ttt_steps", UNKNOWN),
        "epochs": config.get("epochs", UNKNOWN),
        "samples": inputs.get("num_samples", UNKNOWN),
        "tokens": inputs.get("num_tokens", UNKNOWN),
        "tokens_trained": (_tokens_trained(run_layout.metrics_file(run)) if run else None) or UNKNOWN,
        "tau_bench": None, "tau_eval": None,
    }
    if run:
        bench = _json(run / "bench.json")
        eagle = (bench.get("methods") or {}).get("eagle3") or {}
        if isinstance(eagle.get("accept_len"), (int, float)):
            bc = bench.get("config") or {}
            out["tau_bench"] = {"accept_len": eagle["accept_len"], "speedup": eagle.get("speedup"),
                                "k": bc.get("k"), "prompts": bc.get("num_prompts"),
                                "source": bc.get("prompts")}
        ev = _json(run / "eval.json")
        if isinstance(ev.get("accept_len"), (int, float)):
            out["tau_eval"] = {"accept_len": ev["accept_len"], "split": ev.get("split"), "k": ev.get("k"),
                               "by_k": ev.get("accept_len_by_k") if isinstance(ev.get("accept_len_by_k"), list) else []}
    return out


def render(facts: dict, cfg, *, out: Path, layout: str, dtype: str, embeddings: bool,
           speculative_tokens: int, weight_bytes: int) -> str:
    """The README.md text."""
    target, export = facts["target"], str(Path(out).resolve())
    emb = ("not included: vLLM and SGLang use the target's (verified equal at export)" if not embeddings
           else "included (a copy; vLLM shares the target's when they are equal)")
    lines = [
        f"# EAGLE-3 drafter for {target}",
        "",
        f"Exported by specdraft (`{layout}` layout, {dtype}). Lossless speculative decoding: the target's "
        "outputs are unchanged, the drafter only proposes tokens.",
        "",
        "| | |", "|---|---|",
        f"| target | `{target}` |",
        f"| target fingerprint | `{facts['fingerprint']}` |",
        f"| aux layer ids | {list(cfg.aux_layer_ids) or UNKNOWN} |",
        f"| draft vocab size | {cfg.draft_vocab_size} (target vocab {cfg.vocab_size}) |",
        f"| hidden size | {cfg.hidden_size} |",
        f"| TTT steps | {facts['ttt_steps']} |",
        f"| epochs | {facts['epochs']} |",
        f"| training data | {_data_size(facts)} |",
        f"| τ at K={speculative_tokens} (what it serves) | {_tau(facts, speculative_tokens)} |",
        f"| weights | {weight_bytes / 1e6:.1f} MB, {dtype} |",
        f"| embeddings | {emb} |",
        f"| run | {facts['run'] or UNKNOWN} |",
        "",
        "τ is the mean number of tokens accepted per target forward pass (1 = no speedup).",
        "",
    ]
    for engine, note, command in serve_commands(target, export, speculative_tokens, layout, sglang_missing(cfg),
                                                dict(family_of(cfg).vllm_speculative)):
        lines += [f"## Serve with {engine}", ""] + ([note, ""] if note else []) + (
            ["```bash", command, "```", ""] if command else [])
    lines += ["See specdraft's docs/serving.md for what each engine reads from this folder.", ""]
    return "\n".join(lines)


EXPORTS_FILE = "exports.json"   # in the run folder: where its drafter was exported (read by `specdraft report`)
EXPORTS_LOCK = ".exports.lock"  # held while an export updates exports.json


def record_export(ckpt: Path, out: Path, layout: str, dtype: str, speculative_tokens: int) -> None:
    """Note in the run folder (RUN/exports.json) where its drafter was exported, so the run's report
    can show the path and the serve commands. One entry per export folder, the latest kept; an
    export of a checkpoint outside any run records nothing."""
    run = run_folder_of(ckpt)
    if run is None:
        return
    with FileLock(run / EXPORTS_LOCK):   # two exports at once: each reads the other's entry
        entries = _json(run / EXPORTS_FILE).get("exports") or []
        out_path = str(Path(out).resolve())
        entries = [e for e in entries if isinstance(e, dict) and e.get("out") != out_path]
        entries.append({"out": out_path, "layout": layout, "dtype": dtype,
                        "num_speculative_tokens": int(speculative_tokens), "checkpoint": str(Path(ckpt).resolve())})
        write_json(run / EXPORTS_FILE, {"exports": entries})


def sglang_missing(cfg) -> str | None:
    """What of this drafter SGLang cannot serve: its family's answer, or the family itself when it
    has no SGLang layout."""
    sglang = layout(family_of(cfg), "sglang")
    return f"{family_of(cfg).model_type} drafters" if sglang is None else sglang.unsupported(cfg)


def serve_commands(target: str, export: str | Path, speculative_tokens: int, layout: str,
                   sglang_missing: str | None = None, vllm_keys: dict | None = None) -> list[tuple[str, str, str]]:
    """(engine, note, command) to paste for an export folder: the model card and `specdraft report`
    both show these, so the two never disagree. SGLang reads only the SGLang layout: for another
    layout the note says to export again, and the command names that second folder; a drafter using
    what SGLang lacks (`sglang_missing`) gets vLLM's command only. `vllm_keys`: the family's keys of
    vLLM's speculative config (P-EAGLE: eagle3 with parallel_drafting, DFlash: dflash)."""
    serve_target = target if target and target != UNKNOWN else "TARGET"
    export, k = str(export), int(speculative_tokens)
    spec = json.dumps({**(vllm_keys or {"method": "eagle3"}), "model": export, "num_speculative_tokens": k})
    vllm = f"vllm serve {serve_target} \\\n  --speculative-config '{spec}'"
    if layout == "speculators":   # a speculators folder names its target: vLLM's short form
        vllm = f"vllm serve {export}\n# or, with the draft length chosen here:\n" + vllm
    if sglang_missing:
        return [("vLLM", "", vllm),
                ("SGLang", f"SGLang cannot serve this drafter: it does not implement {sglang_missing}.", "")]
    note, sglang_path = "", export
    if layout != "sglang":
        sglang_path = export + "-sglang"
        note = f"SGLang reads the SGLang layout: export again with `--format sglang --out {sglang_path}`, then"
    sglang = (f"python -m sglang.launch_server --model-path {serve_target} \\\n"
              f"  --speculative-algorithm EAGLE3 \\\n  --speculative-draft-model-path {sglang_path} \\\n"
              f"  --speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}")
    return [("vLLM", "", vllm), ("SGLang", note, sglang)]


def _data_size(f: dict) -> str:
    if f["samples"] == UNKNOWN and f["tokens"] == UNKNOWN:
        return UNKNOWN
    text = f"{f['samples']} samples, {f['tokens']} tokens"
    if f["tokens_trained"] != UNKNOWN:
        text += f" ({f['tokens_trained']} tokens trained over all epochs)"
    return text


def _tau(f: dict, k: int) -> str:
    """τ measured at the K the export serves: eval's τ at that K (it measures every K up to its own),
    bench's only when bench ran that K; a τ at another K is named with its K."""
    parts = []
    if f["tau_eval"]:
        e = f["tau_eval"]
        by_k = e.get("by_k") or []
        if k < len(by_k) and isinstance(by_k[k], (int, float)):
            parts.append(f"{by_k[k]:.2f} (eval, {e.get('split')})")
        else:
            parts.append(f"{e['accept_len']:.2f} at K={e.get('k')} (eval, {e.get('split')}; K={k} not measured)")
    if f["tau_bench"]:
        b = f["tau_bench"]
        speed = f", {b['speedup']:.2f}x vs greedy" if isinstance(b.get("speedup"), (int, float)) else ""
        at = "" if b.get("k") == k else f" at K={b.get('k')}"
        parts.append(f"{b['accept_len']:.2f}{at} (bench, {b.get('prompts')} prompts of {b.get('source')}{speed})")
    return "; ".join(parts) or UNKNOWN
