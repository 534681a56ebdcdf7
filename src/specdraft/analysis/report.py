"""`specdraft report RUN... [--out FILE]`: one self-contained page per set of runs, written to
RUN/report.html (the first run's folder) unless --out says otherwise.

It leads with the answer a person came for: per run, τ on held-out prompts, speedup over greedy,
whether the output is identical to greedy, the training data's size and the training time. Then
the bench and eval tables (per-position acceptance, bench.png), the export with its serve commands,
the recipe's stage timings, the validation table and curves across runs, the journal, and the
config folded away. No network: inline CSS, plots as base64 data URIs, every text HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import json
import tempfile
from datetime import datetime
from pathlib import Path

from specdraft import journal, metrics
from specdraft import run_layout
from specdraft.analysis import compare
from specdraft.analysis.measured import served_k, served_row
from specdraft.defaults import DRAFT_LENGTH
from specdraft.errors import SpecdraftError
from specdraft.families import DEFAULT, family, family_of
from specdraft.formats import card
from specdraft import bandwidth
from specdraft.infer.bench_output import why_not_faster
from specdraft.io import atomic_path
from specdraft.schemas.exports import exports_of
from specdraft.schemas.inputs import INPUTS_FILE, read_inputs
from specdraft.schemas import typed_json
from specdraft.schemas.bench import BenchFile
from specdraft.schemas.doctor import DoctorFile
from specdraft.schemas.eval import EvalFile
from specdraft.schemas.plan import PlanFile
from specdraft.schemas.probe import ProbeResult
from specdraft.schemas.stages import STAGES_FILE, StagesFile

CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222;padding:0 1em}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:.6em 0}td,th{border:1px solid #ddd;padding:.25em .6em;text-align:right}
th{background:#f4f4f4}td:first-child,th:first-child{text-align:left}
pre{background:#f7f7f7;padding:.8em;font-size:12px;white-space:pre-wrap;overflow-wrap:anywhere}img{max-width:100%}
.headline{background:#f3f7ff;border:1px solid #c9d8f5;padding:.4em 1.2em;margin:1em 0}
.headline table{font-size:1.15em}.headline td:nth-child(2){font-weight:bold}.headline td{text-align:left}
.entry{border-left:4px solid #888;padding:.2em .8em;margin:.6em 0}.warning{border-color:#c33}
.decision{border-color:#36c}.result{border-color:#3a3}.probe{border-color:#a6c}.hypothesis{border-color:#c93}
.meta{color:#666;font-size:12px}.bad{color:#c33}"""

OTHER_RESULTS = ("probe*.json",)     # bench.json, eval*.json and plan.json get their own sections
REPORT_FILE = run_layout.REPORT


def esc(text) -> str:
    return html.escape(str(text), quote=True)


def table_html(header: list[str], rows: list[list[str]]) -> str:
    head = "<tr>" + "".join(f"<th>{esc(h)}</th>" for h in header) + "</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td>{esc(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


def image_html(png: Path, alt: str) -> str:
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    return f'<img alt="{esc(alt)}" src="data:image/png;base64,{data}">'


FIX = "fix or delete that file, then re-run report"


def number(value, fmt: str = ".2f") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


# ----------------------------------------------------------------------------- facts from the run folder

def checkpoint_inputs(run: Path) -> dict:
    """The training data recorded in the run's best checkpoint (else its newest epoch-N)."""
    epochs = [folder for _, _, folder in run_layout.checkpoints(run, "epoch", holding=())]
    for ckpt in [run_layout.best_dir(run), *reversed(epochs)]:
        data = read_inputs(ckpt / INPUTS_FILE, "fix or delete that file, then re-run report")
        if data:
            return data
    return {}


def run_config(run: Path) -> dict:
    """The run's settings (config.yaml through its one schema, train/config.read_run_config); {} without one."""
    from specdraft.train.config import read_run_config

    cfg = read_run_config(run)
    return cfg.to_dict() if cfg is not None else {}


def store_manifest(store: Path) -> dict:
    """The store's manifest through its one reader (data/store.read_manifest); {} where the store is gone or its
    manifest does not read (the report shows the size as unknown rather than stop)."""
    from specdraft.data.store import MANIFEST, read_manifest

    try:
        return read_manifest(store) if (store / MANIFEST).is_file() else {}
    except SpecdraftError:
        return {}


