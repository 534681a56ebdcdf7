"""The README.md model card `specdraft export` writes into each export folder: what the drafter is
for (target id and fingerprint, aux layers, draft vocab), how it was trained (TTT steps, data
size) and how well (τ on held-out prompts), and the serve commands to paste.

Read from the files a run leaves (config.yaml, metrics.jsonl, the checkpoint's inputs.json,
bench.json, eval.json); nothing from train/ is imported. A fact not found is written "unknown"."""

from __future__ import annotations

import json
from pathlib import Path


from specdraft import run_layout
from specdraft.errors import SpecdraftError
from specdraft.families import DEFAULT, Family, family, family_of, layout
from specdraft.metrics import drafter_method, tau_source, tau_text
from specdraft.schemas import typed_json
from specdraft.schemas.bench import BenchFile
from specdraft.schemas.drafter import read_drafter_config
from specdraft.schemas.eval import EvalFile
from specdraft.schemas.exports import ExportRecord

UNKNOWN = "unknown"


def run_folder_of(ckpt: Path) -> Path | None:
    """The run folder holding this checkpoint (RUN/best, RUN/checkpoints/epoch-N), else None."""
    for folder in (ckpt, *list(ckpt.resolve().parents)[:3]):
        if run_layout.config_file(folder).is_file() and run_layout.metrics_file(folder).is_file():
            return folder
    return None


def trained_depth(ckpt: Path) -> int | None:
    """The draft positions the drafter at `ckpt` was trained on (its run's ttt_steps), None outside a run."""
    run = run_folder_of(ckpt)
    steps = _yaml(run_layout.config_file(run)).get("ttt_steps") if run else None
    return steps if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 else None


def _json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _inputs(ckpt: Path) -> dict:
    from specdraft.schemas.inputs import INPUTS_FILE, read_inputs

    return read_inputs(Path(ckpt) / INPUTS_FILE, f"fix or delete it (the record of {ckpt}'s training data)")


def _typed(path: Path, model) -> dict:
    """A run's result file through its schema (a wrong type is one line); {} where it is absent or no JSON object."""
    data = typed_json(path, model, "fix or delete that file (a result the model card reads), then export again")
    return data if isinstance(data, dict) else {}


def _yaml(path: Path) -> dict:
    try:
        import yaml

        data = yaml.safe_load(path.read_text())
        return data if isinstance(data, dict) else {}
    except Exception:   # a broken config.yaml costs the card a line, not the export
        return {}


def _metric_records(metrics: Path, split: str) -> list[dict]:
    """metrics.jsonl's records of one split, unreadable lines skipped ([] without the file)."""
    records = []
    try:
        with open(metrics) as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("split") == split:
                    records.append(rec)
    except OSError:
        return []
    return records


def _tokens_trained(metrics: Path) -> int | None:
    """tokens_seen of the last train record of metrics.jsonl (all epochs)."""
    seen = [rec["tokens_seen"] for rec in _metric_records(metrics, "train") if "tokens_seen" in rec]
    return seen[-1] if seen and isinstance(seen[-1], int) else None


def _newest_epoch_inputs(run: Path) -> dict:
    """inputs.json of the run's newest epoch checkpoint: a run's data is one for all its checkpoints,
    and best/ of runs trained before best/ carried its own copy has none."""
    epochs = run_layout.checkpoints(run, "epoch", holding=())
    return _inputs(epochs[-1][2]) if epochs else {}


def training_inputs(ckpt: Path) -> dict:
    """What an export carries of its run's data (its inputs.json): the checkpoint's inputs.json and
    the run's split (val_fraction, seed from config.yaml), so that `eval` of the export folder can
    leave out the samples it trained on. {} for a checkpoint outside any run with no inputs.json."""
    run = run_folder_of(ckpt)
    inputs = _inputs(ckpt) or (_newest_epoch_inputs(run) if run else {})
    config = _yaml(run_layout.config_file(run)) if run else {}
    if not inputs:
        return {}
    split = {k: config[k] for k in ("val_fraction", "seed") if k in config}
    return {**inputs, **split}


