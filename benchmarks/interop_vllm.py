"""Serve our exported drafter (EAGLE-3, or P-EAGLE with parallel drafting) with a real engine (vLLM, CPU build) and check it.

Checks (issue 4 item 3):
  * vLLM loads our speculators-layout export (bf16, --no-embeddings: the target's are shared) with
    method "eagle3";
  * greedy outputs of vLLM with eagle3 (and with n-gram) equal vLLM's plain greedy outputs;
  * vLLM's own acceptance counters (spec-decode metrics) agree with OUR acceptance length,
    measured by specdraft's speculative generation on the same prompts, within --tolerance;
  * tokens/s of plain, n-gram and eagle3 decoding in vLLM (batch 1, one prompt at a time).

One file, two roles: the orchestrator (specdraft: builds a drafter when none is given, measures
our acceptance); each vLLM engine runs in a child process (`--engine plain|ngram|eagle3`, which
imports vLLM and nothing of specdraft), by default with the same .venv, which holds vLLM too. Prompts cross
the boundary as token ids, so both sides see exactly the same input.

    scripts/interop.sh                          # what `make interop` runs
    .venv/bin/python benchmarks/interop_vllm.py --vllm-python .venv/bin/python --drafter DIR -k 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "interop_vllm.json"
DEFAULT_DRAFTER = ROOT / "out" / "interop" / "drafter"
ENGINES = ("plain", "ngram", "eagle3")

# Fixed prompts: explanation, code and a summary of text (which n-gram lookup can copy from).
PROMPTS = [
    "Explain how a hash table works in three sentences.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Summarize this in one sentence: The printing press, invented around 1440, made books cheap. "
    "Cheap books spread literacy, and literacy spread new ideas across Europe.",
    "List five healthy breakfast ideas, one line each.",
]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", type=Path, help="drafter checkpoint or run folder (default: build one in "
                   f"{DEFAULT_DRAFTER.relative_to(ROOT)}); it is exported bf16 without embeddings "
                   "(specdraft export --no-embeddings) and that export is what both sides load")
    p.add_argument("--model", default="default", help="target: 'default' (SmolLM2-135M-Instruct) or a folder")
    p.add_argument("-k", "--k", type=int, default=3, help="num_speculative_tokens (draft length)")
    p.add_argument("--prompts", type=int, default=len(PROMPTS), help=f"how many prompts (<= {len(PROMPTS)})")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                   help="what vLLM and ours run the target in; float32 (default) is bit-comparable across "
                   "plain/n-gram/eagle3 on CPUs without native bf16, where bf16 greedy outputs can differ "
                   "between vLLM's own plain and speculative runs")
    p.add_argument("--draft-vocab", type=int, default=8192, help="draft vocab size of a built drafter")
    p.add_argument("--fit-steps", type=int, default=40, help="a built drafter is fitted to the target's "
                   "answers on these prompts for this many steps (0: untrained)")
    p.add_argument("--tolerance", type=float, default=0.15, help="relative acceptance-length agreement")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--vllm-python", default=sys.executable)
    p.add_argument("--engines", default=",".join(ENGINES), help="comma list of plain,ngram,eagle3")
    # child mode (runs with --vllm-python)
    p.add_argument("--engine", choices=ENGINES, help=argparse.SUPPRESS)
    p.add_argument("--job", type=Path, help=argparse.SUPPRESS)
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- .venv side

def build_drafter(model: str, out: Path, draft_vocab: int, prompts: list[list[int]], max_tokens: int,
                  fit_steps: int) -> Path:
    """A drafter built here, for interop only: random fc/decoder layer, embeddings, lm_head rows
    and norm from the target, the draft vocab = the tokens of the prompts and of the target's
    greedy answers (then the lowest ids). With fit_steps > 0 it is then fitted (draft step 0,
    cross-entropy on the target's next-next token) to those very answers, so that it is accepted
    often enough to compare acceptance counters: it is overfit to these prompts, not a drafter
    worth serving. fit_steps 0 gives the untrained drafter (acceptance ~1: proves loading and
    losslessness only)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    from specdraft.model.eagle3.config import DrafterConfig
    from specdraft.api import load_target, save_drafter
    from specdraft.model.eagle3.module import DynamicCache, Eagle3Drafter, causal_mask
    from specdraft.vocab import count_tokens, mapping_from_counts

    torch.manual_seed(0)
    target = load_target(model)
    aux_ids = [2, target.num_layers // 2, target.num_layers - 3]
    seqs = []                                                                 # prompt + greedy answer
    with torch.no_grad():
        for ids in prompts:
            seq = target.model.generate(torch.tensor([ids]), max_new_tokens=max_tokens, do_sample=False)
            seqs.append(seq[0])                                               # [T]
    all_ids = torch.cat(seqs).numpy()
    counts = count_tokens(all_ids, np.ones_like(all_ids), target.vocab_size)
    d2t, t2d = mapping_from_counts(counts, draft_vocab)
    cfg = DrafterConfig.from_target(target.config, draft_vocab_size=draft_vocab, aux_layer_ids=aux_ids,
                                    verifier=target.path)
    drafter = Eagle3Drafter(cfg)
    drafter.init_from_target(target.model, d2t, t2d)
    if fit_steps > 0:
        draft_id_of = torch.cumsum(t2d.long(), 0) - 1                         # [V] target id -> draft id
        examples = []
        with torch.no_grad():
            for seq in seqs:
                hs = target.model(seq[None], output_hidden_states=True).hidden_states
                aux = torch.cat([hs[i] for i in aux_ids], dim=-1)[:, :-2]     # [1, T-2, 3H]: aux(t)
                labels = torch.where(t2d[seq[2:]], draft_id_of[seq[2:]], -100)  # token t+2 -> draft id
                examples.append((aux, seq[None, 1:-1], labels[None]))         # token t+1 [1, T-2]
        params = [p for p in drafter.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=1e-3)
        for step in range(fit_steps):
            loss = 0.0
            for aux, tokens, labels in examples:
                T = tokens.shape[1]
                logits, _ = drafter(tokens, drafter.combine_aux(aux), torch.arange(T)[None],
                                    causal_mask(torch.zeros(1, T, dtype=torch.long)), DynamicCache())
                loss = loss + F.cross_entropy(logits[0], labels[0], ignore_index=-100)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 25 == 0 or step == fit_steps - 1:
                print(f"interop: fit step {step} loss {loss.item() / len(examples):.3f}", flush=True)
    save_drafter(drafter, out)
    return out


def prompt_token_ids(model: str, n: int) -> list[list[int]]:
    from specdraft.api import load_tokenizer

    tok = load_tokenizer(model)
    return [list(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"])
            for p in PROMPTS[:n]]


def measure_ours(model: str, drafter_dir: Path, prompts: list[list[int]], k: int, max_tokens: int,
                 dtype: str = "bfloat16") -> dict:
    """Our acceptance length: specdraft's greedy chain speculation (target + drafter, K drafts a
    round), in the dtype vLLM runs, on the same token ids."""
    import torch

    from specdraft.families import family_of
    from specdraft.api import generate, load_drafter, load_target

    target = load_target(model, dtype=dtype)
    drafter = load_drafter(drafter_dir, dtype=getattr(torch, dtype), target_model=target.model)
    proposer = family_of(drafter).proposer(drafter, k=k)       # EAGLE-3's chain, or P-EAGLE's one forward
    outputs, accepted, rounds, tokens, seconds = [], 0, 0, 0, 0.0
    per_pos = [0] * k                       # rounds whose draft position i+1 was accepted (vLLM's form)
    for ids in prompts:
        g = generate(target.model, ids, proposer, max_new_tokens=max_tokens)
        outputs.append(g.token_ids)
        for a in g.accepted:
            for i in range(a):
                per_pos[i] += 1
        accepted += sum(g.accepted)
        rounds += len(g.accepted)
        tokens += len(g.token_ids)
        seconds += g.seconds
    return {"accept_len": (accepted + rounds) / rounds if rounds else 1.0, "accepted_tokens": accepted,
            "num_accepted_tokens_per_pos": per_pos, "verify_rounds": rounds, "tokens": tokens, "tokens_per_s": tokens / seconds if seconds else 0.0,
            "dtype": dtype, "outputs": outputs}


def run_engine(vllm_python: str, engine: str, job: dict, workdir: Path) -> dict:
    """One vLLM engine in its own process (one LLM per process: clean start, clean exit)."""
    job_file, result_file = workdir / f"{engine}.job.json", workdir / f"{engine}.result.json"
    job_file.write_text(json.dumps({**job, "result": str(result_file)}))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    env.pop("PYTHONPATH", None)
    log = workdir / f"{engine}.log"
    print(f"interop: vLLM {engine} ... (log {log})", flush=True)
    with open(log, "w") as fh:
        rc = subprocess.run([vllm_python, str(Path(__file__).resolve()), "--engine", engine, "--job", str(job_file)],
                            stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=ROOT).returncode
    if rc != 0 or not result_file.exists():
        tail = log.read_text(errors="replace").splitlines()[-25:]
        return {"ok": False, "error": f"exit {rc}", "log_tail": tail}
    return {"ok": True, **json.loads(result_file.read_text())}


def first_difference(a: list[list[int]], b: list[list[int]]) -> dict | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            at = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            return {"prompt": i, "token": at, "len_a": len(x), "len_b": len(y)}
    return None


def orchestrate(args: argparse.Namespace) -> int:
    from specdraft.targets import resolve

    target_path, target_name = resolve(args.model)
    n = max(1, min(args.prompts, len(PROMPTS)))
    prompts = prompt_token_ids(args.model, n)
    drafter = args.drafter
    if drafter is None:
        drafter = DEFAULT_DRAFTER.with_name(f"drafter-fit{args.fit_steps}-p{n}-t{args.max_tokens}")
        if not (drafter / "config.json").exists():
            print(f"interop: building a drafter in {drafter} (fit steps {args.fit_steps})", flush=True)
            build_drafter(args.model, drafter, args.draft_vocab, prompts, args.max_tokens, args.fit_steps)
    # What is served is what users ship: `specdraft export --weights-dtype bfloat16 --no-embeddings` (vLLM then
    # shares the target's embeddings); ours loads the same folder, taking the target's embeddings too.
    from specdraft.api import export, SpecdraftError

    source = drafter.resolve()
    drafter = DEFAULT_DRAFTER.parent / f"export-{source.name}-bf16-noembed"
    try:
        summary = export(source, drafter, "speculators", speculative_tokens=args.k, dtype="bfloat16",
                         embeddings=False, model=args.model)
    except SpecdraftError as e:
        print(f"--drafter {source}: {e}", file=sys.stderr)
        return 2
    drafter = drafter.resolve()
    print(f"interop: exported {source} -> {drafter} (bfloat16, no embeddings, "
          f"{summary['weight_bytes'] / 1e6:.1f} MB of weights)", flush=True)

    print(f"interop: our acceptance (specdraft, k={args.k}, {n} prompts x {args.max_tokens} tokens)", flush=True)
    ours = measure_ours(args.model, drafter, prompts, args.k, args.max_tokens, args.dtype)

    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    from specdraft.families import family

    fam = family(json.loads((drafter / "config.json").read_text())["speculators_model_type"])
    job = {"target": target_path, "drafter": str(drafter), "k": args.k, "prompts": prompts, "dtype": args.dtype,
           "max_tokens": args.max_tokens, "vllm_speculative": dict(fam.vllm_speculative)}   # method, parallel_drafting
    logs = DEFAULT_DRAFTER.parent / "logs"                       # out/ is git-ignored
    logs.mkdir(parents=True, exist_ok=True)
    runs = {e: run_engine(args.vllm_python, e, job, logs) for e in engines}

    plain = runs.get("plain", {})
    eagle = runs.get("eagle3", {})
    result = {
        "target": target_name, "target_path": target_path, "drafter": str(drafter), "drafter_built_here": args.drafter is None,
        "family": fam.model_type, "vllm_speculative": dict(fam.vllm_speculative),
        "export": {"source": str(source), "dtype": summary["dtype"], "embed_tokens": summary["has_embed_tokens"],
                   "weight_bytes": summary["weight_bytes"],
                   "file_bytes": (drafter / "model.safetensors").stat().st_size},
        "fit_steps": args.fit_steps if args.drafter is None else None, "k": args.k,
        "prompts": n, "max_tokens": args.max_tokens, "dtype": args.dtype,
        "vllm_version": next((r.get("vllm_version") for r in runs.values() if r.get("vllm_version")), None),
        "tokens_per_s": {e: r.get("tokens_per_s") for e, r in runs.items()},
        "acceptance_len": {"vllm": eagle.get("accept_len"), "ours": ours["accept_len"]},
        "vllm_spec_counters": {e: r.get("spec_counters") for e, r in runs.items() if r.get("spec_counters")},
        "ngram_accept_len": runs.get("ngram", {}).get("accept_len"),
        "ours": {k: v for k, v in ours.items() if k != "outputs"},
        "greedy_equal": {}, "first_difference": {}, "errors": {},
    }
    for e, r in runs.items():
        if not r["ok"]:
            result["errors"][e] = r
    if plain.get("ok"):
        for e in ("ngram", "eagle3"):
            if runs.get(e, {}).get("ok"):
                result["greedy_equal"][f"{e}_vs_plain"] = runs[e]["outputs"] == plain["outputs"]
                result["first_difference"][f"{e}_vs_plain"] = first_difference(runs[e]["outputs"], plain["outputs"])
        # informational: HF bf16 and vLLM bf16 kernels may break near-ties differently
        result["greedy_equal"]["ours_vs_vllm_plain"] = ours["outputs"] == plain["outputs"]
        result["first_difference"]["ours_vs_vllm_plain"] = first_difference(ours["outputs"], plain["outputs"])
    v, o = eagle.get("accept_len"), ours["accept_len"]
    result["acceptance_agrees"] = (abs(v - o) <= args.tolerance * o) if v is not None else None
    result["tolerance"] = args.tolerance
    checks = [result["greedy_equal"].get(f"{e}_vs_plain") for e in ("ngram", "eagle3") if e in engines]
    checks += [result["acceptance_agrees"]] if "eagle3" in engines else []      # only what --engines ran
    result["passed"] = all(c is True for c in checks)

    from specdraft.io import write_json
    write_json(args.out, result)
    print_table(result)
    print(f"interop: wrote {args.out}")
    return 0 if result["passed"] else 1


def print_table(r: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"vLLM {r['vllm_version']} on {r['target']} (k={r['k']}, {r['prompts']} prompts, "
                    f"<= {r['max_tokens']} tokens, batch 1)")
    for col in ("method", "tokens/s", "accept len", "greedy == plain"):
        t.add_column(col)
    fmt = lambda x: "-" if x is None else (f"{x:.2f}" if isinstance(x, float) else str(x))  # noqa: E731
    eq = r["greedy_equal"]
    t.add_row("vLLM plain", fmt(r["tokens_per_s"].get("plain")), "1.00", "-")
    t.add_row("vLLM n-gram", fmt(r["tokens_per_s"].get("ngram")), fmt(r["ngram_accept_len"]),
              fmt(eq.get("ngram_vs_plain")))
    family = r.get("family", "eagle3")                     # the drafter's family; its engine slot is "eagle3"
    t.add_row(f"vLLM {family}", fmt(r["tokens_per_s"].get("eagle3")), fmt(r["acceptance_len"]["vllm"]),
              fmt(eq.get("eagle3_vs_plain")))
    t.add_row(f"specdraft {family} (HF)", fmt(r["ours"]["tokens_per_s"]), fmt(r["acceptance_len"]["ours"]),
              fmt(eq.get("ours_vs_vllm_plain")) + " (vs vLLM plain)")
    Console().print(t)
    vllm_pos = r["vllm_spec_counters"].get("eagle3", {}).get("num_accepted_tokens_per_pos")
    print(f"accepted per draft position: vLLM {vllm_pos}, specdraft {r['ours'].get('num_accepted_tokens_per_pos')}")
    print(f"acceptance agrees within ±{r['tolerance']:.0%}: {r['acceptance_agrees']}; "
          f"errors: {sorted(r['errors']) or 'none'}; passed: {r['passed']}")


# ----------------------------------------------------------------------------- vLLM side

def spec_counters(llm) -> dict:
    """vLLM's spec-decode counters (sums over the engine's life), from LLM.get_metrics()."""
    out: dict = {}
    for m in llm.get_metrics():
        if m.name.startswith("vllm:spec_decode_"):
            key = m.name.removeprefix("vllm:spec_decode_")
            out[key] = list(m.values) if hasattr(m, "values") else m.value
    return out


def counter_delta(after: dict, before: dict) -> dict:
    delta = {}
    for k, v in after.items():
        b = before.get(k, 0 if not isinstance(v, list) else [0] * len(v))
        delta[k] = [x - y for x, y in zip(v, b)] if isinstance(v, list) else v - b
    return delta


def engine_main(engine: str, job: dict) -> None:
    import vllm
    from vllm import LLM, SamplingParams

    spec = None
    if engine == "ngram":
        spec = {"method": "ngram", "num_speculative_tokens": job["k"], "prompt_lookup_max": 4,
                "prompt_lookup_min": 2}
    elif engine == "eagle3":                  # the drafter: EAGLE-3, or P-EAGLE (eagle3 + parallel drafting)
        spec = {**job["vllm_speculative"], "model": job["drafter"], "num_speculative_tokens": job["k"]}
    llm = LLM(model=job["target"], dtype=job.get("dtype", "float32"), enforce_eager=True, speculative_config=spec,
              max_model_len=1024, max_num_seqs=1, seed=0, disable_log_stats=False)
    params = SamplingParams(temperature=0.0, max_tokens=job["max_tokens"])
    prompts = [{"prompt_token_ids": ids} for ids in job["prompts"]]
    llm.generate(prompts[:1], SamplingParams(temperature=0.0, max_tokens=8), use_tqdm=False)  # warm-up
    before = spec_counters(llm)
    outputs, tokens, seconds = [], 0, 0.0
    for p in prompts:  # batch 1, like our own generation
        start = time.perf_counter()
        out = llm.generate([p], params, use_tqdm=False)[0].outputs[0]
        seconds += time.perf_counter() - start
        outputs.append(list(out.token_ids))
        tokens += len(out.token_ids)
    counters = counter_delta(spec_counters(llm), before)
    result = {"engine": engine, "vllm_version": vllm.__version__, "outputs": outputs, "tokens": tokens,
              "seconds": seconds, "tokens_per_s": tokens / seconds if seconds else 0.0}
    if spec is not None:
        drafts = counters.get("num_drafts", 0)
        result["spec_counters"] = counters
        result["accept_len"] = 1 + counters.get("num_accepted_tokens", 0) / drafts if drafts else None
    Path(job["result"]).write_text(json.dumps(result))


if __name__ == "__main__":
    args = parse_args()
    if args.engine:
        engine_main(args.engine, json.loads(args.job.read_text()))
    else:
        sys.exit(orchestrate(args))