def data_size(run: Path) -> str:
    """Samples and tokens the run trained on: the checkpoint's inputs.json, else the manifest of the
    store that config.yaml names."""
    inputs, source = checkpoint_inputs(run), "checkpoint inputs.json"
    if "num_samples" not in inputs:
        store = run_config(run).get("store")
        inputs, source = (store_manifest(Path(store)), f"store {store}") if isinstance(store, str) else ({}, "")
    if "num_samples" not in inputs:
        return "unknown"
    tokens = inputs.get("num_tokens")
    return f"{inputs['num_samples']:,} samples, {tokens:,} tokens ({source})" if isinstance(tokens, int) \
        else f"{inputs['num_samples']:,} samples ({source})"


def timestamp(value) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return datetime.fromisoformat(value).timestamp()
        except ValueError:
            return None
    return None


def recipe_stages(run: Path) -> dict:
    """The recipe's stage timings (pipeline.py's WS/stages.json) when `run` is a recipe's WS/runs/NAME."""
    if run.resolve().parent.name != "runs":
        return {}
    data = typed_json(run.resolve().parent.parent / STAGES_FILE, StagesFile, FIX)
    return data if isinstance(data, dict) else {}


def training_time(run: Path) -> str:
    """From the first to the last timestamp in metrics.jsonl, else the recipe's train stage."""
    times = []
    if run_layout.metrics_file(run).is_file():
        for line in run_layout.metrics_file(run).read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            t = timestamp(rec.get("time")) if isinstance(rec, dict) else None
            if t is not None:
                times.append(t)
    if len(times) >= 2:
        return f"{duration(max(times) - min(times))} (metrics.jsonl timestamps)"
    train = recipe_stages(run).get("train")
    if isinstance(train, dict) and isinstance(train.get("seconds"), (int, float)):
        return f"{duration(train['seconds'])} (recipe's train stage)"
    return "unknown"


def duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


# ----------------------------------------------------------------------------- sections

def headline_html(run: Path) -> str:
    """The answer first: τ, speed against plain decoding (the natural bench, as the headline; served in vLLM
    where bench --engine vllm ran), lossless or not, how much data, how long."""
    natural = typed_json(run / run_layout.BENCH_NATURAL, BenchFile, FIX)
    typed_json(run / run_layout.EVAL, EvalFile, FIX)                               # types checked
    held_out = typed_json(run / run_layout.BENCH, BenchFile, FIX)
    bench = natural if metrics.drafter_method(natural)[1] else held_out
    drafter = metrics.drafter_method(bench)[1]          # the drafter's chain, whatever its family
    cfg = (bench.get("config") or {}) if isinstance(bench, dict) else {}
    taus, served = card.tau_measurements(run), served_k(run)
    tau = (card.headline_text(taus, served), "the headline: the natural prompt set at the K the export serves "
           "where measured; every τ is in the table below") if taus else \
        ("unknown", "no bench.json, eval.json or validation in the run folder")
    over_plain = drafter.get("speedup_over_plain")
    if isinstance(over_plain, (int, float)):
        plain = (bench.get("methods") or {}).get("plain") or {}
        greedy = drafter.get("speedup")
        speedup = (f"{over_plain:.2f}x plain decoding", f"{number(drafter.get('tokens_per_s'), '.1f')} vs "
                   f"{number(plain.get('tokens_per_s'), '.1f')} tok/s in specdraft's loop, {cfg.get('device', '?')}, "
                   f"batch 1, {metrics.tau_source(cfg.get('prompts'), cfg.get('num_prompts'))}"
                   + (f"; {greedy:.2f}x transformers' generate" if isinstance(greedy, (int, float)) else ""))
    elif isinstance(drafter.get("speedup"), (int, float)):     # a bench without plain decoding: greedy alone
        speedup = (f"{drafter['speedup']:.2f}x transformers' greedy", "this bench ran no plain decoding")
    else:
        speedup = ("unknown", "no bench of the drafter's chain beside plain decoding")
    same = drafter.get("identical_to_greedy")
    same = drafter.get("identical_to_greedy")
    identical = (("yes" if same else "NO") if isinstance(same, bool) else "unknown",
                 f"{drafter.get('prompts_identical', '?')}/{cfg.get('num_prompts', '?')} prompts" if isinstance(same, bool)
                 else "")
    rows = [["τ (tokens per target forward, at most K+1)", *tau], ["speed in specdraft's loop", *speedup],
            ["served by vLLM", *served_row(run)],
            ["identical to greedy", *identical], ["training data", data_size(run), ""],
            ["training time", training_time(run), ""]]
    why = why_not_faster(held_out) if isinstance(held_out, dict) and isinstance(held_out.get("methods"), dict) else None
    if why:
        rows.insert(2, ["why not faster", why, ""])
    return (f"<div class=headline><h2>{esc(run.name)}</h2>{table_html([], rows)}{tau_table_html(taus)}"
            f"{doctor_html(run)}</div>")


