"""Training throughput of a SmolLM2-sized EAGLE-3 drafter: one optimizer step of the TTT objective.

    .venv/bin/python benchmarks/train_step.py [--batch 8] [--seq 512] [--ttt 3] [--repeats 3]
        [--precisions fp32,bf16] [--bf16-batch 1] [--profile] [--attention]

Drafter: H=576, intermediate 1536, 9 heads / 3 kv heads, head_dim 64, target vocab 49152, draft
vocab 8192 (SmolLM2-135M's shapes); random aux/last/ids, rows packed with 2-4 documents each, loss
mask all ones (the most compute per token). A step = `model.eagle3.objective.ttt_forward` + backward +
AdamW step, i.e. exactly what train/loop.py does per batch. Reported:

- training tokens/s (B*T real tokens per step / median step time),
- FLOPs of one step (torch.utils.flop_counter: matmuls and attention, forward + backward),
- the share of this machine's matmul peak that reaches, the peak measured here with a large
  matmul of the same dtype,
- with --profile, the top operators of a step (torch.profiler), and
- with --attention, the drafter's attention (SDPA over the concatenated TTT keys with an explicit
  mask) against exact alternatives, forward + backward, and the full step with each.

bf16 is measured with --bf16-batch rows (default 1): on a CPU without AVX512-BF16/AMX a bf16 matmul
runs ~10x slower than fp32 and a full 8-row step would take minutes. Writes
benchmarks/results/train_step.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from specdraft.model.eagle3 import module as drafter_mod
from specdraft.model.eagle3.config import DrafterConfig
from specdraft.model.eagle3.module import DynamicCache, Eagle3Drafter
from specdraft.model.eagle3.objective import ttt_forward
from specdraft.train.objective import TeacherHead

SMOLLM2 = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3,
               head_dim=64, vocab_size=49152, draft_vocab_size=8192, aux_layer_ids=[2, 15, 27],
               rms_norm_eps=1e-5, rope_theta=100000.0, max_position_embeddings=8192, target_num_layers=30)


# ----------------------------------------------------------------------------- inputs

def make_drafter(seed: int = 0) -> tuple[Eagle3Drafter, TeacherHead]:
    torch.manual_seed(seed)
    cfg = DrafterConfig(**SMOLLM2)
    drafter = Eagle3Drafter(cfg).train()
    with torch.no_grad():
        drafter.d2t.copy_(torch.arange(cfg.draft_vocab_size) * 5 - torch.arange(cfg.draft_vocab_size))  # target id 5*i
    H, N = cfg.hidden_size, cfg.draft_vocab_size
    teacher = TeacherHead(torch.ones(H), torch.randn(N, H) * 0.05, eps=cfg.rms_norm_eps)
    return drafter, teacher


def make_batch(B: int, T: int, H: int, vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random packed batch: each row holds 2-4 documents of random lengths, loss mask all ones."""
    g = torch.Generator().manual_seed(seed)
    doc_ids = torch.empty(B, T, dtype=torch.long)                                   # [B,T]
    position_ids = torch.empty(B, T, dtype=torch.long)
    for b in range(B):
        n_docs = int(torch.randint(2, 5, (1,), generator=g))
        cuts = sorted(torch.randperm(T - 1, generator=g)[:n_docs - 1].add(1).tolist())
        bounds = [0] + cuts + [T]
        for d in range(n_docs):
            doc_ids[b, bounds[d]:bounds[d + 1]] = d
            position_ids[b, bounds[d]:bounds[d + 1]] = torch.arange(bounds[d + 1] - bounds[d])
    return {"input_ids": torch.randint(0, vocab, (B, T), generator=g),
            "aux": torch.randn(B, T, 3, H, generator=g),                          # [B,T,3,H]
            "last": torch.randn(B, T, H, generator=g),                            # [B,T,H]
            "loss_mask": torch.ones(B, T, dtype=torch.uint8),
            "doc_ids": doc_ids, "position_ids": position_ids}


# ----------------------------------------------------------------------------- attention variants

def attn_reference(self, x, cos, sin, mask, cache: DynamicCache):
    """The drafter's own attention (model/drafter.py), kept here for the A/B switch."""
    return ORIGINAL_FORWARD(self, x, cos, sin, mask, cache)