def facts(ckpt: Path, cfg, target_identity: dict | None = None) -> dict:
    """What the card says about the drafter's origin, from the run around `ckpt` when there is one."""
    run = run_folder_of(ckpt)
    inputs = _inputs(ckpt) or (_newest_epoch_inputs(run) if run else {})
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
        "taus": tau_measurements(run) if run else [],
        "trained_against": trained_against(target.get("id") or cfg.verifier or ident.get("name") or ""),
    }
    return out


def trained_against(name: str) -> str | None:
    """The card's line on a verifier whose weights the drafter never saw as served: the GGUF specdraft
    dequantized for that name (the embedded default), whose hub id holds the same model at other precision."""
    from specdraft.targets import dequantized_source

    local = dequantized_source(name)
    if local is None:
        return None
    folder, source = local
    return (f"`{Path(str(source.get('gguf', '?'))).name}` (a GGUF) dequantized into `{folder}`: serve that folder as "
            f"the target for the states it was trained on; `{name}` holds the same model at its own precision "
            "(outputs stay the target's own either way; τ may differ a little)")


# ----------------------------------------------------------------------------- τ: one headline, the rest in a table

def _number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _last_val_tau(metrics: Path) -> float | None:
    """accept_len of the last val record of metrics.jsonl (training's own validation)."""
    values = [(rec.get("metrics") or {}).get("accept_len", rec.get("accept_len"))
              for rec in _metric_records(metrics, "val")]
    numbers = [v for v in values if _number(v)]
    return numbers[-1] if numbers else None


def tau_measurements(run: Path) -> list[dict]:
    """Every τ the run's files hold, each with its K and its prompts ({"tau", "k", "prompts",
    "count", "source", "speedup"}): bench on the natural set and on the builtin hold-out, eval at
    every K it measured, the doctor's, training's last validation. The report's τ table and the
    card's headline read this one list."""
    out = []
    for name in (run_layout.BENCH_NATURAL, run_layout.BENCH):
        bench = _typed(run / name, BenchFile)
        method, m = drafter_method(bench)
        cfg = bench.get("config") if isinstance(bench.get("config"), dict) else {}
        if _number(m.get("accept_len")) and isinstance(cfg.get("k"), int):
            out.append({"tau": m["accept_len"], "k": cfg["k"], "prompts": cfg.get("prompts"),
                        "count": cfg.get("num_prompts"), "source": f"bench {method} ({name})",
                        "speedup": m.get("speedup") if _number(m.get("speedup")) else None,
                        "over_plain": m.get("speedup_over_plain") if _number(m.get("speedup_over_plain")) else None})
    ev = _typed(run / run_layout.EVAL, EvalFile)
    by_k = ev.get("accept_len_by_k") if isinstance(ev.get("accept_len_by_k"), list) else []
    split = "all" if str(ev.get("split", "")).startswith("all") else "held-out"
    count = ev.get("samples") if isinstance(ev.get("samples"), int) else None
    for k, tau in enumerate(by_k):
        if k and _number(tau):
            out.append({"tau": tau, "k": k, "prompts": split, "count": count,
                        "source": f"eval, simulated ({run_layout.EVAL})", "speedup": None})
    doctor = _json(run / run_layout.DOCTOR)
    if _number(doctor.get("tau_held_out")) and isinstance(doctor.get("steps"), int):
        out.append({"tau": doctor["tau_held_out"], "k": doctor["steps"], "prompts": "held-out", "count": None,
                    "source": "doctor, simulated (doctor.json)", "speedup": None})
    val = _last_val_tau(run_layout.metrics_file(run))
    steps = _yaml(run_layout.config_file(run)).get("ttt_steps")
    if val is not None and isinstance(steps, int):
        out.append({"tau": val, "k": steps, "prompts": "held-out", "count": None,
                    "source": "training's last validation (metrics.jsonl)", "speedup": None})
    return out


