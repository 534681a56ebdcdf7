"""`specdraft probe`: before an expensive fine-tune, check that it can work.

Three probes, each the early warning for one fact of the seed (K2 drafter -> K2.5):
  vocab    two draft-vocab mappings: overlap and positional matches (252/32000 = scrambled labels)
  hidden   two targets over the same tokens: per aux layer and `last`, mean/std shift, per-token
           cosine and linear CKA (the fc/midlayer were tuned to another target's hidden states)
  drafter  the drafter as it is on a target: per-step acceptance and simulated acceptance length
Each returns a dict with a one-line "verdict"; with a run folder the JSON is written to
RUN/probe-KIND.json and the verdict goes into RUN/journal.md.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdraft import journal, vocab
from specdraft.data.capture import capture_samples
from specdraft.data.prepared import load_prepared
from specdraft.defaults import DRAFT_LENGTH
from specdraft.errors import SpecdraftError
from specdraft.families import family_of
from specdraft.infer.methods import load_drafter_for
from specdraft.io import write_json
from specdraft.metrics import tau_text
from specdraft.progress import progress, track
from specdraft.targets import default_aux_layers, load_target
from specdraft.train.config import MAX_TTT_STEPS, RunConfig
from specdraft.train.objective import TeacherHead, add_sums, finalize_metrics
from specdraft.vocab import format_diff

# Hidden-state verdict thresholds (per-token cosine and linear CKA, worst aux layer).
# Why these: fc is linear and the midlayer sees hidden_norm(fc(aux)), so what the drafter learned
# survives if each token's aux vector points the same way (cosine) -- a minor revision of a model
# stays above ~0.95; 0.9 (~26 degrees) leaves room. CKA is invariant to rotations and isotropic
# scaling: high CKA with low cosine means the same information in another basis, which a re-fit of
# the linear fc can absorb. Below 0.5 on either, less than half of the geometry is shared and the
# drafter's features are a worse start than random (the seed's 38% vs 74.7%).
CLOSE = 0.9
FAR = 0.5


@dataclass
class LayerStats:
    layer: str              # "aux 2", "last"
    mean_shift: float       # ||mean_B - mean_A|| / sqrt(total variance of A)
    std_ratio: float        # sqrt(total variance of B / total variance of A)
    cosine: float           # mean over tokens of cos(a_t, b_t)
    cka: float              # linear CKA over tokens


def linear_cka(x: torch.Tensor, y: torch.Tensor) -> float:
    """Linear CKA of [n, d1] and [n, d2] (Kornblith et al. 2019), in the cheaper of the
    feature (d x d) or sample (n x n) forms; 1 for identical geometry up to rotation and scale."""
    x = (x - x.mean(0)).double()
    y = (y - y.mean(0)).double()
    if x.shape[0] < max(x.shape[1], y.shape[1]):
        kx, ky = x @ x.T, y @ y.T                                   # [n, n] Gram matrices
        hsic, nx, ny = (kx * ky).sum(), kx.norm(), ky.norm()
    else:
        hsic, nx, ny = (y.T @ x).norm() ** 2, (x.T @ x).norm(), (y.T @ y).norm()
    return float(hsic / (nx * ny)) if nx > 0 and ny > 0 else 0.0


def layer_stats(name: str, a: torch.Tensor, b: torch.Tensor) -> LayerStats:
    """Statistics of B's hidden states against A's at the same tokens, a/b [n, H]."""
    a, b = a.double(), b.double()
    var_a, var_b = a.var(0).sum(), b.var(0).sum()
    shift = (b.mean(0) - a.mean(0)).norm() / var_a.sqrt().clamp_min(1e-12)
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).mean()
    return LayerStats(name, float(shift), float((var_b / var_a.clamp_min(1e-12)).sqrt()), float(cos),
                      linear_cka(a, b))


def hidden_verdict(layers: list[LayerStats]) -> str:
    aux = [s for s in layers if s.layer.startswith("aux")] or layers
    cos, cka = min(s.cosine for s in aux), min(s.cka for s in aux)
    if cos >= CLOSE and cka >= CLOSE:
        return (f"close (aux cosine >= {cos:.2f}, CKA >= {cka:.2f}): a drafter made for A is a useful start "
                "for B; fine-tune it (remap lm_head if the mappings differ)")
    if cka >= CLOSE:
        return (f"same information in another basis (aux CKA >= {cka:.2f}, cosine only {cos:.2f}): re-fit fc "
                "first, then fine-tune, and watch it against a from-scratch baseline")
    if cos < FAR or cka < FAR:
        return (f"far (aux cosine {cos:.2f}, CKA {cka:.2f}): A's fc/midlayer are tuned to other hidden "
                "states; train from scratch for B")
    return (f"uncertain (aux cosine {cos:.2f}, CKA {cka:.2f}): fine-tune only with --baseline on a "
            "from-scratch run so a plateau is caught early")


# ----------------------------------------------------------------------------- probes

def probe_vocabs(a: str | Path, b: str | Path) -> dict:
    """Mapping A vs B: the numbers of `vocab diff` plus its verdict."""
    d = vocab.diff(vocab.load(a), vocab.load(b))
    return {"kind": "vocab", **d}


def load_samples(data: str | Path, samples: int, max_tokens: int) -> tuple[list[list[int]], list[list[int]]]:
    """The first `samples` prepared samples, cut to `max_tokens`: (input_ids, loss_mask) lists."""
    if samples < 1 or max_tokens < 2:
        raise SpecdraftError("--samples and --max-tokens must be positive (max-tokens >= 2)")
    ds, _ = load_prepared(data)
    rows = ds.select(range(min(samples, len(ds))))
    return ([list(r)[:max_tokens] for r in rows["input_ids"]], [list(m)[:max_tokens] for m in rows["loss_mask"]])


def target_hidden(target, samples: list[list[int]], layer_ids: list[int],
                  label: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """aux [N, n_aux, H] and last [N, H] (fp32) with capture's exact semantics (its hooks); progress
    over tokens is shown under `label` when given."""
    with progress(label or "", sum(map(len, samples)), 0, "tokens", enabled=label is not None) as tracker:
        aux, last, _ = capture_samples(target.model, samples, layer_ids, torch.float32, 4096,
                                       on_batch=lambda n: tracker.advance(n, tokens=n))
    return aux, last


def probe_hidden(model_a: str, model_b: str, data: str | Path, samples: int = 32, max_tokens: int = 512,
                 max_positions: int = 8192, trust_remote_code: bool = False) -> dict:
    """Run both targets over the same prepared tokens and compare their hidden states layer by layer."""
    ids, masks = load_samples(data, samples, max_tokens)
    target_a = load_target(model_a, trust_remote_code=trust_remote_code)
    target_b = load_target(model_b, trust_remote_code=trust_remote_code)
    if target_a.hidden_size != target_b.hidden_size:
        return {"kind": "hidden", "a": target_a.name, "b": target_b.name, "layers": [],
                "verdict": f"incompatible: hidden sizes differ ({target_a.hidden_size} vs "
                           f"{target_b.hidden_size}); a drafter for A cannot run on B, train from scratch"}
    top = max(max(s) for s in ids)
    if top >= min(target_a.vocab_size, target_b.vocab_size):
        raise SpecdraftError(f"{data}: token id {top} is outside one target's vocabulary; the probe needs "
                             "targets that share a tokenizer")
    layers_a, layers_b = default_aux_layers(target_a.num_layers), default_aux_layers(target_b.num_layers)
    name_a = target_a.name
    aux_a, last_a = target_hidden(target_a, ids, layers_a, f"probe: {name_a}")
    del target_a   # one target in memory at a time
    aux_b, last_b = target_hidden(target_b, ids, layers_b, f"probe: {target_b.name}")
    mask = torch.tensor([m for row in masks for m in row], dtype=torch.bool)        # [N]
    keep = mask.nonzero().flatten() if mask.any() else torch.arange(mask.numel())
    if keep.numel() > max_positions:   # a fixed, spread-out subset keeps CKA cheap
        keep = keep[torch.linspace(0, keep.numel() - 1, max_positions).long()]
    stats = [layer_stats(f"aux {la}" + (f"/{lb}" if la != lb else ""), aux_a[keep, k], aux_b[keep, k])
             for k, (la, lb) in enumerate(zip(layers_a, layers_b))]
    stats.append(layer_stats("last", last_a[keep], last_b[keep]))
    return {"kind": "hidden", "a": name_a, "b": target_b.name,
            "samples": len(ids), "positions": int(keep.numel()), "layer_ids": {"a": layers_a, "b": layers_b},
            "layers": [asdict(s) for s in stats], "thresholds": {"close": CLOSE, "far": FAR},
            "verdict": hidden_verdict(stats)}


def sample_batch(input_ids, aux, last, loss_mask) -> dict[str, torch.Tensor]:
    """One sample as a batch of one row in the train contract's layout."""
    T = len(input_ids)
    return {"input_ids": torch.as_tensor(input_ids, dtype=torch.long)[None], "aux": aux[None],   # aux [1,T,3,H]
            "last": last[None], "loss_mask": torch.as_tensor(loss_mask)[None],                    # last [1,T,H]
            "doc_ids": torch.zeros(1, T, dtype=torch.long), "position_ids": torch.arange(T)[None]}


