"""Our trainer vs speculators 0.9's (vLLM project), same data: training tokens/s, per-position
validation accuracy, and both drafters benched in our loop on the same held-out prompts.

    make vs-speculators                        # the demo workspace (ws/demo), defaults below
    .venv/bin/python benchmarks/vs_speculators.py --store ws/demo/hidden --vocab ws/demo/vocab.safetensors \\
        --model default [--config src/specdraft/recipes/quick.yaml] [--epochs 5] [--ttt-steps 2] \\
        [--max-tokens 512] [--threads 2] [--limit N] [--bench-prompts 6] [--spec-args "--lr 3e-3"] \\
        [--out benchmarks/results/vs_speculators.json]

speculators lives in its own environment, benchmarks/.venv-speculators (gitignored), which this
script creates when it is missing: `pip install torch==2.13.0 speculators==0.9.*` in one call (an
unpinned torch would pull a CUDA build), then torchvision/torchaudio are removed again (PyPI's
builds of them are for other torches and break `import transformers` beside the CPU torch, as in
.venv). Nothing of speculators is imported into specdraft or copied into this repository: its
trainer runs in a child process of that environment (this file, `--child speculators`).

Same inputs for both:
- data: the hidden-state store (our format) split as our trainer splits it (`split_samples`,
  --val-fraction, --seed); the same samples are written as speculators' offline data
  (`store_to_speculators`: a `datasets` folder with input_ids / loss_mask / seq_len and
  hidden_states/hs_{i}.safetensors holding token_ids and hidden_states [T, 4, H] = 3 aux + last),
  train samples first, then the validation ones, with --train-data-ratio cutting exactly there;
  with train_on_prompts (the quick recipe) the train rows get an all-ones loss mask, the
  validation rows keep the store's mask, which is what our trainer does;
- the draft vocab (our vocab file's d2t/t2d as speculators' .npy files), TTT steps, packed rows
  of --max-tokens tokens (one row per step: speculators' batch), epochs, threads (both children
  run with OMP_NUM_THREADS and torch.set_num_threads = --threads, no data-loader workers);
- the drafter: the same layout (norm_before_residual, norm_output, fc_norm as our config says;
  speculators' norm_before_fc off, full attention), the same precision (our --precision auto picks
  bf16 autocast where the CPU has AVX512-BF16/AMX, fp32 elsewhere; speculators' hidden_states_dtype
  follows), speculators' CPU path: sdpa attention, eager loss; teacher forcing in both (speculators
  0.9 feeds the data's tokens at TTT steps k>0, our ttt_inputs "data").
Each trainer keeps its own recipe (ours: --config; speculators: its defaults, Muon + AdamW, lr 1e-3,
linear schedule), --spec-args adds speculators flags.

Measured:
- training tokens/s: tokens of the training samples (each capped at --max-tokens) x epochs / the
  seconds spent in the training epochs (validation and checkpoint writes excluded, for both);
  the trainers run back to back, --rounds > 1 repeats them interleaved (ours, theirs, ours, ...);
- per-position validation accuracy of the final drafters, both measured by the same code (our
  TTT evaluator on the validation samples; speculators' checkpoint read through `specdraft
  import`), plus each trainer's own final validation numbers;
- bench: `specdraft bench --methods eagle3` on the builtin held-out prompts for each drafter,
  interleaved: tau (mean acceptance length) and per-position acceptance.

speculators' trainer does not run on a CPU as shipped (the error is recorded in the JSON under
`speculators_cpu`); the child applies the smallest patches that let it run (device "cpu" instead
of local rank 0, i.e. cuda:0) and says which.
Writes benchmarks/results/vs_speculators.json and vs_speculators.md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SPEC_VENV = ROOT / "benchmarks" / ".venv-speculators"
SPEC_PIN = "speculators==0.9.*"
TORCH_PIN = "torch==2.13.0"


# ----------------------------------------------------------------------------- speculators' environment

def spec_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def ensure_speculators_env(venv: Path, pin: str = SPEC_PIN) -> str:
    """Create the speculators environment when it cannot import the trainer; returns its version."""
    py = spec_python(venv)
    probe = [str(py), "-c", "import importlib.metadata as m, speculators.train.cli; print(m.version('speculators'))"]
    ok = py.exists() and subprocess.run(probe, capture_output=True, text=True)
    if not ok or ok.returncode != 0:
        print(f"creating {venv} ({TORCH_PIN} {pin}; a few minutes)", flush=True)
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", TORCH_PIN, pin], check=True)
        subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "-q", "torchvision", "torchaudio"], check=False)
        ok = subprocess.run(probe, capture_output=True, text=True)
        if ok.returncode != 0:
            raise SystemExit(f"{venv}: speculators does not import:\n{ok.stderr[-3000:]}")
    return ok.stdout.strip()


# ----------------------------------------------------------------------------- data: our store -> speculators

def store_to_speculators(store, sample_ids: list[int], out: Path, vocab=None,
                         all_ones_mask: set[int] | None = None) -> Path:
    """Write samples `sample_ids` of a HiddenStore as speculators' offline training data, in that order:

        out/                       datasets.save_to_disk: input_ids, loss_mask (int64), seq_len (torch format)
                                   (speculators' --data-path)
        out/hidden_states/hs_{j}.safetensors   token_ids [T] int64, hidden_states [T, 4, H] (3 aux + last)
        out/d2t.npy, out/t2d.npy   the draft vocab (with `vocab`)

    Rows j whose sample id is in `all_ones_mask` get a loss mask of ones (train_on_prompts)."""
    import datasets
    import numpy as np
    import torch
    from safetensors.torch import save_file

    out = Path(out)
    hs_dir = out / "hidden_states"
    hs_dir.mkdir(parents=True, exist_ok=True)
    rows = {"input_ids": [], "loss_mask": [], "seq_len": []}
    for j, i in enumerate(sample_ids):
        s = store[i]
        ids = s["input_ids"].long()
        mask = torch.ones_like(ids) if all_ones_mask and i in all_ones_mask else s["loss_mask"].long()
        hidden = torch.cat([s["aux"], s["last"][:, None]], dim=1).contiguous()           # [T, 4, H]
        save_file({"token_ids": ids.contiguous(), "hidden_states": hidden}, str(hs_dir / f"hs_{j}.safetensors"))
        rows["input_ids"].append(ids.tolist())
        rows["loss_mask"].append(mask.tolist())
        rows["seq_len"].append(len(ids))
    features = datasets.Features({"input_ids": datasets.Sequence(datasets.Value("int64")),
                                  "loss_mask": datasets.Sequence(datasets.Value("int64")),
                                  "seq_len": datasets.Value("int64")})
    ds = datasets.Dataset.from_dict(rows, features=features)
    ds.set_format(type="torch")
    ds.save_to_disk(str(out))
    if vocab is not None:
        np.save(out / "d2t.npy", vocab.d2t.to(torch.int64).numpy())
        np.save(out / "t2d.npy", vocab.t2d.to(torch.bool).numpy())
    return out


def read_speculators_sample(folder: Path, j: int) -> dict:
    """Row j of `store_to_speculators` output back in the store's form (input_ids, loss_mask, aux, last)."""
    import datasets
    from safetensors.torch import load_file

    hs = load_file(str(Path(folder) / "hidden_states" / f"hs_{j}.safetensors"))
    row = datasets.load_from_disk(str(folder))[j]
    return {"input_ids": hs["token_ids"], "loss_mask": row["loss_mask"], "seq_len": int(row["seq_len"]),
            "aux": hs["hidden_states"][:, :-1], "last": hs["hidden_states"][:, -1]}


def sub_store(store, sample_ids: list[int], out: Path) -> Path:
    """A store holding only `sample_ids` of `store` (for --limit), one shard, same target and layers."""
    import torch

    from specdraft.data.store import StoreWriter, new_manifest

    m = store.manifest
    writer = StoreWriter(out, new_manifest(m["target"], m["layer_ids"], m["dtype"], m["hidden_size"],
                                           source_store=str(store.root), source_samples=len(sample_ids)))
    samples = [store[i] for i in sample_ids]
    offsets = torch.tensor([0] + [len(s["input_ids"]) for s in samples]).cumsum(0)
    cat = lambda key: torch.cat([s[key] for s in samples])
    writer.write_shard(cat("aux"), cat("last"), cat("input_ids"), cat("loss_mask"), offsets)
    writer.save(complete=True)
    return out


# ----------------------------------------------------------------------------- children: the two trainers

def set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(threads)


def child_speculators(job: dict) -> dict:
    """speculators' own `train` entry (TrainConfig.resolve + cli.main), in its environment, with the
    CPU patches it needs; times its training epochs (Trainer.train_epoch)."""
    set_threads(job["threads"])
    import speculators.train.trainer as trainer_mod
    from speculators.train.cli import main
    from speculators.train.config import TrainConfig

    patches = []
    if job.get("cpu_patch", True):
        # As shipped, Trainer.setup_model calls model.to(get_local_rank()), i.e. device 0 = the
        # accelerator, and torch.autocast uses "cuda" when no accelerator exists: on a CPU-only
        # machine that is "RuntimeError: Cannot access accelerator device when none is available."
        trainer_mod.get_local_rank = lambda: "cpu"
        original_init = trainer_mod.Trainer.__init__

        def init_on_cpu(self, *args, **kwargs):
            original_init(self, *args, **kwargs)
            self.device_type = "cpu"

        trainer_mod.Trainer.__init__ = init_on_cpu
        # The step timer of logged steps (every --log-freq) calls torch.accelerator.synchronize(),
        # which raises the same error without an accelerator: nothing to wait for on a CPU.
        import torch

        if not torch.accelerator.is_available():
            torch.accelerator.synchronize = lambda *args, **kwargs: None
        patches += ["Trainer: device 'cpu' instead of local rank 0 (model.to / batch.to)",
                    "Trainer.device_type 'cpu' for torch.autocast",
                    "torch.accelerator.synchronize() a no-op (the step timer calls it)"]
    epochs, val_seconds = [], []
    original_epoch, original_val = trainer_mod.Trainer.train_epoch, trainer_mod.Trainer.val_epoch

    def timed_epoch(self, epoch, **kwargs):
        t0, c0 = time.perf_counter(), time.process_time()
        out = original_epoch(self, epoch, **kwargs)
        epochs.append({"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
                       "steps": self.global_step})
        return out

    def timed_val(self, epoch):
        t0 = time.perf_counter()
        out = original_val(self, epoch)
        val_seconds.append(time.perf_counter() - t0)
        epochs[-1]["val"] = out
        return out

    trainer_mod.Trainer.train_epoch, trainer_mod.Trainer.val_epoch = timed_epoch, timed_val
    started = time.perf_counter()
    main(TrainConfig.resolve(job["argv"]))
    return {"epochs": epochs, "val_seconds": val_seconds, "total_seconds": time.perf_counter() - started,
            "patches": patches}


def child_ours(job: dict) -> dict:
    """Our `train` (train/loop.py) in this process; times run_epoch minus end_epoch (validation,
    checkpoints), the same span speculators' train_epoch covers."""
    set_threads(job["threads"])
    from specdraft.train import loop
    from specdraft.api import resolve_config

    epochs = []
    original_run, original_end = loop.run_epoch, loop.end_epoch

    def timed_end(t, epoch, *args):
        t0, c0 = time.perf_counter(), time.process_time()
        out = original_end(t, epoch, *args)
        epochs[-1]["val_and_save_seconds"] = time.perf_counter() - t0
        epochs[-1]["val_and_save_cpu_seconds"] = time.process_time() - c0
        epochs[-1]["val"] = dict(t.last_val)
        return out

    def timed_run(t, epoch, bar):
        epochs.append({})
        t0, c0 = time.perf_counter(), time.process_time()
        out = original_run(t, epoch, bar)
        epochs[-1]["seconds"] = time.perf_counter() - t0 - epochs[-1].get("val_and_save_seconds", 0.0)
        epochs[-1]["cpu_seconds"] = time.process_time() - c0 - epochs[-1].get("val_and_save_cpu_seconds", 0.0)
        epochs[-1]["steps"] = t.state.step
        return out

    loop.run_epoch, loop.end_epoch = timed_run, timed_end
    cfg = resolve_config(job.get("config"), **job["overrides"])
    started = time.perf_counter()
    summary = loop.train(cfg)
    return {"epochs": epochs, "total_seconds": time.perf_counter() - started, "summary": summary,
            "config": cfg.to_dict()}


def run_child(python: Path, kind: str, job: dict, workdir: Path, threads: int) -> dict:
    """This file in `python` with --child KIND; the result comes back as JSON in a file."""
    job_file, result_file = workdir / f"{kind}.job.json", workdir / f"{kind}.result.json"
    job_file.write_text(json.dumps(job))
    result_file.unlink(missing_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    log = workdir / f"{kind}.log"
    with open(log, "w") as fh:
        proc = subprocess.run([str(python), str(Path(__file__).resolve()), "--child", kind, "--job", str(job_file),
                               "--result", str(result_file)], stdout=fh, stderr=subprocess.STDOUT, env=env,
                              cwd=ROOT)
    if proc.returncode != 0 or not result_file.exists():
        tail = log.read_text()[-4000:]
        return {"error": f"exit {proc.returncode}", "log": str(log), "log_tail": tail}
    return json.loads(result_file.read_text())


# ----------------------------------------------------------------------------- the parent: plan, measure, report

LOSSES = {"kl": "kl_div", "ce": "ce", "tv": "tv", "jsd": "jsd"}   # our --loss -> speculators' --loss-fn


def speculators_argv(cfg, data: Path, save: Path, model_path: str, vocab_size: int, ratio: float, bf16: bool,
                     extra: list[str]) -> list[str]:
    """speculators' train flags for the same data, vocab, TTT steps, rows, epochs and drafter layout."""
    flag = lambda name, on: f"--{name}" if on else f"--no-{name}"
    return ["--speculator-type", "eagle3", "--verifier-name-or-path", model_path,
            "--data-path", str(data), "--d2t-path", str(data / "d2t.npy"), "--t2d-path", str(data / "t2d.npy"),
            "--draft-vocab-size", str(vocab_size), "--ttt-steps", str(cfg.ttt_steps),
            "--ttt-step-loss-decay", str(cfg.step_decay), "--total-seq-len", str(cfg.max_tokens),
            "--epochs", str(cfg.epochs), "--train-data-ratio", f"{ratio:.6f}", "--seed", str(cfg.seed),
            "--num-workers", "0", "--hidden-states-dtype", "bfloat16" if bf16 else "float32", "--on-missing", "raise",
            *(["--loss-fn", LOSSES[cfg.loss]] if cfg.loss in LOSSES else []),
            "--draft-attn-impl", "sdpa", "--loss-implementation", "eager", "--full-attention-indices", "0",
            flag("norm-before-residual", cfg.norm_before_residual),
            flag("norm-output", getattr(cfg, "norm_output", False)),
            *(["--fc-norm"] if getattr(cfg, "fc_norm", False) else []), "--no-norm-before-fc",
            "--log-freq", str(cfg.log_every), "--save-path", str(save / "checkpoints"),
            "--log-dir", str(save / "logs"), "--no-resume-from-checkpoint", *extra]


def evaluate_drafter(folder: Path, store, val_ids: list[int], target, vocab, cfg, bf16_weights: bool = False) -> dict:
    """Validation metrics of a drafter checkpoint by our TTT evaluator (same code for both drafters)."""
    import torch

    from specdraft.api import load_drafter
    from specdraft.train.batches import StoreBatches
    from specdraft.model.eagle3.objective import TTTObjective
    from specdraft.train.objective import TeacherHead
    from specdraft.train.runtime import Runtime
    from specdraft.train.step import evaluate

    drafter = load_drafter(folder, target_model=target.model)
    if bf16_weights:
        with torch.no_grad():
            for p in drafter.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    teacher = TeacherHead.from_target(target.model, vocab.d2t)
    objective = TTTObjective(drafter, teacher, steps=cfg.ttt_steps)
    batches = StoreBatches(store, val_ids, max_tokens=cfg.max_tokens, shuffle=False)
    return evaluate(objective, batches, Runtime(device=torch.device("cpu")), bf16=False)


def bench_drafter(model: str, drafter: Path, out: Path, prompts: int, new_tokens: int, k: int,
                  threads: int, rounds: int) -> dict:
    """`specdraft bench --methods eagle3` (greedy is its reference) on the builtin held-out prompts.
    tau is deterministic under greedy decoding: one round is enough for it (--rounds where bench has it)."""
    specdraft = str(Path(sys.executable).parent / "specdraft")
    cmd = [specdraft, "bench", "--model", model, "--drafter", str(drafter), "--methods", "eagle3",
           "--limit", str(prompts), "--max-new-tokens", str(new_tokens), "-k", str(k), "--out", str(out)]
    if "--rounds" in subprocess.run([specdraft, "bench", "--help"], capture_output=True, text=True).stdout:
        cmd += ["--rounds", str(rounds)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0 or not out.exists():
        return {"error": f"exit {proc.returncode}", "stderr": proc.stderr[-3000:], "command": " ".join(cmd)}
    report = json.loads(out.read_text())
    m = report["methods"]["eagle3"]
    keep = ("accept_len", "per_position_accept", "speedup", "tokens_per_s", "identical_to_greedy")
    return {**{key: m.get(key) for key in keep}, "greedy_tokens_per_s": report["methods"]["greedy"]["tokens_per_s"],
            "command": " ".join(cmd)}


def speculators_step_profile(log: Path) -> dict:
    """Medians of the per-step split speculators' own step timer logs (profile/fwd_ms=..., every
    --log-freq steps), from its console log."""
    import re

    values: dict[str, list[float]] = {}
    for key, value in re.findall(r"profile/(\w+_ms)=([0-9.e+-]+)", log.read_text() if log.exists() else ""):
        values.setdefault(key, []).append(float(value))
    return {key: statistics.median(v) for key, v in values.items()}


def train_tokens(store, ids: list[int], max_tokens: int) -> int:
    lengths = store.sample_lengths
    return sum(min(lengths[i], max_tokens) for i in ids)


def final_epoch_checkpoints(work: Path, epochs: int) -> tuple[Path, Path]:
    return (work / "ours" / "checkpoints" / f"epoch-{epochs}",
            work / "speculators" / "checkpoints" / str(epochs - 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="ws/demo/hidden")
    ap.add_argument("--vocab", default="ws/demo/vocab.safetensors")
    ap.add_argument("--model", default="default")
    ap.add_argument("--config", default="src/specdraft/recipes/quick.yaml",
                    help="our training settings (a recipe or train config); the flags below override it")
    ap.add_argument("--epochs", type=int)
    ap.add_argument("--ttt-steps", type=int)
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--precision", choices=("auto", "fp32", "bf16"),
                    help="both trainers (default: the config's, auto = bf16 autocast where the CPU has it)")
    ap.add_argument("--limit", type=int, help="use only the first N samples of the store")
    ap.add_argument("--rounds", type=int, default=1, help="train both this many times, interleaved")
    ap.add_argument("--spec-args", default="", help="extra speculators train flags, e.g. '--lr 3e-3 --optimizer adamw'")
    ap.add_argument("--spec-venv", type=Path, default=SPEC_VENV)
    ap.add_argument("--bench-prompts", type=int, default=6)
    ap.add_argument("--bench-tokens", type=int, default=128)
    ap.add_argument("-k", type=int, default=4, help="draft tokens per round in bench")
    ap.add_argument("--bench-rounds", type=int, default=1, help="bench rounds (tau needs one; speed wants 3+)")
    ap.add_argument("--no-bench", action="store_true")
    ap.add_argument("--reuse", action="store_true",
                    help="do not train: take both runs from --work (a previous run's), re-evaluate and re-bench")
    ap.add_argument("--work", type=Path, default=ROOT / "ws" / "vs_speculators",
                    help="scratch folder: converted data, both runs, imports, bench JSON")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "vs_speculators.json")
    args = ap.parse_args()

    import shlex
    import shutil

    import torch

    from specdraft import vocab as vocab_mod
    from specdraft.api import HiddenStore, import_checkpoint, resolve_config
    from specdraft.targets import load_target_head, resolve
    from specdraft.train.batches import split_samples
    from specdraft.train.runtime import use_bf16

    version = ensure_speculators_env(args.spec_venv)
    work = args.work.resolve()
    if work.exists() and not args.reuse:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    store = HiddenStore(args.store)
    store_path = Path(args.store)
    if args.limit and args.limit < len(store):
        store_path = (work / "store" if args.reuse and (work / "store").exists()
                      else sub_store(store, list(range(args.limit)), work / "store"))
        store = HiddenStore(store_path)
    overrides = {k: v for k, v in {"epochs": args.epochs, "ttt_steps": args.ttt_steps,
                                   "max_tokens": args.max_tokens, "precision": args.precision}.items()
                 if v is not None}
    overrides.update(store=str(store_path), vocab=args.vocab, model=args.model, out=str(work / "ours"),
                     rows_per_batch=1, overwrite=True, progress=False)
    cfg = resolve_config(args.config, **overrides)
    vocab = vocab_mod.load(args.vocab)
    train_ids, val_ids = split_samples(len(store), cfg.val_fraction, cfg.seed)
    spec_data = work / "speculators-data"
    if not args.reuse:
        store_to_speculators(store, train_ids + val_ids, spec_data, vocab,
                             all_ones_mask=set(train_ids) if cfg.train_on_prompts else None)
    ratio = (len(train_ids) + 0.5) / (len(train_ids) + len(val_ids))
    model_path, _ = resolve(args.model)
    bf16 = use_bf16(cfg, torch.device("cpu"))     # --precision auto: bf16 autocast where the CPU has it
    argv = speculators_argv(cfg, spec_data, work / "speculators", model_path, vocab.draft_vocab_size, ratio,
                            bf16, shlex.split(args.spec_args))
    tokens = train_tokens(store, train_ids, cfg.max_tokens) * cfg.epochs
    print(f"speculators {version}; {len(train_ids)} train / {len(val_ids)} val samples, {tokens:,} training "
          f"tokens ({cfg.epochs} epochs, rows of {cfg.max_tokens}), TTT {cfg.ttt_steps}, {args.threads} threads",
          flush=True)

    runs = {"ours": [], "speculators": []}
    ours_job = {"threads": args.threads, "config": args.config, "overrides": overrides}
    spec_job = {"threads": args.threads, "argv": argv}
    for r in range(args.rounds):
        order = ["ours", "speculators"] if r % 2 == 0 else ["speculators", "ours"]
        for name in order:
            load_before = os.getloadavg()[0]
            if args.reuse:
                res = json.loads((work / f"{name}.result.json").read_text())
                seconds = sum(e["seconds"] for e in res["epochs"])
                res.setdefault("load_before", None)
            elif name == "ours":
                res = run_child(Path(sys.executable), "ours", ours_job, work, args.threads)
            else:
                res = run_child(spec_python(args.spec_venv), "speculators", spec_job, work, args.threads)
            if "error" in res:
                raise SystemExit(f"{name} training failed ({res['error']}), see {res['log']}:\n{res['log_tail']}")
            seconds = sum(e["seconds"] for e in res["epochs"])
            cpu = sum(e["cpu_seconds"] for e in res["epochs"]) / args.threads
            if not args.reuse:
                res.update(load_before=load_before, load_after=os.getloadavg()[0])
            res.update(train_seconds=seconds, tokens_per_s=tokens / seconds, train_cpu_seconds_per_thread=cpu,
                       tokens_per_s_cpu_time=tokens / cpu)
            (work / f"{name}.result.json").write_text(json.dumps(res, default=str))
            runs[name].append(res)
            print(f"round {r + 1} {name}: {seconds:.1f} s in training epochs, {tokens / seconds:,.0f} tok/s, "
                  f"{res['epochs'][-1]['steps']} steps", flush=True)

    ours_ckpt, spec_ckpt = final_epoch_checkpoints(work, cfg.epochs)
    imported = work / "speculators-imported"
    if imported.exists():
        shutil.rmtree(imported)
    import_checkpoint(spec_ckpt, imported)
    target = load_target_head(args.model)
    val = {"ours": evaluate_drafter(ours_ckpt, store, val_ids, target, vocab, cfg),
           "ours_bf16_weights": evaluate_drafter(ours_ckpt, store, val_ids, target, vocab, cfg, bf16_weights=True),
           "speculators": evaluate_drafter(imported, store, val_ids, target, vocab, cfg)}
    bench = {}
    if not args.no_bench:
        for name, folder in (("ours", ours_ckpt), ("speculators", imported)):
            bench[name] = bench_drafter(args.model, folder, work / f"bench-{name}.json", args.bench_prompts,
                                        args.bench_tokens, args.k, args.threads, args.bench_rounds)
            print(f"bench {name}: tau {bench[name].get('accept_len')}", flush=True)

    tps = {n: statistics.median(x["tokens_per_s"] for x in rs) for n, rs in runs.items()}
    tps_cpu = {n: statistics.median(x["tokens_per_s_cpu_time"] for x in rs) for n, rs in runs.items()}
    step_ms = {n: 1000 * statistics.median(x["train_seconds"] / x["epochs"][-1]["steps"] for x in rs)
               for n, rs in runs.items()}
    result = {
        "speculators_version": version, "store": str(args.store), "vocab": args.vocab, "model": args.model,
        "samples": {"train": len(train_ids), "val": len(val_ids), "limit": args.limit},
        "settings": {"epochs": cfg.epochs, "ttt_steps": cfg.ttt_steps, "max_tokens": cfg.max_tokens,
                     "threads": args.threads, "train_on_prompts": cfg.train_on_prompts, "rounds": args.rounds,
                     "bench_prompts": args.bench_prompts, "bench_tokens": args.bench_tokens, "k": args.k,
                     "bench_rounds": args.bench_rounds, "reused_runs": args.reuse,
                     "bf16_autocast": bf16, "loss": cfg.loss, "ttt_inputs": getattr(cfg, "ttt_inputs", "data"),
                     "ours_config": args.config, "ours_lr": cfg.lr, "speculators_argv": argv},
        "train_tokens": tokens,
        "tokens_per_s": tps, "ratio_ours_over_speculators": tps["ours"] / tps["speculators"],
        "tokens_per_s_cpu_time": tps_cpu,
        "ratio_ours_over_speculators_cpu_time": tps_cpu["ours"] / tps_cpu["speculators"],
        "steps": {n: rs[-1]["epochs"][-1]["steps"] for n, rs in runs.items()},
        "step_ms": step_ms, "speculators_step_profile_ms": speculators_step_profile(work / "speculators.log"),
        "val_same_evaluator": val,
        "val_own": {"ours": runs["ours"][-1]["epochs"][-1].get("val"),
                    "speculators": runs["speculators"][-1]["epochs"][-1].get("val")},
        "speculators_cpu": {"as_shipped": "RuntimeError: Cannot access accelerator device when none is available. "
                            "(Trainer.setup_model: self.model.to(self.local_rank); then the step timer's "
                            "torch.accelerator.synchronize())",
                            "patches": runs["speculators"][-1].get("patches")},
        "bench": bench, "runs": runs, "machine": {"cores": os.cpu_count(), "load_avg": os.getloadavg()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    table = markdown_table(result)
    args.out.with_suffix(".md").write_text(table)
    print(table)
    print(f"-> {args.out}, {args.out.with_suffix('.md')}")


def markdown_table(r: dict) -> str:
    """The readable summary: one row per trainer."""
    s = r["settings"]
    steps = s["ttt_steps"]
    head = (f"speculators {r['speculators_version']} vs specdraft, {r['samples']['train']} train / "
            f"{r['samples']['val']} val samples, {r['train_tokens']:,} training tokens ({s['epochs']} epochs, "
            f"rows of {s['max_tokens']}), TTT {steps}, {s['threads']} threads\n\n")
    cols = ["trainer", "train tok/s", "tok/s (CPU time)", "steps"] + [f"val acc {k}" for k in range(steps)] + ["sim τ", "bench τ",
                                                                                            "bench accept/pos"]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name in ("ours", "speculators"):
        v, b = r["val_same_evaluator"][name], r["bench"].get(name, {})
        pos = "/".join(f"{x:.2f}" for x in (b.get("per_position_accept") or []))
        tau = f"{b['accept_len']:.2f}" if b.get("accept_len") is not None else "-"
        lines.append("| " + " | ".join([name, f"{r['tokens_per_s'][name]:,.0f}",
                                        f"{r['tokens_per_s_cpu_time'][name]:,.0f}", str(r["steps"][name])]
                                       + [f"{v.get(f'full_acc_{k}', float('nan')):.3f}" for k in range(steps)]
                                       + [f"{v.get('accept_len', float('nan')):.2f}", tau, pos or "-"]) + " |")
    foot = (f"\nours / speculators training tokens/s: {r['ratio_ours_over_speculators']:.2f}x by wall time, "
            f"{r['ratio_ours_over_speculators_cpu_time']:.2f}x by CPU time (process CPU seconds / threads: what "
            "each would take with the cores to itself; the machine was shared). Validation "
            "accuracy (full_acc_k: correct at every step 0..k) of both final drafters by our evaluator on the same "
            "validation samples; bench τ from `specdraft bench --methods eagle3` on the builtin held-out prompts.\n")
    return head + "\n".join(lines) + "\n" + foot


def child_main(kind: str, job_file: Path, result_file: Path) -> None:
    job = json.loads(Path(job_file).read_text())
    result = {"speculators": child_speculators, "ours": child_ours}[kind](job)
    Path(result_file).write_text(json.dumps(result, default=str))


if __name__ == "__main__" and "--child" in sys.argv:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child", required=True)
    ap.add_argument("--job", type=Path, required=True)
    ap.add_argument("--result", type=Path, required=True)
    a = ap.parse_args()
    child_main(a.child, a.job, a.result)
elif __name__ == "__main__":
    main()