def headline_tau(taus: list[dict], k: int | None) -> dict | None:
    """The one τ to lead with: on the natural prompt set at the K the export serves, else bench's at
    that K, else eval's at that K; failing those, the natural set's or bench's at the K they ran,
    else eval's at its own (longest) K."""
    def first(pred):
        return next((t for t in taus if pred(t)), None)

    bench = [t for t in taus if t["source"].startswith("bench")]
    return (first(lambda t: t in bench and t["prompts"] == "natural" and t["k"] == k)
            or first(lambda t: t in bench and t["k"] == k)
            or first(lambda t: t["source"].startswith("eval") and t["k"] == k)
            or first(lambda t: t in bench and t["prompts"] == "natural")
            or (bench[0] if bench else None)
            or max((t for t in taus if t["source"].startswith("eval")), key=lambda t: t["k"], default=None)
            or (taus[0] if taus else None))


def headline_text(taus: list[dict], k: int | None) -> str:
    """The headline τ in the shared format, its source, and why its K differs from the served one."""
    best = headline_tau(taus, k)
    if best is None:
        return UNKNOWN
    speed = (f", {best['over_plain']:.2f}x plain decoding in specdraft's loop" if best.get("over_plain") is not None
             else f", {best['speedup']:.2f}x transformers' greedy" if best.get("speedup") is not None else "")
    text = f"{tau_text(best['tau'], best['k'], best['prompts'], best['count'])} ({best['source']}{speed})"
    if k is not None and best["k"] != k:
        text += f"; served at K={k}, which no measurement here ran"
    return text


def render(facts: dict, cfg, *, out: Path, layout: str, dtype: str, embeddings: bool,
           speculative_tokens: int, weight_bytes: int) -> str:
    """The README.md text."""
    target, export = facts["target"], str(Path(out).resolve())
    emb = ("not included: vLLM and SGLang use the target's (verified equal at export)" if not embeddings
           else "included (a copy; vLLM shares the target's when they are equal)")
    lines = [
        f"# {family_of(cfg).title or family_of(cfg).model_type} drafter for {target}",
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
        f"| τ at K={speculative_tokens} (what it serves) | {headline_text(facts['taus'], speculative_tokens)} |",
        f"| weights | {weight_bytes / 1e6:.1f} MB, {dtype} |",
        f"| embeddings | {emb} |",
        f"| run | {facts['run'] or UNKNOWN} |",
        *([f"| trained against | {facts['trained_against']} |"] if facts.get("trained_against") else []),
        "",
        "τ is the mean number of tokens accepted per target forward pass (1 = no speedup; at most K+1).",
        "",
    ]
    if len(facts["taus"]) > 1:
        lines += ["## Every τ measured", "", "| τ | K | prompts | from |", "|---|---|---|---|"]
        lines += [f"| {t['tau']:.2f} | {t['k']} | {tau_source(t['prompts'], t['count'])} | {t['source']} |"
                  for t in facts["taus"]] + [""]
    for engine, note, command in serve_commands(target, export, speculative_tokens, layout, sglang_missing(cfg),
                                                family_of(cfg), sglang_needs(cfg)):
        lines += [f"## Serve with {engine}", ""] + ([note, ""] if note else []) + (
            ["```bash", command, "```", ""] if command else [])
    lines += ["See specdraft's docs/serving.md for what each engine reads from this folder.", ""]
    return "\n".join(lines)


def checkpoint_position(ckpt: Path) -> dict:
    """The epoch and step a training checkpoint was saved at (its val.json), what export.json records."""
    val = _json(Path(ckpt) / "val.json")
    return {k: val[k] for k in ("epoch", "step") if isinstance(val.get(k), int) and not isinstance(val[k], bool)}


def export_record(ckpt: Path, out: Path, layout: str, dtype: str, speculative_tokens: int,
                  position: dict | None = None) -> dict:
    """EXPORT/export.json: the run (its path, and from `out`, the export folder, so a workspace copied elsewhere still
    pairs them) and checkpoint exported (and the epoch and step of the checkpoint read, `position`), its layout, dtype
    and K; how the run's report finds its exports and their serve commands."""
    import os

    run = run_folder_of(ckpt)
    return ExportRecord(run=None if run is None else str(run.resolve()), layout=layout, dtype=dtype,
                        run_from_export=None if run is None else os.path.relpath(run.resolve(), Path(out).resolve()),
                        num_speculative_tokens=int(speculative_tokens), checkpoint=str(Path(ckpt).resolve()),
                        **(position or {})).model_dump(exclude_none=True, exclude={"out"})