def attn_gqa(self, x, cos, sin, mask, cache: DynamicCache):
    """Same maths, but SDPA's enable_gqa instead of materialising repeat_kv copies."""
    B, T, _ = x.shape
    q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
    k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
    v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
    q, k = drafter_mod.apply_rotary_pos_emb(q, k, cos, sin)
    k_all, v_all = cache.update(k, v, 0)
    out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=True)
    return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))


def ttt_split_attention(q, k_all, v_all, mask0, T: int):
    """Exact TTT attention without the (k+1)T-wide score matrix.

    q [B,nh,T,hd]; k_all/v_all [B,nkv,(k+1)T,hd] = step-0 block then one T-block per later step;
    mask0 [B|1,1,T,T] the step-0 (document-causal) mask. Query i attends the step-0 keys allowed by
    mask0 plus key i of every later block (the TTT diagonals), under one joint softmax:
        scores0 [B,nh,T,T] (one block, not k+1), diag [B,nh,T,k] = <q_i, k_j,i>
        p = softmax(cat(scores0, diag));  out = p0 @ v0 + sum_j p_j * v_j,i
    """
    B, nh, _, hd = q.shape
    nkv = k_all.shape[1]
    g = nh // nkv
    steps = k_all.shape[2] // T                                                   # k + 1 blocks
    scale = 1.0 / math.sqrt(hd)
    qg = q.view(B, nkv, g, T, hd)                                                 # heads grouped by kv head
    k0, v0 = k_all[:, :, None, :T], v_all[:, :, None, :T]                        # [B,nkv,1,T,hd]
    scores0 = torch.matmul(qg, k0.transpose(-1, -2)) * scale                      # [B,nkv,g,T,T]
    scores0 = scores0.masked_fill(~mask0[:, :, None], float("-inf"))
    if steps == 1:
        p0 = torch.softmax(scores0, dim=-1)
        return torch.matmul(p0, v0).view(B, nh, T, hd)
    kd = k_all[:, :, T:].view(B, nkv, steps - 1, T, hd).transpose(2, 3)           # [B,nkv,T,k,hd]
    vd = v_all[:, :, T:].view(B, nkv, steps - 1, T, hd).transpose(2, 3)
    diag = torch.einsum("bngtd,bntjd->bngtj", qg, kd) * scale                     # [B,nkv,g,T,k]
    p = torch.softmax(torch.cat([scores0, diag], dim=-1), dim=-1)                  # [B,nkv,g,T,T+k]
    out = torch.matmul(p[..., :T], v0) + torch.einsum("bngtj,bntjd->bngtd", p[..., T:], vd)
    return out.reshape(B, nh, T, hd)


def attn_split(self, x, cos, sin, mask, cache: DynamicCache):
    """The drafter's attention with `ttt_split_attention` whenever the cache holds whole TTT
    blocks (training); anything else (generation) falls back to the SDPA path."""
    B, T, _ = x.shape
    q = self.q_proj(x).view(B, T, self.nh, self.hd).transpose(1, 2)
    k = self.k_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
    v = self.v_proj(x).view(B, T, self.nkv, self.hd).transpose(1, 2)
    q, k = drafter_mod.apply_rotary_pos_emb(q, k, cos, sin)
    k_all, v_all = cache.update(k, v, 0)
    S = k_all.shape[2]
    if S % T == 0 and mask.shape[-1] == S and mask.shape[-2] == T:
        out = ttt_split_attention(q, k_all, v_all, mask[..., :T], T)
    else:
        out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=mask, enable_gqa=True)
    return self.o_proj(out.transpose(1, 2).reshape(B, T, self.nh * self.hd))


ORIGINAL_FORWARD = drafter_mod.DrafterAttention.forward
VARIANTS = {"sdpa_concat": attn_reference, "sdpa_gqa": attn_gqa, "split_diag": attn_split}


def use_attention(name: str) -> None:
    drafter_mod.DrafterAttention.forward = VARIANTS[name]


# ----------------------------------------------------------------------------- measurements