def drafter_metrics(net, target_model, batches, steps: int) -> dict[str, float]:
    """The metrics of `net` (as it is, no training) summed over `batches`, from its family's own training
    forward in eval mode (Family.objective: a TTT unroll, mask slots, blocks)."""
    return drafter_metrics_by_context(net, target_model, batches, steps, None)[0]


def context_masks(batch: dict, edges) -> list[tuple[int, "torch.Tensor | None", int]]:
    """(bucket index, loss-mask factor, trained positions) of each context bucket the batch's trained
    positions fall in; a position's context is its position in its sample (position_ids: the tokens
    before it). The factor is None when every trained position is in that one bucket."""
    trained = batch["loss_mask"].bool() & (batch["doc_ids"] >= 0)
    index = torch.bucketize(batch["position_ids"], torch.tensor(list(edges)), right=True)   # [B,T]
    present = index[trained].unique().tolist()
    if len(present) == 1:
        return [(present[0], None, int(trained.sum()))]
    return [(i, (index == i).to(batch["loss_mask"].dtype), int((trained & (index == i)).sum())) for i in present]


def part_masks(batch: dict, chat) -> list[tuple[str, "torch.Tensor | None", int]]:
    """(part, loss-mask factor, trained positions) of a thinking template's parts in the batch: each trained
    span (an answer) split where its reasoning ends (render.Chat.reasoning_length, with the sample's tokens
    before the span as its prompt) into "reasoning" and "answer". The factor is None when every trained
    position is in one part."""
    trained = batch["loss_mask"].bool() & (batch["doc_ids"] >= 0)
    label = torch.full_like(batch["input_ids"], -1)
    for r in range(label.shape[0]):
        row, mask, pos = batch["input_ids"][r].tolist(), trained[r].tolist(), batch["position_ids"][r].tolist()
        sample_start, j = 0, 0
        while j < len(row):
            if pos[j] == 0:
                sample_start = j
            if not mask[j]:
                j += 1
                continue
            end = j + 1
            while end < len(row) and mask[end] and pos[end] != 0:
                end += 1
            cut = chat.reasoning_length(row[sample_start:j], row[j:end])
            label[r, j:j + cut], label[r, j + cut:end] = 0, 1
            j = end
    names = ("reasoning", "answer")
    present = [int(i) for i in label[trained].unique().tolist()]
    if len(present) == 1:
        return [(names[present[0]], None, int(trained.sum()))]
    return [(names[i], (label == i).to(batch["loss_mask"].dtype), int((label == i).sum())) for i in present]