def tau_table_html(taus: list[dict]) -> str:
    """Every τ the run holds, each with its K and prompts (card.tau_measurements), in one table."""
    if len(taus) < 2:
        return ""
    rows = [[number(t["tau"]), str(t["k"]), metrics.tau_source(t["prompts"], t["count"]), t["source"]] for t in taus]
    return "<h3>Every τ measured (ceiling K+1)</h3>" + table_html(["τ", "K", "prompts", "from"], rows)


def doctor_html(run: Path) -> str:
    """The doctor's last findings (RUN/doctor.json, written by `specdraft doctor`), under the headline."""
    found = typed_json(run / run_layout.DOCTOR, DoctorFile, FIX)
    if not isinstance(found, dict):
        return ""
    rows = [[str(c.get("id")), str(c.get("summary", "")), number(c.get("estimated_tau_loss")), str(c.get("fix", ""))]
            for c in found.get("causes") or []]
    fine = ", ".join(str(c.get("id")) for c in found.get("checked") or [])
    table = table_html(["cause", "found", "est. τ loss", "fix"], rows) if rows else "<p>doctor: no cause found</p>"
    return f"<h3>Why τ is what it is (specdraft doctor)</h3>{table}<p class=meta>checked and fine: {esc(fine)}</p>"


def bench_html(run: Path) -> str:
    bench = typed_json(run / run_layout.BENCH, BenchFile, FIX)
    if bench is None:
        return ""
    if not isinstance(bench, dict) or not isinstance(bench.get("methods"), dict):
        return "<h3>Bench</h3><p class=meta>bench.json: not valid JSON, skipped</p>"
    cfg = bench.get("config") or {}
    n = cfg.get("num_prompts", "?")
    over_plain = "plain" in bench["methods"]
    rows = [[name, number(m.get("tokens_per_s"), ".1f"), f"{number(m.get('speedup'))}x",
             *([f"{number(m.get('speedup_over_plain'))}x"] if over_plain else []),
             number(m.get("accept_len")) if name not in ("greedy", "plain") else "-",
             " ".join(number(a) for a in m.get("per_position_accept") or []) or "-",
             "yes" if m.get("identical_to_greedy") else f"NO ({m.get('prompts_identical', '?')}/{n})"]
            for name, m in bench["methods"].items() if isinstance(m, dict)]
    meta = (f"{cfg.get('model', '?')} · {n} prompts of {cfg.get('prompts', '?')} · {cfg.get('max_new_tokens', '?')} "
            f"new tokens · k={cfg.get('k', '?')} · {cfg.get('device', '?')} {cfg.get('dtype', '')}")
    png = run / "bench.png"
    return (f"<h3>Bench (held-out prompts, end to end)</h3><p class=meta>{esc(meta)}</p>"
            + table_html(["method", "tokens/s", "speedup", *(["x plain"] if over_plain else []), "τ",
                          "per-position acceptance", "identical to greedy"], rows)
            + (image_html(png, "tokens/s per method") if png.is_file() else ""))


def eval_html(run: Path) -> str:
    parts = []
    for f in sorted(run.glob("eval*.json")):
        ev = typed_json(f, EvalFile, FIX)
        if not isinstance(ev, dict) or not isinstance(ev.get("cond_acc"), list):
            parts.append(f"<h3>{esc(f.name)}</h3><p class=meta>not valid JSON, skipped</p>")
            continue
        by_k = ev.get("accept_len_by_k") or []
        rows = [[str(i + 1), number(c, ".3f"), number((ev.get("full_acc") or [None] * (i + 1))[i], ".3f"),
                 number(by_k[i + 1]) if i + 1 < len(by_k) else "-"] for i, c in enumerate(ev["cond_acc"])]
        parts.append(f"<h3>Eval ({esc(f.name)}): acceptance from stored hidden states</h3>"
                     f"<p><b>{esc(eval_tau(ev))}</b> (simulated) <span class=meta>split {esc(ev.get('split'))}"
                     f" · drafter {esc(ev.get('drafter'))}</span></p>"
                     + table_html(["draft position", "conditional acceptance", "full acceptance",
                                   "τ with k = position"], rows))
    return "".join(parts)