def matmul_peak(dtype: torch.dtype, n: int, seconds: float = 2.0) -> tuple[float, float]:
    """FLOP/s of an n x n x n matmul in `dtype`, best of the repeats that fit in `seconds`: by wall
    time, and by this process's CPU time / threads (what it reaches with the cores to itself)."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best, best_cpu, start = 0.0, 0.0, time.perf_counter()
    while True:
        t0, c0 = time.perf_counter(), time.process_time()
        a @ b
        dt, dc = time.perf_counter() - t0, (time.process_time() - c0) / torch.get_num_threads()
        best, best_cpu = max(best, 2 * n ** 3 / dt), max(best_cpu, 2 * n ** 3 / max(dc, 1e-9))
        if time.perf_counter() - start > seconds:
            return best, best_cpu


def autocast(precision: str):
    return torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16" else nullcontext()


def step_fn(drafter, teacher, optimizer, batch, ttt: int, precision: str):
    def step():
        with autocast(precision):
            loss, _ = ttt_forward(drafter, teacher, batch, steps=ttt)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return loss
    return step


def step_flops(step) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        step()
    return int(counter.get_total_flops())


def time_step(step, repeats: int) -> list[float]:
    """Seconds per step; call after step_flops (that step is the warm-up: allocator, AdamW state)."""
    times, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return times, cpu


def profile_step(step, rows: int = 18) -> tuple[str, list[dict]]:
    from torch.profiler import ProfilerActivity, profile

    step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    averages = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in averages)
    top = sorted(averages, key=lambda e: -e.self_cpu_time_total)[:rows]
    split = [{"op": e.key, "self_ms": e.self_cpu_time_total / 1e3, "share": e.self_cpu_time_total / total,
              "calls": e.count} for e in top]
    return averages.table(sort_by="self_cpu_time_total", row_limit=rows), split


def attention_micro(B: int, T: int, ttt: int, repeats: int) -> dict:
    """Forward + backward of the attention core alone over `ttt` TTT steps, per variant, and the
    largest difference of each variant's output and gradients from the SDPA reference."""
    torch.manual_seed(0)
    nh, nkv, hd = 9, 3, 64
    batch = make_batch(B, T, 8, 16)
    masks = [drafter_mod.ttt_mask(batch["doc_ids"], k) for k in range(ttt)]
    qs = [torch.randn(B, nh, T, hd, requires_grad=True) for _ in range(ttt)]
    ks = [torch.randn(B, nkv, T, hd, requires_grad=True) for _ in range(ttt)]
    vs = [torch.randn(B, nkv, T, hd, requires_grad=True) for _ in range(ttt)]

    def run(kind: str):
        outs = []
        for k in range(ttt):
            k_all, v_all = torch.cat(ks[:k + 1], 2), torch.cat(vs[:k + 1], 2)
            if kind == "sdpa_concat":
                o = F.scaled_dot_product_attention(qs[k], drafter_mod.repeat_kv(k_all, nh // nkv),
                                                   drafter_mod.repeat_kv(v_all, nh // nkv), attn_mask=masks[k])
            elif kind == "sdpa_gqa":
                o = F.scaled_dot_product_attention(qs[k], k_all, v_all, attn_mask=masks[k], enable_gqa=True)
            else:
                o = ttt_split_attention(qs[k], k_all, v_all, masks[k][..., :T], T)
            outs.append(o)
        total = sum((o * (i + 1)).sum() for i, o in enumerate(outs))
        grads = torch.autograd.grad(total, qs + ks + vs)
        return torch.stack([o.detach() for o in outs]), grads

    ref_out, ref_grads = run("sdpa_concat")
    result = {}
    for kind in VARIANTS:
        out, grads = run(kind)
        err = max([(out - ref_out).abs().max().item()] + [(a - b).abs().max().item()
                                                           for a, b in zip(grads, ref_grads)])
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            run(kind)
            times.append(time.perf_counter() - t0)
        result[kind] = {"fwd_bwd_s": statistics.median(times), "max_abs_diff_vs_sdpa_concat": err}
    return result


# ----------------------------------------------------------------------------- bf16 vs fp32 quality

def precision_quality(workdir: Path, epochs: int, samples: int, seq: int, hidden: int) -> dict:
    """The same small run (tiny random target, its fp32 store, train/loop.py) in fp32 and in bf16
    autocast; returns each run's final validation metrics and train loss."""
    from specdraft import vocab as vocab_mod
    from specdraft.api import capture_samples, load_target, RunConfig, train
    from specdraft.data.capture import recording
    from specdraft.data.store import StoreWriter, new_manifest
    from specdraft.testing import save_tiny_target

    layers = [2, 4, 5]
    folder = save_tiny_target(workdir / "target", hidden_size=hidden, intermediate_size=2 * hidden)
    target = load_target(str(folder))
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(7, 7 + 120, (seq,), generator=g).tolist() for _ in range(samples)]
    masks = [[0] * 8 + [1] * (seq - 8) for _ in ids]
    writer = StoreWriter(workdir / "hidden", new_manifest(target.identity, layers, "float32", target.hidden_size))
    with recording(target.model, layers) as rec:
        aux, last, offsets = capture_samples(target.model, ids, layers, torch.float32, 8192, rec)
    writer.write_shard(aux, last, torch.tensor(sum(ids, [])), torch.tensor(sum(masks, []), dtype=torch.uint8), offsets)
    writer.save(complete=True)
    counts = vocab_mod.count_tokens(torch.tensor(sum(ids, [])).numpy(), torch.tensor(sum(masks, [])).numpy(),
                                    target.vocab_size)
    d2t, t2d = vocab_mod.mapping_from_counts(counts, 96)
    vocab_mod.save(vocab_mod.Vocab(d2t, t2d, {"target_id": target.name, "fingerprint": target.identity["fingerprint"]}),
                   workdir / "vocab.safetensors")
    out = {}
    for precision in ("fp32", "bf16"):
        cfg = RunConfig(out=str(workdir / f"run-{precision}"), store=str(workdir / "hidden"),
                        vocab=str(workdir / "vocab.safetensors"), model=str(folder), max_tokens=seq,
                        rows_per_batch=1, epochs=epochs, lr=1e-3, warmup_steps=20, log_every=10,
                        val_fraction=0.1, progress=False, precision=precision)
        t0 = time.perf_counter()
        summary = train(cfg, target=target)
        lines = [json.loads(x) for x in (Path(cfg.out) / "metrics.jsonl").read_text().splitlines()]
        train_lines = [r for r in lines if r["split"] == "train"]
        out[precision] = {"steps": summary["steps"], "seconds": time.perf_counter() - t0, "val": summary["val"],
                          "final_train_loss": train_lines[-1]["metrics"]["loss"]}
    return out


# ----------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--ttt", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--bf16-batch", type=int, default=1, help="rows for the fp32-vs-bf16 comparison (bf16 is slow on AVX2 CPUs)")
    ap.add_argument("--bf16-seq", type=int, default=128, help="tokens per row for the fp32-vs-bf16 comparison")
    ap.add_argument("--variants", default="sdpa_concat", help=f"attention for the full step: {','.join(VARIANTS)}")
    ap.add_argument("--profile", action="store_true", help="torch.profiler split of one fp32 step")
    ap.add_argument("--attention", action="store_true", help="attention-only micro benchmark of the variants")
    ap.add_argument("--quality", action="store_true",
                    help="instead: fp32 vs bf16 autocast final metrics of the same small run (tiny target)")
    ap.add_argument("--quality-epochs", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "train_step.json")
    args = ap.parse_args()

    from rich.console import Console
    from rich.table import Table

    console = Console()
    if args.quality:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="specdraft-bench-quality-") as work:
            quality = precision_quality(Path(work), args.quality_epochs, samples=70, seq=64, hidden=64)
        t = Table(title="fp32 vs bf16 autocast, same run (tiny target, final validation)", title_justify="left")
        for col in ("precision", "steps", "seconds", "train loss", "val loss", "full_acc_0", "full_acc_2", "accept"):
            t.add_column(col, justify="right")
        for precision, q in quality.items():
            v = q["val"]
            t.add_row(precision, str(q["steps"]), f"{q['seconds']:.0f}", f"{q['final_train_loss']:.4f}",
                      f"{v['loss']:.4f}", f"{v['full_acc_0']:.3f}", f"{v.get('full_acc_2', float('nan')):.3f}",
                      f"{v['accept_len']:.3f}")
        console.print(t)
        path = args.out.with_name("train_precision.json")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(quality, indent=2) + "\n")
        console.print(f"-> {path}")
        return
    precisions = [p for p in args.precisions.split(",") if p]
    variants = [v for v in args.variants.split(",") if v]
    peak, peak_cpu = {}, {}
    peak["fp32"], peak_cpu["fp32"] = matmul_peak(torch.float32, 2048)
    if "bf16" in precisions:
        peak["bf16"], peak_cpu["bf16"] = matmul_peak(torch.bfloat16, 512)
    console.print("matmul peak here: " + ", ".join(f"{k} {peak[k] / 1e9:.1f} GFLOP/s wall, "
                                                   f"{peak_cpu[k] / 1e9:.1f} by CPU time" for k in peak))

    results = {"machine": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads(),
                           "torch": torch.__version__, "load_avg": os.getloadavg(),
                           "mkldnn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())},
               "shape": {**SMOLLM2, "batch": args.batch, "seq": args.seq, "ttt_steps": args.ttt},
               "peak_flops": peak, "peak_flops_cpu_time": peak_cpu, "runs": []}
    table = Table(title="training step (ttt_forward + backward + AdamW)", title_justify="left")
    for col in ("precision", "attention", "rows x T", "step s", "tokens/s", "tok/s (CPU time)", "GFLOP/step",
                "GFLOP/s", "% of peak"):
        table.add_column(col, justify="right")

    plan = [("fp32", v, args.batch, args.seq) for v in variants if "fp32" in precisions]
    if "bf16" in precisions:    # like for like, at a shape bf16 finishes in reasonable time here
        plan += [(p, "sdpa_concat", args.bf16_batch, args.bf16_seq) for p in ("fp32", "bf16")]
    for precision, variant, B, T in plan:
        use_attention(variant)
        drafter, teacher = make_drafter()
        batch = make_batch(B, T, drafter.config.hidden_size, drafter.config.vocab_size)
        params = [p for p in drafter.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=1e-4)
        step = step_fn(drafter, teacher, optimizer, batch, args.ttt, precision)
        flops = step_flops(step)
        times, cpu = time_step(step, args.repeats)
        med = statistics.median(times)
        # On a shared machine wall time counts the other processes too; CPU seconds / threads is
        # the step time this process would take with the cores to itself.
        cpu_med = statistics.median(cpu) / torch.get_num_threads()
        run = {"precision": precision, "attention": variant, "batch": B, "seq": T,
               "step_s": med, "step_s_all": times, "tokens_per_s": B * T / med,
               "flops_per_step": flops, "flops_per_token": flops / (B * T),
               "achieved_flops": flops / med, "share_of_peak": flops / med / peak[precision],
               "cpu_step_s": cpu_med, "tokens_per_s_cpu_time": B * T / cpu_med,
               "share_of_peak_cpu_time": flops / cpu_med / peak_cpu[precision],
               "load_avg_after": os.getloadavg()[0]}
        results["runs"].append(run)
        table.add_row(precision, variant, f"{B} x {T}", f"{med:.2f}", f"{run['tokens_per_s']:,.0f}",
                      f"{run['tokens_per_s_cpu_time']:,.0f}", f"{flops / 1e9:.1f}", f"{run['achieved_flops'] / 1e9:.1f}",
                      f"{100 * run['share_of_peak']:.0f}% ({100 * run['share_of_peak_cpu_time']:.0f}%)")
        console.print(f"{precision} {variant} {B}x{T}: {med:.2f} s/step, {run['tokens_per_s']:,.0f} tok/s")
        if args.profile and precision == "fp32" and (B, T) == (args.batch, args.seq):
            text, split = profile_step(step)
            results.setdefault("profile", {})[variant] = split
            console.print(f"[bold]profile, fp32, {variant}[/]\n{text}")
    use_attention("sdpa_concat")
    console.print(table)

    if args.attention:
        micro = attention_micro(args.batch, args.seq, args.ttt, args.repeats)
        results["attention_micro"] = micro
        t2 = Table(title=f"attention core only, {args.batch} x {args.seq}, {args.ttt} TTT steps, fwd+bwd",
                   title_justify="left")
        for col in ("variant", "seconds", "speed-up", "max |diff|"):
            t2.add_column(col, justify="right")
        base = micro["sdpa_concat"]["fwd_bwd_s"]
        for name, m in micro.items():
            t2.add_row(name, f"{m['fwd_bwd_s']:.3f}", f"{base / m['fwd_bwd_s']:.2f}x",
                       f"{m['max_abs_diff_vs_sdpa_concat']:.1e}")
        console.print(t2)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    console.print(f"-> {args.out}")


if __name__ == "__main__":
    main()