def sglang_missing(cfg) -> str | None:
    """What of this drafter SGLang cannot serve: its family's answer, or the family itself when it
    has no SGLang layout."""
    sglang = layout(family_of(cfg), "sglang")
    return f"{family_of(cfg).model_type} drafters" if sglang is None else sglang.unsupported(cfg)


def sglang_needs(cfg) -> str | None:
    """The SGLang release this drafter needs when it is newer than EAGLE-3's first (EAGLE-3.1's options)."""
    sglang = layout(family_of(cfg), "sglang")
    return None if sglang is None else sglang.needs(cfg)


def export_config(export: str | Path):
    """The drafter config an export folder records (config.json's specdraft block), None when unreadable."""
    try:
        config = read_drafter_config(export)
        return family(config.get("speculators_model_type", DEFAULT)).config_type.from_dict(
            config["specdraft"]["drafter_config"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError, SpecdraftError):
        return None


def engines_line(cfg, run: str | Path, sglang_out: str | Path) -> str:
    """Which engines serve this drafter, in one line (the recipe's closing lines): vLLM from the
    speculators export; SGLang from its own export (the command), with the release it needs, or why not."""
    if cfg is None:
        return "vLLM (this export); SGLang: unknown (the export's config.json has no drafter config)"
    missing = sglang_missing(cfg)
    if missing:
        return f"vLLM (this export); not SGLang: it does not implement {missing}"
    needs = sglang_needs(cfg)
    return (f"vLLM (this export) and SGLang (specdraft export {run} --format sglang --out {sglang_out}"
            + (f"; {needs})" if needs else ")"))


def serve_commands(target: str, export: str | Path, speculative_tokens: int, layout_name: str,
                   sglang_missing: str | None = None, fam: Family | None = None,
                   sglang_needs: str | None = None, tensor_parallel: int = 1) -> list[tuple[str, str, str]]:
    """(engine, note, command) to paste for an export folder: the model card and `specdraft report`
    both show these, so the two never disagree. vLLM selects the drafter by its family's keys of the
    speculative config (`fam`, the default family when None). SGLang reads only the family's SGLang
    layout, whose `serve` gives its command: for another layout the note says to export again, and
    the command names that second folder; a drafter using what SGLang lacks (`sglang_missing`) gets
    vLLM's command only. `sglang_needs`: the SGLang release the drafter needs, said before SGLang's command."""
    fam = fam or family(DEFAULT)
    serve_target = target if target and target != UNKNOWN else "TARGET"
    export, k = str(export), int(speculative_tokens)
    spec = json.dumps({**dict(fam.vllm_speculative), "model": export, "num_speculative_tokens": k})
    vllm = (f"vllm serve {serve_target} \\\n  --tensor-parallel-size {tensor_parallel} \\\n"
            f"  --speculative-config '{spec}'")
    if layout_name == "speculators":   # a speculators folder names its target: vLLM's short form
        vllm = (f"vllm serve {export}\n# or, with the draft length and the GPUs per replica (tensor parallel: the "
                "drafter runs beside the target on each) chosen here:\n" + vllm)
    sglang_layout = layout(fam, "sglang")
    if sglang_layout is None or sglang_layout.serve is None:
        sglang_missing = sglang_missing or f"{fam.model_type} drafters"
    if sglang_missing:
        return [("vLLM", "", vllm),
                ("SGLang", f"SGLang cannot serve this drafter: it does not implement {sglang_missing}.", "")]
    note, sglang_path = "", export
    if layout_name != "sglang":
        sglang_path = export + "-sglang"
        note = f"SGLang reads the SGLang layout: export again with `--format sglang --out {sglang_path}`, then"
    if sglang_needs:
        note = f"This drafter {sglang_needs}." + (f" {note}" if note else "")
    return [("vLLM", "", vllm), ("SGLang", note, sglang_layout.serve(serve_target, sglang_path, k))]


def _data_size(f: dict) -> str:
    if f["samples"] == UNKNOWN and f["tokens"] == UNKNOWN:
        return UNKNOWN
    text = f"{f['samples']} samples, {f['tokens']} tokens"
    if f["tokens_trained"] != UNKNOWN:
        text += f" ({f['tokens_trained']} tokens trained over all epochs)"
    return text