def context_series(run: Path) -> list[tuple[str, dict, str]]:
    """(name, by_context section, its line) of every τ-by-context a run's files hold: the drafter
    chain of each bench*.json, each eval*.json."""
    series = []
    for f in sorted(run.glob("bench*.json")):
        bench = typed_json(f, BenchFile, FIX)
        name, result = metrics.drafter_method(bench) if isinstance(bench, dict) else ("", {})
        if metrics.measured_buckets(result.get("by_context")):
            cfg = bench.get("config") or {}
            series.append((f"{f.stem} {name}", result["by_context"],
                           metrics.by_context_text(result["by_context"], cfg.get("prompts"), cfg.get("num_prompts"))))
    for f in sorted(run.glob("eval*.json")):
        ev = typed_json(f, EvalFile, FIX)
        if isinstance(ev, dict) and metrics.measured_buckets(ev.get("by_context")):
            series.append((f.stem, ev["by_context"], metrics.by_context_text(
                ev["by_context"], ev.get("split_name") or "held-out", ev.get("samples"))))
    return series


def plot_by_context(series: list[tuple[str, dict]], out: Path) -> Path:
    """τ against context length: a point per measured bucket (at its lower edge), a line per source."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    for name, section, _ in series:
        rows = metrics.measured_buckets(section)
        ax.plot(range(len(rows)), [b["tau"] for _, b in rows], "o-", label=f"{name}, K={section.get('k', '?')}")
        for i, (label, _) in enumerate(rows):
            ax.annotate(label, (i, rows[i][1]["tau"]), fontsize=7, textcoords="offset points", xytext=(0, 5))
    ax.set_xlabel("context length (bucket)")
    ax.set_ylabel("τ (tokens per target forward)")
    ax.set_xticks([])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return out


def context_html(run: Path) -> str:
    """τ by context length (eval's and bench's by_context): a line per source and the plot."""
    series = context_series(run)
    if not series:
        return ""
    lines = "".join(f"<p>{esc(name)}: {esc(line)}</p>" for name, _, line in series)
    with tempfile.TemporaryDirectory() as tmp:
        png = plot_by_context(series, Path(tmp) / "by_context.png")
        return f"<h3>τ by context length</h3>{lines}" + image_html(png, "τ against context length")


def eval_tau(ev: dict) -> str:
    """eval.json's τ in the shared format (its K, its samples)."""
    k = ev.get("k") if isinstance(ev.get("k"), int) else len(ev.get("cond_acc") or [])
    source = "all" if str(ev.get("split", "")).startswith("all") else "held-out"
    count = ev.get("samples") if isinstance(ev.get("samples"), int) else None
    return metrics.tau_text(ev.get("accept_len"), k, ev.get("split_name") or source, count)


def export_html(run: Path) -> str:
    """Where the drafter was exported (the export folders near the run whose export.json names it) and the
    commands that serve it, the same ones as the export's model card."""
    exports = [e.model_dump() for e in exports_of(run)]
    if not exports:
        return ("<h3>Export</h3><p class=meta>not exported yet: specdraft export "
                f"{esc(run)} --out EXPORT_DIR</p>")
    inputs = checkpoint_inputs(run)
    target = (inputs.get("target") or {}).get("id") or run_config(run).get("model") or card.UNKNOWN
    parts = ["<h3>Export</h3>"]
    for e in exports:
        if not isinstance(e, dict) or "out" not in e:
            continue
        parts.append(f"<p><b>{esc(e['out'])}</b> <span class=meta>{esc(e.get('layout'))} layout, "
                     f"{esc(e.get('dtype'))}</span></p>")
        fam, sglang_lacks, sglang_needs = served_as(e["out"])
        for engine, note, command in card.serve_commands(target, e["out"], e.get("num_speculative_tokens") or DRAFT_LENGTH,
                                                         e.get("layout", "speculators"), sglang_lacks, fam,
                                                         sglang_needs):
            parts.append(f"<p>Serve with {esc(engine)}{': ' + esc(note) if note else ''}</p>"
                         + (f"<pre>{esc(command)}</pre>" if command else ""))
    return "".join(parts)