def drafter_metrics_by_group(net, target_model, batches, steps: int, groups
                             ) -> tuple[dict[str, float], dict[object, tuple[dict[str, float], int]]]:
    """drafter_metrics, and the same metrics per group of trained positions: `groups(batch)` gives (key,
    loss-mask factor or None for all of them, trained positions) for each group the batch's positions fall
    in (context_masks, part_masks); each group measured by the objective with the loss mask cut to it
    (once more per batch only where a batch spans groups). Returns {key: (metrics, trained positions)}."""
    if not 1 <= steps <= MAX_TTT_STEPS:
        raise SpecdraftError(f"--num-speculative-tokens {steps}: must be in 1..{MAX_TTT_STEPS}")
    limit = family_of(net).max_draft(net.config)
    if limit is not None and steps > limit:    # Family.max_draft: a block's draft slots
        raise SpecdraftError(f"-k {steps}: this {family_of(net).model_type} drafter was trained to draft {limit} "
                             f"tokens per round; measure with -k {limit} or less")
    teacher = TeacherHead.from_target(target_model, net.d2t)
    objective = family_of(net).objective(net, teacher, RunConfig(ttt_steps=steps)).eval()
    sums, grouped, positions = None, {}, {}
    with torch.no_grad():
        for batch in batches:
            _, part = objective(batch)
            sums = add_sums(sums, part)
            for key, factor, n in groups(batch):
                own = part if factor is None else objective({**batch, "loss_mask": batch["loss_mask"] * factor})[1]
                grouped[key], positions[key] = add_sums(grouped.get(key), own), positions.get(key, 0) + n
    if sums is None:
        raise SpecdraftError("no samples to measure acceptance on")
    return finalize_metrics(sums), {key: (finalize_metrics(v), positions[key]) for key, v in grouped.items()}


def drafter_metrics_by_context(net, target_model, batches, steps: int, edges
                               ) -> tuple[dict[str, float], list[tuple[dict[str, float], int] | None]]:
    """drafter_metrics, and with `edges` the same metrics per context bucket (metrics.context_buckets):
    [(metrics, trained positions) or None where no position fell]."""
    metrics, grouped = drafter_metrics_by_group(net, target_model, batches, steps,
                                                lambda b: context_masks(b, edges) if edges is not None else [])
    return metrics, [grouped.get(i) for i in range(len(edges) + 1)] if edges is not None else []


