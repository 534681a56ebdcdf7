"""The analysis sub-commands of `specdraft` (plan, probe, doctor, report, compare, journal): wiring only,
as in cli.py, which registers them on its app."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from specdraft.defaults import DRAFT_LENGTH, LONGEST_CHAIN
from specdraft.flags import (AS_JSON, BASELINE_HELP, DRAFTER_HELP, MODEL, MODEL_HELP, NUM_SPEC, PREPARED_HELP,
                             PROMPTS_HELP, RUN_RECORD, STORE_HELP, TRUST, VOCAB_HELP, check_out, command, draft_length_help,
                             check_run_record, out_option, parse_floats, plain_app, say)

journal_app = plain_app("Decision journal beside a run (RUN/journal.md).")
APP = typer.Typer()   # collects the commands until register() copies them onto the specdraft app


def register(app: typer.Typer) -> None:
    """Add plan, probe, doctor, report and compare to `app` (cli.py's), keeping their order."""
    app.registered_commands.extend(APP.registered_commands)


@command(APP, "plan")
def plan_cmd(
    drafter: Optional[Path] = typer.Option(None, "--drafter", help=DRAFTER_HELP + " Here: to time a draft step."),
    model: str = MODEL,
    accept: Optional[str] = typer.Option(None, "--accept", help="eval/bench JSON, metrics.jsonl, or rates 0.8,0.6,..."),
    store: Optional[Path] = typer.Option(None, "--store", help=STORE_HELP + " Here: acceptance is measured on it."),
    verify_ms: Optional[str] = typer.Option(None, "--verify-ms", help="Verify latency for 1..K+1 tokens (ms), or one "
                                            "value for all."),
    draft_ms: Optional[float] = typer.Option(None, "--draft-ms", help="Drafter step latency (ms)."),
    max_k: int = typer.Option(LONGEST_CHAIN, "--max-k", help="Longest draft chain considered (as -k auto's)."),
    context: int = typer.Option(512, help="KV cache length for the verify measurement."),
    rounds: int = typer.Option(3, "--rounds", help="Timing rounds, the order rotated per round; the medians count. "
                               "Here: each times every verify length and the draft step."),
    run: Optional[Path] = RUN_RECORD, out: Optional[Path] = out_option("the plan JSON."), as_json: bool = AS_JSON,
    trust_remote_code: bool = TRUST,
):
    """Choose the draft length. From acceptance per position and the measured draft/verify costs."""
    from specdraft.analysis import plan

    check_out(out, [accept, drafter, store], ".json", "plan")
    check_run_record(run)
    result = plan.run(drafter=drafter, model=model, accept=accept, data=store,
                      verify_ms=parse_floats(verify_ms, "--verify-ms"), draft_ms=draft_ms, k_max=max_k,
                      context=context, run=run, out=out, trust_remote_code=trust_remote_code, rounds=rounds)
    say(result.get("warnings", []))
    print(json.dumps(result, indent=2) if as_json else plan.format_plan(result))


@command(APP, "probe")
def probe_cmd(
    vocab: Optional[List[Path]] = typer.Option(None, "--vocab", help=VOCAB_HELP + " Here: two mappings A and B (vocab "
                                               "file or drafter folder)."),
    model: Optional[List[str]] = typer.Option(None, "--model", "-m", help=MODEL_HELP + " Here: two (A, B) for the "
                                              "hidden-state probe, one for --drafter."),
    prepared: Optional[Path] = typer.Option(None, "--prepared", help=PREPARED_HELP + " Here: both targets read it."),
    drafter: Optional[Path] = typer.Option(None, "--drafter", help=DRAFTER_HELP + " Here: for the direct probe."),
    samples: int = typer.Option(32, help="Samples of --prepared to run."),
    tokens_per_sample: int = typer.Option(512, "--tokens-per-sample", help="Tokens of each sample read."),
    draft_length: int = typer.Option(DRAFT_LENGTH, NUM_SPEC, "-k", help=draft_length_help(
        "Here: the positions the direct probe measures (1..7).")),
    run: Optional[Path] = RUN_RECORD, out: Optional[Path] = out_option("the result JSON."), as_json: bool = AS_JSON,
    trust_remote_code: bool = TRUST,
):
    """Before fine-tuning, whether adapting can work. Mapping overlap, hidden-state similarity of two
    targets, the drafter as it is."""
    from specdraft.analysis import probe

    check_out(out, [*(vocab or []), prepared, drafter], ".json", "probe")
    check_run_record(run, before_training=True)
    results = probe.run(vocabs=vocab or [], models=model or [], data=prepared, drafter=drafter, samples=samples,
                        max_tokens=tokens_per_sample, steps=draft_length, run=run, out=out,
                        trust_remote_code=trust_remote_code)
    for r in results:
        print(json.dumps(r, indent=2) if as_json else probe.format_result(r))


@command(APP, "doctor")
def doctor_cmd(run: Path = typer.Argument(..., help="Run folder (specdraft train --out)."),
               model: Optional[str] = typer.Option(None, "--model", "-m", help=MODEL_HELP + " Here: default the run's "
                                                   "config.yaml model."),
               store: Optional[Path] = typer.Option(None, "--store", help=STORE_HELP + " Here: default the run's."),
               prompts: Optional[str] = typer.Option(None, "--prompts", help=PROMPTS_HELP + " Here: the prompts "
                                                     "you serve; τ on them against τ on the store."),
               out: Optional[Path] = out_option("the diagnosis JSON (default: RUN/doctor.json, which the report shows)."),
               as_json: bool = AS_JSON):
    """Why is the acceptance low? Measured causes, ranked by the τ they cost, each with its evidence
    and the fix as a command; RUN/doctor.json (or --out) keeps the result."""
    from specdraft.analysis import doctor

    from specdraft import run_layout

    check_out(out, [run_layout.config_file(run), run_layout.metrics_file(run), store], ".json", "doctor")
    result = doctor.diagnose(run, model=model, store=store, prompts=prompts, out=out)
    print(json.dumps(result, indent=2) if as_json else doctor.format_result(result))


@command(APP, "report")
def report_cmd(
    runs: List[Path] = typer.Argument(..., help="Run folders."),
    out: Optional[Path] = out_option("the HTML file (default: report.html in the first run folder)."),
):
    """One HTML page for a run. It leads with τ, speedup and losslessness; then bench/eval tables,
    the export's serve commands, stage timings, curves, journal and config."""
    from specdraft.analysis import report

    check_out(out, runs, ".html", "report")
    say(f"report -> {report.build(runs, out)}")


@command(APP, "compare")
def compare_cmd(
    runs: List[Path] = typer.Argument(..., help="Run folders (or their metrics.jsonl)."),
    out: Optional[Path] = out_option("a folder for compare.md and curves.png."),
    metric: Optional[List[str]] = typer.Option(None, "--metric", help="Table metrics (repeatable)."),
    baseline: Optional[Path] = typer.Option(None, "--baseline", help=BASELINE_HELP + " Here: flag the runs behind it."),
    margin: float = typer.Option(0.05, help="Behind-baseline margin on full_acc_0 (absolute)."),
    as_json: bool = AS_JSON,
):
    """Runs side by side. Validation metrics per epoch, and curves aligned by tokens seen."""
    from specdraft.analysis import compare

    result = compare.compare(runs, out, tuple(metric) if metric else compare.DEFAULT_TABLE_METRICS,
                             baseline=baseline, margin=margin)
    print(json.dumps(result, indent=2)) if as_json else compare.print_result(result)


@command(journal_app, "add")
def journal_add(
    run: Path = typer.Argument(..., help="Run folder, e.g. WS/runs/NAME."),
    text: str = typer.Argument(..., help="What was hypothesised, found or decided."),
    kind: str = typer.Option(..., "--kind", help="hypothesis, result, decision, warning or probe."),
):
    """Append a timestamped entry to RUN/journal.md."""
    from specdraft import journal

    new = not run.exists()
    entry = journal.add(run, kind, text)
    say(([f"note: {run} did not exist: made it, a new run folder holding only this journal (a typo? then delete "
           "it)"] if new else []) + [f"journal {entry.time} {entry.kind} -> {journal.journal_path(run)}"])