def served_as(export: str):
    """(the exported drafter's family, what SGLang lacks for it, the SGLang release it needs) from its
    config.json: how the serve commands select it (the default family, lacking nothing, when that
    cannot be read)."""
    cfg = card.export_config(export)
    if cfg is None:
        return family(DEFAULT), None, None
    return family_of(cfg), card.sglang_missing(cfg), card.sglang_needs(cfg)


def stages_html(run: Path) -> str:
    stages = recipe_stages(run)
    rows = [[name, duration(s["seconds"]), s.get("command", "")] for name, s in stages.items()
            if isinstance(s, dict) and isinstance(s.get("seconds"), (int, float))]
    if not rows:
        return ""
    return (f"<h3>Recipe stages</h3><p class=meta>total {esc(duration(stages_total(stages)))} (latest run of each "
            f"stage before this report, from stages.json beside recipe.log)</p>"
            + table_html(["stage", "time", "command"], rows))


def stages_total(stages: dict) -> float:
    """Seconds of the recipe's stages (stages.json, the latest run of each) up to the report: the
    total the report and the recipe's closing lines both print."""
    return sum(s["seconds"] for name, s in stages.items()
               if name != "report" and isinstance(s, dict) and isinstance(s.get("seconds"), (int, float)))


def journal_html(run: Path) -> str:
    entries = journal.read(run)
    if not entries:
        return "<p class=meta>no journal entries</p>"
    return "".join(f'<div class="entry {esc(e.kind)}"><div class=meta>{esc(e.time)} · {esc(e.kind)}'
                   f'{" · " + esc(e.source) if e.source else ""}</div><pre>{esc(e.text)}</pre></div>'
                   for e in entries)


def results_html(run: Path) -> str:
    """Probe and plan results: their verdict or best K, the JSON folded."""
    parts = []
    for pattern in OTHER_RESULTS:
        for f in sorted(run.glob(pattern)):
            data = typed_json(f, ProbeResult, FIX)
            if data == "invalid":
                parts.append(f"<h3>{esc(f.name)}</h3><p class=meta>not valid JSON, skipped</p>")
                continue
            verdict = data.get("verdict") if isinstance(data, dict) else None
            best = data.get("best") if isinstance(data, dict) else None
            summary = f"<p><b>verdict:</b> {esc(verdict)}</p>" if verdict else ""
            if best:
                summary += (f"<p><b>best K:</b> {esc(best.get('k'))}, {esc(round(best.get('tokens_per_s', 0), 1))} "
                            f"tok/s</p>")
            parts.append(f"<h3>{esc(f.name)}</h3>{summary}<details><summary>JSON</summary>"
                         f"<pre>{esc(json.dumps(data, indent=2))}</pre></details>")
    return "".join(parts)


def plan_file(run: Path) -> Path | None:
    """RUN/plan.json (`specdraft plan --run RUN`), else WS/plan.json when `run` is a recipe's WS/runs/NAME."""
    here = run / run_layout.PLAN
    workspace = run.resolve().parent.parent / run_layout.PLAN if run.resolve().parent.name == "runs" else None
    return here if here.is_file() else workspace if workspace is not None and workspace.is_file() else None