def probe_drafter(drafter: str | Path, model: str, data: str | Path, samples: int = 32, max_tokens: int = 512,
                  steps: int = DRAFT_LENGTH, trust_remote_code: bool = False) -> dict:
    """The drafter as it is on `model`: TTT metrics on hidden states computed on the fly (the seed's
    K2 drafter on K2.5 gave an acceptance length of ~1.5 here, vs 3.2-3.5 on its own target)."""
    ids, masks = load_samples(data, samples, max_tokens)
    target = load_target(model, trust_remote_code=trust_remote_code)
    net = load_drafter_for(drafter, target)                 # on the CPU in fp32
    layer_ids = list(net.config.aux_layer_ids)

    def batches():
        for row, mask in zip(ids, masks):
            aux, last = target_hidden(target, [row], layer_ids)
            yield sample_batch(row, aux, last, mask)

    shown = track(batches(), "probe", len(ids), "samples", tokens=lambda b: int(b["loss_mask"].numel()))
    metrics = drafter_metrics(net, target.model, shown, steps)
    accept = metrics["accept_len"]
    verdict = (f"simulated {tau_text(accept, steps, str(data), len(ids))}: "
               + ("the drafter already helps on this target" if accept >= 2.0 else
                  "weak start (the seed's K2 drafter on K2.5 gave ~1.5); probe the hidden states before "
                  "fine-tuning and keep a from-scratch baseline"))
    return {"kind": "drafter", "drafter": str(drafter), "model": target.name, "samples": len(ids),
            "steps": steps, "aux_layer_ids": layer_ids, "metrics": metrics, "verdict": verdict}


# ----------------------------------------------------------------------------- dispatch, output

def run(vocabs: list, models: list, data, drafter, samples: int = 32, max_tokens: int = 512, steps: int = DRAFT_LENGTH,
        run: str | Path | None = None, out: str | Path | None = None, trust_remote_code: bool = False) -> list[dict]:
    """What `specdraft probe` does: every probe whose inputs were given, saved and journaled."""
    results = []
    if vocabs:
        if len(vocabs) != 2:
            raise SpecdraftError(f"--vocab: pass exactly two mappings (A then B), got {len(vocabs)}")
        results.append(probe_vocabs(*vocabs))
    if drafter is not None:
        if data is None:
            raise SpecdraftError("probe --drafter: --prepared WS/data is required")
        results.append(probe_drafter(drafter, models[0] if models else "default", data, samples, max_tokens,
                                     steps, trust_remote_code))
    elif models:
        if len(models) != 2 or data is None:
            raise SpecdraftError("probe --model A --model B --prepared WS/data: two targets and prepared data needed")
        results.append(probe_hidden(models[0], models[1], data, samples, max_tokens,
                                    trust_remote_code=trust_remote_code))
    if not results:
        raise SpecdraftError("probe: pass --vocab A --vocab B, --model A --model B --prepared WS/data, "
                             "or --drafter D --model M --prepared WS/data")
    save(results, run, out)
    return results


def save(results: list[dict], run: str | Path | None, out: str | Path | None) -> None:
    if out is not None:
        write_json(out, results[0] if len(results) == 1 else results)
    if run is None:
        return
    for r in results:
        write_json(Path(run) / f"probe-{r['kind']}.json", r)
        journal.record(run, "probe", f"{r['kind']} probe: {r['verdict']}", source="probe")


def format_result(r: dict) -> str:
    if r["kind"] == "vocab":
        return format_diff(r)
    if r["kind"] == "hidden":
        lines = [f"A: {r['a']}", f"B: {r['b']}"]
        if r["layers"]:
            lines.append(f"{r['samples']} samples, {r['positions']} positions (loss-masked)")
            lines.append(f"{'layer':10s} {'cosine':>7s} {'CKA':>6s} {'mean shift':>11s} {'std ratio':>10s}")
            lines += [f"{s['layer']:10s} {s['cosine']:7.3f} {s['cka']:6.3f} {s['mean_shift']:11.3f} "
                      f"{s['std_ratio']:10.3f}" for s in r["layers"]]
        lines.append(f"verdict: {r['verdict']}")
        return "\n".join(lines)
    m = r["metrics"]
    ks = sorted(int(k.rsplit("_", 1)[1]) for k in m if k.startswith("cond_acc_"))
    lines = [f"drafter {r['drafter']} on {r['model']} ({r['samples']} samples)"]
    lines += [f"step {k}: full_acc {m.get(f'full_acc_{k}', float('nan')):.3f}  "
              f"cond_acc {m[f'cond_acc_{k}']:.3f}" for k in ks]
    lines.append(f"verdict: {r['verdict']}")
    return "\n".join(lines)