def plan_html(run: Path) -> str:
    """plan.json's result as plan prints it: the chosen K, its predicted speedup and tokens per cycle,
    the acceptance it used, the draft and verify costs (and the weight-streaming floor when measured),
    every K it ranked, its warnings; the JSON folded."""
    path = plan_file(run)
    if path is None:
        return ""
    data = typed_json(path, PlanFile, FIX)   # broken JSON is shown as such; a wrong type is one line
    if not isinstance(data, dict) or not isinstance(data.get("best"), dict):
        return f"<h3>Plan ({esc(path)})</h3><p class=meta>not valid JSON or no best K, skipped</p>"
    best, accept = data["best"], data.get("accept") if isinstance(data.get("accept"), dict) else {}
    verify, k = data.get("verify_ms") or [], best.get("k", "?")
    rows = [["chosen K (draft tokens per round)", str(k)],
            ["predicted speedup over plain decoding",
             f"{number(best.get('speedup'))}x ({number(best.get('tokens_per_s'), '.1f')} tok/s)"],
            ["predicted tokens per target forward", f"{number(best.get('tokens_per_cycle'))} at K={k}"],
            ["acceptance per position", " ".join(number(a) for a in accept.get("cond_acc") or []) or "-"],
            ["acceptance from", str(accept.get("source", "unknown"))],
            ["draft step", f"{number(data.get('draft_ms'))} ms"],
            ["verify 1..n tokens", " ".join(number(v, ".1f") for v in verify) + " ms" if verify else "unknown"]]
    floor = (data.get("timing") or {}).get("floor")
    if isinstance(floor, dict) and all(isinstance(floor.get(f), (int, float))
                                       for f in ("weight_mb", "bandwidth_gbs", "floor_ms")):
        rows.append(["weight-streaming floor", bandwidth.floor_line(floor, verify or None)])
    options = [[str(o.get("k")) + ("  <- best" if o.get("k") == best.get("k") else ""),
                number(o.get("tokens_per_cycle")), number(o.get("cycle_ms")), number(o.get("tokens_per_s"), ".1f"),
                f"{number(o.get('speedup'))}x", number(o.get("draft_share"), ".0%"), number(o.get("verify_share"), ".0%")]
               for o in data.get("options") or [] if isinstance(o, dict)]
    warnings = "".join(f"<p class=bad>{esc(w)}</p>" for w in data.get("warnings") or [])
    served = served_k(run)
    if isinstance(k, int) and isinstance(served, int) and served != k:
        warnings += (f"<p class=bad>the export serves K={served}, plan chose K={k}; to serve plan's K: "
                     f"specdraft export {esc(run)} --out EXPORT_DIR -k {k}</p>")
    return (f"<h3>Plan: the draft length K (specdraft plan)</h3><p class=meta>{esc(path)}</p>"
            + table_html([], rows)
            + (table_html(["K", "tokens per cycle (τ)", "cycle ms", "tok/s", "speedup", "draft", "verify"], options)
               if options else "")
            + warnings + f"<details><summary>JSON</summary><pre>{esc(json.dumps(data, indent=2))}</pre></details>")


def config_html(run: Path) -> str:
    for name in (run_layout.CONFIG, "config.yml", "config.json"):
        if (run / name).exists():
            return (f"<details><summary>{esc(name)}</summary><pre>{esc((run / name).read_text())}</pre>"
                    "</details>")
    return "<p class=meta>no config file</p>"


def run_html(run: Path) -> str:
    return (f"<h2>Run {esc(run.name)}</h2><p class=meta>{esc(run.resolve())}</p>{bench_html(run)}{eval_html(run)}"
            f"{context_html(run)}"
            f"{export_html(run)}{plan_html(run)}{stages_html(run)}{results_html(run)}<h3>Journal</h3>{journal_html(run)}"
            f"<h3>Config</h3>{config_html(run)}")


def build(runs: list[str | Path], out: str | Path | None = None) -> Path:
    """Write the report for `runs` (folders with metrics.jsonl; a folder without one still reports
    its journal and results) to `out` (default: RUN/report.html of the first run), atomically."""
    if not runs:
        raise SpecdraftError("report: pass at least one run folder")
    folders = [Path(r) for r in runs]
    for f in folders:
        if not f.is_dir():
            raise SpecdraftError(f"{f}: not a run folder")
    loaded = compare.unique_names([metrics.load_run(f) for f in folders if run_layout.metrics_file(f).exists()])
    body = [f"<h1>specdraft report: {esc(', '.join(f.name for f in folders))}</h1>"]
    body += [headline_html(f) for f in folders]
    body += [run_html(f) for f in folders]
    if loaded:
        header, rows = compare.epoch_table(loaded)
        body.append("<h2>Validation per epoch</h2>" + table_html(header, rows))
        with tempfile.TemporaryDirectory() as tmp:
            png = compare.plot_curves(loaded, Path(tmp) / "curves.png")
            if png:
                body.append("<h2>Curves (x = tokens seen)</h2>" + image_html(png, "loss_k and cond_acc_k curves"))
    page = (f"<!DOCTYPE html><html><head><meta charset=utf-8><title>specdraft report</title>"
            f"<style>{CSS}</style></head><body>{''.join(body)}</body></html>\n")

    out = Path(out) if out is not None else folders[0] / REPORT_FILE
    with atomic_path(out) as tmp:
        tmp.write_text(page, encoding="utf-8")
    return out
