"""`specdraft doctor RUN`: why is the acceptance low? Measured causes, ranked by the τ they cost.

Every check is one small function `check_ID(d) -> Finding` that measures one cause on the run's own
files (config.yaml, metrics.jsonl, the checkpoint, the store and its prepared data, the exports' export.json,
plan.json) and, where the doctor can, on the drafter itself: simulated τ on the run's held-out store
samples (train.objective's metrics, as `eval`), or on hidden states the target computes on the fly
(as `probe`). A finding that holds names its evidence (numbers), the τ it is estimated to cost
(`estimated_tau_loss`, None where no number can be measured), and the fix as a command. The causes
that hold come first, largest estimated loss first (those without an estimate after them); the
ones checked and fine are listed too, and those that could not be checked say why.
"""

from __future__ import annotations

import json
import typing
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch

from specdraft import run_layout, vocab
from specdraft.adapter import architecture
from specdraft.analysis.evaluate import chain_accept_lengths
from specdraft.analysis.measured import measured_line
from specdraft.analysis.plan import store_sample_batch
from specdraft.analysis.probe import drafter_metrics, sample_batch, target_hidden
from specdraft.data.prepared import load_prepared, prepared_meta_of
from specdraft.data.regenerate import padded_generate
from specdraft.data.render import Chat, end_of_turn_ids
from specdraft.templates import template_sha256
from specdraft.data.store_parts import open_stores
from specdraft.errors import SpecdraftError
from specdraft.families import family, family_of
from specdraft.formats.checkpoints import load_checkpoint, resolve_checkpoint
from specdraft.infer.prompts import PROMPT_SETS, prompt_ids, read_prompts
from specdraft.infer.costmodel import best_option, chain_options
from specdraft.io import read_json, write_json
from specdraft.metrics import bucket_text, drafter_method, load_run, measured_buckets, tau_text
from specdraft.progress import progress
from specdraft.targets import final_norm, load_target, same_target
from specdraft.train.batches import split_samples
from specdraft.train.config import MAX_TTT_STEPS, RunConfig, check_type, load_yaml
from specdraft.vocab import check_mapping
from specdraft.watch import BaselineWatch, WatchConfig
from specdraft.weights import read_weights
from specdraft.schemas.exports import exports_of
from specdraft.schemas.plan import PlanFile, read_plan
from specdraft.schemas.drafter import read_drafter_config

REPORT_FILE = run_layout.DOCTOR   # RUN/doctor.json: the last diagnosis (the report shows it)

# Thresholds, each with why.
COVERAGE_MAX_MISSING = 0.05   # a token the draft vocab lacks ends the chain there: 5% off every position compounds over K
COVERAGE_TARGET = 0.99        # the draft vocab size suggested as the fix covers 99% of the target's own tokens
TAU_GAP = 0.25                # τ differences below a quarter token are within the noise of a few dozen samples
UNDERTRAINED_GAIN = 0.05      # τ still gained over the last quarter of training: more tokens would pay
UNDERTRAINED_HORIZON = 3      # its loss: three more quarters, each gaining the last one's gain times the slowing ratio
OVERFIT_GAP = 0.15            # train acc_0 above val acc_0 by this much: the drafter memorised its samples
VAL_LOSS_RISE = 0.05          # val loss_0 this far (relative) above its minimum at the end: training past the best
VAL_STILL_RISING = 0.01       # the last val acc_0 above every earlier one by this much: more epochs still pay
DEPTH_DROP = 0.15             # acceptance at untrained draft positions this far below trained ones: more TTT steps
CONTEXT_DECAY = 0.10          # τ at the longest context bucket this far (relative) below the shortest: the drafter
                              # does not hold at long context (issue 38's goal: within 10%), and at least TAU_GAP
LONG_ROWS = 8192              # the row length the context_decay fix trains with (SmolLM2's context)
ROUND_COST_MARGIN = 0.10      # the chosen K's predicted tokens/s this far below the best K's: choose another K
HELD_OUT_SAMPLES = 32         # samples per τ measurement: seconds on CPU, enough for a quarter-token resolution
COVERAGE_TOKENS = 8192        # target next tokens whose coverage is counted
PROMPT_TOKENS = 48            # tokens the target generates per --prompts prompt (the measured continuation)
# Drafter config fields specdraft keeps only in its own block of config.json: no serving engine reads
# them (the target's layer count, its name), so they are not compared with the top-level fields
BLOCK_ONLY_FIELDS = ("target_num_layers", "verifier")
# Served-config differences whose τ cost the doctor can measure on the store (the rest: unknown)
MEASURABLE_FIELDS = {"d2t", "aux_layer_ids", "norm_before_residual", "fc_norm", "norm_output"}
# Causes that make every draft wrong whatever τ they are estimated to cost: they lead the ranking (a
# scrambled d2t, loss not estimable, once came second under an export fix that would have shipped it)
LEADING = ("vocab_mapping",)


@dataclass
class Finding:
    id: str
    holds: bool
    evidence: dict
    estimated_tau_loss: float | None = None
    fix: str = ""
    summary: str = ""              # one line: what was found


@dataclass
class Skipped:
    id: str
    why: str


# ----------------------------------------------------------------------------- what the doctor reads

@dataclass
class Doctor:
    """The run and everything it points to, each loaded once, on first use."""
    run: Path
    model: str | None = None
    store_path: str | None = None
    prompts: str | None = None

    @cached_property
    def config(self) -> dict:
        """RUN/config.yaml, every known setting of RunConfig's type (a wrong one is one line)."""
        path = run_layout.config_file(self.run)
        data = load_yaml(path) if path.is_file() else {}
        hints = typing.get_type_hints(RunConfig)
        return {k: check_type(k, v, hints[k], str(path)) if k in hints else v for k, v in data.items()}

    @cached_property
    def metrics(self):
        path = run_layout.metrics_file(self.run)
        return load_run(path) if path.is_file() else None

    @cached_property
    def checkpoint(self) -> Path:
        return resolve_checkpoint(self.run)

    @cached_property
    def exports(self) -> list:
        """The run's exports (their export.json records, found beside the run), latest last."""
        return exports_of(self.run)

    @cached_property
    def target(self):
        return load_target(self.model or self.config.get("model", "default"),
                           trust_remote_code=bool(self.config.get("trust_remote_code")))

    @cached_property
    def store_paths(self) -> list[str]:
        """The store the run trained on: --store, else config.yaml's (one, or the parts of a run over
        several --store)."""
        paths = self.store_path or self.config.get("store")
        return [str(p) for p in (paths if isinstance(paths, list) else [paths] if paths else [])]

    @cached_property
    def store(self):
        missing = [p for p in self.store_paths if not Path(p).exists()] or ([] if self.store_paths else [None])
        if missing:
            raise SpecdraftError(f"doctor {self.run}: the store {missing[0] or '(none in config.yaml)'} is not "
                                 "there; pass --store WS/hidden (the store the run trained on)")
        store = open_stores(self.store_paths)
        recorded = str(store.target.get("fingerprint", ""))
        if recorded and not same_target(recorded, self.target.identity):
            raise SpecdraftError(f"doctor {self.run}: store {', '.join(self.store_paths)} was captured from "
                                 f"{store.target.get('id')} ({recorded}) but the target {self.target.name} is "
                                 f"{self.target.identity['fingerprint']}; pass --model the store's target, or "
                                 "--store a store of this target")
        return store

    @property
    def store_flags(self) -> str:
        """--store as train takes it (every part of a run over several)."""
        return " ".join(f"--store {p}" for p in self.store_paths)

    @cached_property
    def ttt_steps(self) -> int:
        return int(self.config.get("ttt_steps", 3))

    @cached_property
    def draft_limit(self) -> int | None:
        """The longest draft the drafter's family serves it for (its max_draft: a block's draft slots),
        None for no limit."""
        return family_of(self.drafter).max_draft(self.drafter.config)

    @cached_property
    def trained_positions(self) -> int:
        """Draft positions the run trained: its TTT steps, or the family's limit where it has one."""
        return self.draft_limit if self.draft_limit is not None else self.ttt_steps

    @cached_property
    def steps(self) -> int:
        """Draft positions measured: the trained ones and two more (where too few TTT steps show); a
        family with a limit drafts no further, so only its trained positions."""
        extra = 0 if self.draft_limit is not None else 2
        return min(MAX_TTT_STEPS, self.trained_positions + extra)

    @cached_property
    def held_out(self) -> list[int]:
        """The run's validation samples of the store (its own split), at most HELD_OUT_SAMPLES."""
        _, val = split_samples(len(self.store), float(self.config.get("val_fraction", 0.05)),
                               int(self.config.get("seed", 0)))
        return (val or list(range(len(self.store))))[:HELD_OUT_SAMPLES]

    @cached_property
    def drafter(self):
        """The checkpoint as served, built without the mapping check (a broken d2t is a finding here)."""
        return drafter_unchecked(self.checkpoint, self.target)

    @cached_property
    def measured(self) -> dict:
        """The drafter's TTT metrics on the held-out store samples, with the layers it trained on."""
        return self.metrics_of(self.drafter)

    @cached_property
    def tau(self) -> float:
        return tau_of(self.measured, self.steps)

    def metrics_of(self, net, layer_ids: list[int] | None = None) -> dict:
        """TTT metrics of `net` on the held-out samples: the stored aux states, or (other `layer_ids`)
        the target's states at those layers, computed now."""
        rows = [self.store[i] for i in self.held_out]
        if layer_ids is None or list(layer_ids) == list(self.store.layer_ids):
            batches = [store_sample_batch(r) for r in rows]   # a compact store has no `last`
            return drafter_metrics(net, self.target.model, batches, self.steps)
        return self.metrics_on_tokens(net, [r["input_ids"].tolist() for r in rows],
                                      [r["loss_mask"].tolist() for r in rows], layer_ids)

    def metrics_on_tokens(self, net, ids: list[list[int]], masks: list[list[int]], layer_ids=None) -> dict:
        layer_ids = list(layer_ids or net.config.aux_layer_ids)
        batches = (sample_batch(row, *target_hidden(self.target, [row], layer_ids), mask)
                   for row, mask in zip(ids, masks))
        return drafter_metrics(net, self.target.model, batches, self.steps)


def tau_of(metrics: dict, steps: int) -> float:
    """Simulated τ of a chain of `steps` drafts from TTT metrics."""
    return chain_accept_lengths(rates_of(metrics, steps))[-1]


def rates_of(metrics: dict, steps: int) -> list[float]:
    return [float(metrics[f"cond_acc_{k}"]) for k in range(steps)]


def served_config(config: dict, where: str):
    """The drafter config a serving engine builds from a speculators config.json: the top-level fields
    only (vLLM never reads specdraft's own "specdraft" block), parsed by the family's own reader, so
    each family's names (eagle_aux_hidden_state_layer_ids, aux_hidden_state_layer_ids, ...) apply."""
    top = {k: v for k, v in config.items() if k != "specdraft"}
    return family(config["speculators_model_type"]).parse_config(top, where)


def served_differences(trained, served) -> dict:
    """{field: [as trained, as served]} for every config field a serving engine reads."""
    ours, theirs = asdict(trained), asdict(served)
    return {f: [ours[f], theirs.get(f)] for f in ours
            if f not in BLOCK_ONLY_FIELDS and ours[f] != theirs.get(f)}


def drafter_unchecked(folder: Path, target, d2t: torch.Tensor | None = None, as_served: bool = False):
    """The drafter in `folder`: a speculators config.json and its tensors, with the d2t/t2d it ships
    (or `d2t`) even where they break the convention. Its config is the one it trained with (the
    "specdraft" block where there is one) or, `as_served`, the top-level fields a serving engine
    reads. Other layouts load through the checked loader."""
    config = read_drafter_config(folder)
    if "speculators_model_type" not in config:
        tensors, cfg, _ = load_checkpoint(folder)
    else:
        read = served_config if as_served else family(config["speculators_model_type"]).parse_config
        cfg = read(config, str(folder))
        tensors = read_weights(folder)
    if d2t is not None:
        tensors["d2t"] = d2t
        tensors["t2d"] = vocab.t2d_from_d2t(d2t, cfg.vocab_size)
    if "embed_tokens.weight" not in tensors:
        tensors["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().float()
    if "d2t" in tensors:             # a family may ship none (a draft vocab that is the target's)
        tensors["d2t"] = tensors["d2t"].long()
    if "t2d" in tensors:
        tensors["t2d"] = tensors["t2d"].bool()
    net = family_of(cfg).build(cfg)
    net.load_state_dict(tensors, strict=False)
    return net.float().eval()


def mapping_of(folder: Path) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(d2t, t2d or None) as stored in a checkpoint folder's weights; no d2t is the identity (offsets
    of zero over the lm_head's rows)."""
    tensors = read_weights(folder)
    d2t = tensors["d2t"].long() if "d2t" in tensors else torch.zeros(tensors["lm_head.weight"].shape[0], dtype=torch.long)
    return d2t, (tensors["t2d"].bool() if "t2d" in tensors else None)


def mapping_problem(d2t: torch.Tensor, t2d: torch.Tensor | None, where: str, vocab_size: int) -> str | None:
    try:
        check_mapping(d2t, t2d, where, vocab_size)
    except SpecdraftError as e:
        return str(e)
    return None


def fmt(x: float) -> float:
    return round(float(x), 4)


def stored_samples(d: Doctor, missing: int = 250) -> int:
    """How many samples the run's store holds (`missing` when the store is not there)."""
    try:
        return len(d.store)
    except SpecdraftError:
        return missing


def command_model(d: Doctor) -> str:
    return d.model or d.config.get("model", "default")


# ----------------------------------------------------------------------------- the causes, one function each

def check_vocab_coverage(d: Doctor) -> Finding:
    """The share of the target's own next tokens (argmax of its head over the store's `last` states,
    on loss-masked positions) that the draft vocab cannot propose: each is a rejected draft."""
    t2d = d.drafter.t2d.bool()
    norm_w, eps = final_norm(d.target.model)
    head = d.target.model.get_output_embeddings().weight.float()                      # [V, H]
    tokens = []
    for i in range(len(d.store)):
        s = d.store[i]
        if "last" not in s:                     # a compact store: its teacher top-k, best first
            tokens.append(s["teacher_ids"][s["loss_mask"].bool()][:, 0].long())
        else:
            last = s["last"].float()[s["loss_mask"].bool()]                               # [n, H]
            normed = last * torch.rsqrt(last.pow(2).mean(-1, keepdim=True) + eps) * norm_w.float()
            tokens.append((normed @ head.T).argmax(-1))                                   # [n]
        if sum(map(len, tokens)) >= COVERAGE_TOKENS:
            break
    own = torch.cat(tokens)[:COVERAGE_TOKENS]
    missing = float((~t2d[own]).float().mean()) if own.numel() else 0.0
    counts = torch.bincount(own, minlength=t2d.numel()).sort(descending=True).values
    needed = int((counts.cumsum(0) < COVERAGE_TARGET * own.numel()).sum()) + 1
    evidence = {"target_tokens_measured": int(own.numel()), "missing_share": fmt(missing),
                "draft_vocab_size": int(t2d.sum()), "size_for_99pct": needed, "threshold": COVERAGE_MAX_MISSING}
    holds = missing > COVERAGE_MAX_MISSING
    loss = None
    if holds:   # with every token proposable, each position's acceptance scales by 1 / coverage
        rates = rates_of(d.measured, d.steps)
        covered = [min(a / max(1 - missing, 1e-6), 1.0) for a in rates]
        loss = chain_accept_lengths(covered)[-1] - d.tau
    data = (d.store.manifest.get("data") or {}).get("path", "WS/data")
    return Finding("vocab_coverage", holds, evidence, loss,
                   f"specdraft vocab build --prepared {data} --size {max(needed, int(t2d.sum()))} --out "
                   f"WS/vocab.safetensors, then retrain with --vocab WS/vocab.safetensors",
                   f"{missing:.1%} of the target's own next tokens are outside the {int(t2d.sum())}-token draft vocab")


def check_vocab_mapping(d: Doctor) -> Finding:
    """d2t/t2d against the convention (offsets, ascending target ids), the vocab the run trained with
    (positional matches) and the target's tokenizer; the loss is τ as shipped vs with the run's vocab."""
    d2t, t2d = mapping_of(d.checkpoint)
    problem = mapping_problem(d2t, t2d, str(d.checkpoint), d.target.vocab_size)
    evidence: dict = {"convention": problem or "ok", "draft_vocab_size": int(d2t.numel())}
    trained = None
    vocab_path = d.config.get("vocab")
    if vocab_path and Path(vocab_path).is_file():
        trained = vocab.load(vocab_path)
        shipped = vocab.Vocab(d2t, t2d if t2d is not None else vocab.t2d_from_d2t(d2t, trained.target_vocab_size))
        diff = vocab.diff(trained, shipped)
        evidence["positional_matches"] = f"{diff['positional_matches']['count']}/{diff['positional_matches']['of']}"
        tokenizer = trained.meta.get("tokenizer")
        if tokenizer:
            evidence["tokenizer_matches_target"] = tokenizer == vocab.tokenizer_fingerprint(d.target.tokenizer)
    matches = evidence.get("positional_matches", "1/1").split("/")
    holds = bool(problem) or matches[0] != matches[1] or evidence.get("tokenizer_matches_target") is False
    loss = None
    if holds and trained is not None and trained.draft_vocab_size == d2t.numel():
        fixed = drafter_unchecked(d.checkpoint, d.target, d2t=trained.d2t)
        loss = tau_of(d.metrics_of(fixed), d.steps) - d.tau
        evidence["tau_with_run_vocab"] = fmt(loss + d.tau)
    return Finding("vocab_mapping", holds, evidence, loss,
                   f"specdraft vocab diff {vocab_path or 'WS/vocab.safetensors'} {d.checkpoint} (see which rows "
                   f"moved), then re-save the drafter with the run's d2t/t2d: specdraft train --out RUN-fixed "
                   f"--from-pretrained {d.checkpoint} --vocab {vocab_path or 'WS/vocab.safetensors'} --remap",
                   problem or f"the shipped d2t matches the run's vocab at {evidence.get('positional_matches')} "
                                "draft positions")


def check_aux_layers(d: Doctor) -> Finding:
    """The layers the checkpoint's config names (what vLLM taps) against the layers the store holds
    (what the run trained on) and the target's range; the loss is τ fed the named layers."""
    served = list(d.drafter.config.aux_layer_ids)
    trained = list(d.store.layer_ids)
    L = d.target.num_layers
    evidence = {"checkpoint_config": served, "store": trained, "target_layers": L}
    outside = [i for i in served if not 0 < i < L]
    holds = served != trained or bool(outside)
    loss = None
    if holds and not outside and len(served) == len(trained):
        loss = d.tau - tau_of(d.metrics_of(d.drafter, served), d.steps)
        evidence["tau_with_checkpoint_layers"] = fmt(d.tau - loss)
    layers = ",".join(map(str, served))
    key = aux_ids_key(read_drafter_config(d.checkpoint), str(d.checkpoint))
    return Finding("aux_layers", holds, evidence, loss,
                   f"set {key} to {trained} in {d.checkpoint}/config.json (the layers it trained on); or capture "
                   f"those it names and retrain: specdraft capture --model {command_model(d)} --prepared WS/data "
                   f"--layers {layers} --out WS/hidden-{layers.replace(',', '-')}",
                   f"the checkpoint names aux layers {served}, the run trained on {trained}")


def aux_ids_key(config: dict, where: str) -> str:
    """The top-level config.json field the serving engine reads the aux layer ids from, as the family's
    own parse_config says: the list of ints whose change changes the served aux_layer_ids."""
    if "speculators_model_type" in config:
        served = served_config(config, where).aux_layer_ids
        for name, value in config.items():
            if name == "specdraft" or not (isinstance(value, list) and value and all(type(v) is int for v in value)):
                continue
            try:
                moved = served_config({**config, name: [v + 1 for v in value]}, where).aux_layer_ids
            except SpecdraftError:
                continue
            if moved != served:
                return name
    return "the aux layer ids"


def check_template(d: Doctor) -> Finding:
    """The prompt part of each held-out sample (everything before its first assistant token) against
    the same messages rendered now with the target's chat template (a system prompt, a thinking
    flag) and the data's template arguments, plus the template hashes; the loss is τ on the store
    minus τ on those samples with the target's prompt rendering and the same answers."""
    data = (d.store.manifest.get("data") or {}).get("path")
    if not data or not Path(data).is_dir():
        return Finding("template", False, {"skipped": f"prepared data {data} not found"})
    ds, meta = load_prepared(data)
    tok = d.target.tokenizer
    evidence = {"data_template": str(meta.get("chat_template_sha256"))[:12],
                "target_template": template_sha256(tok)[:12]}
    kwargs = meta.get("chat_template_kwargs") if isinstance(meta.get("chat_template_kwargs"), dict) else {}
    chat = Chat(tok, [], kwargs)
    ids, masks, changed = [], [], 0
    for row in (ds.select(d.held_out) if "messages" in ds.column_names else []):
        messages = json.loads(row["messages"]) if isinstance(row["messages"], str) else row["messages"]
        first = row.get("turn") or next((i for i, m in enumerate(messages or []) if m.get("role") == "assistant"
                                         and i > 0), None)      # data of before the `turn` column: the first answer
        start = next((j for j, m in enumerate(row["loss_mask"]) if m), None)
        if first is None or start is None:
            continue
        prompt = chat.prompt_ids(messages[:first])
        changed += prompt != list(row["input_ids"][:start])
        ids.append(prompt + list(row["input_ids"][start:]))
        masks.append([0] * len(prompt) + list(row["loss_mask"][start:]))
    evidence["samples_rerendered"], evidence["prompts_changed"] = len(ids), changed
    holds = evidence["data_template"] != evidence["target_template"] or changed > 0
    loss = None
    if holds and ids:
        loss = d.tau - tau_of(d.metrics_on_tokens(d.drafter, ids, masks), d.steps)
        evidence["tau_with_target_template"] = fmt(d.tau - loss)
    return Finding("template", holds, evidence, loss,
                   f"specdraft prepare --model {command_model(d)} --conversations SOURCE --regenerate --out "
                   f"WS/data-{evidence['target_template'][:8]} (render with the template the target serves with), "
                   "then capture and retrain",
                   f"{changed} of {len(ids)} prompts render differently with the target's chat template "
                   f"(template {evidence['data_template'][:8]} in the data, {evidence['target_template'][:8]} served)")


def bench_modes(run: Path) -> list[tuple[str, str, dict, float | None, str | None]]:
    """(file, thinking mode, template arguments, the drafter chain's τ, its prompt set) of each bench*.json in
    the run that records its mode (bench --chat-template-kwargs)."""
    found = []
    for path in sorted(run.glob("bench*.json")):
        data = read_json(path, "bench result")
        config = data.get("config") if isinstance(data, dict) and isinstance(data.get("config"), dict) else {}
        mode = (config.get("thinking") or {}).get("mode") if isinstance(config.get("thinking"), dict) else None
        if isinstance(mode, str):
            tau = drafter_method(data)[1].get("accept_len")
            found.append((path.name, mode, config.get("chat_template_kwargs") or {},
                          tau if isinstance(tau, (int, float)) else None, config.get("prompts")))
    return found


def check_thinking_mode(d: Doctor) -> Finding:
    """The thinking mode and template arguments the drafter was trained with (prepare.json) against those
    each bench of the run ran with: a drafter trained on reasoning drafts reasoning, one trained without it
    drafts answers, and a reasoning effort or a template argument changes what the target writes. Where the
    run holds benches in both settings on one prompt set, the loss is τ in the training setting minus τ in the
    other there, and the cause holds only beyond TAU_GAP; with no such pair it holds, loss unknown."""
    meta = prepared_meta_of(d.store.manifest)
    trained = (meta.get("thinking") or {}).get("mode")
    benches = bench_modes(d.run)
    if trained is None or not benches:
        return Finding("thinking_mode", False, {"skipped": "no thinking mode recorded in " + (
            "the prepared data" if trained is None else f"a bench of the run; measure it: specdraft bench --drafter "
            f"{d.run} --chat-template-kwargs JSON --out {d.run}/bench.json")})
    trained_kwargs = meta.get("chat_template_kwargs") or {}
    other = [b for b in benches if (b[1], b[2]) != (trained, trained_kwargs)]
    same = [b for b in benches if (b[1], b[2]) == (trained, trained_kwargs)]
    evidence = {"trained_mode": trained, "trained_kwargs": trained_kwargs,
                "benches": {name: {"mode": mode, "kwargs": kwargs, "tau": fmt(tau) if tau is not None else None,
                                   "prompts": prompts} for name, mode, kwargs, tau, prompts in benches},
                "threshold": TAU_GAP}
    # τ in the two settings compared on one prompt set only: another set's prompts move τ by themselves
    losses = [max(a[3] for a in same if a[4] == p and a[3] is not None) - b[3] for b in other
              for p in [b[4]] if b[3] is not None and any(a[4] == p and a[3] is not None for a in same)]
    loss = max(losses) if losses else None
    holds = bool(other) and (loss is None or loss > TAU_GAP)
    name, mode, kwargs = (other[0] if other else benches[0])[:3]
    served = f"thinking {mode}" + (f" {json.dumps(kwargs)}" if kwargs else "")
    return Finding("thinking_mode", holds, evidence, loss if holds else None,
                   f"specdraft prepare --model {command_model(d)} --conversations SOURCE --regenerate "
                   f"--chat-template-kwargs '{json.dumps(kwargs)}' --out WS/data-thinking-{mode} (the setting served), "
                   "then capture and retrain (or train on both settings' stores)",
                   f"trained with thinking {trained}" + (f" {json.dumps(trained_kwargs)}" if trained_kwargs else "")
                   + f", benched with {served} ({name})")


HELD_OUT_SETS = ("natural", "builtin-holdout")   # bench's evaluation sets: a fix never trains on them


def check_prompt_shift(d: Doctor) -> Finding:
    """τ on the held-out store samples against τ on --prompts (the target's own greedy continuation
    of each, PROMPT_TOKENS long): far lower on the prompts means they are not what the drafter saw.
    The continuations are generated as one left-padded batch, as regeneration writes training data
    (32 prompts in ~10 s on 2 CPU cores, against ~2 min one by one)."""
    convs = read_prompts(d.prompts, limit=HELD_OUT_SAMPLES)
    tok = d.target.tokenizer
    ends = end_of_turn_ids(tok, end_tokens=architecture(d.target.config).end_tokens)
    prompts = [prompt_ids(tok, messages) for messages in convs]
    pad = tok.pad_token_id if tok.pad_token_id is not None else ends[0]
    ids, masks = [], []
    for prompt, new in zip(prompts, padded_generate(d.target.model, prompts, PROMPT_TOKENS, ends, pad)):
        stop = next((i + 1 for i, t in enumerate(new) if t in ends), len(new))   # through the first end id
        ids.append(prompt + new[:stop])
        masks.append([0] * len(prompt) + [1] * stop)
    on_prompts = tau_of(d.metrics_on_tokens(d.drafter, ids, masks), d.steps)
    gap = d.tau - on_prompts
    evidence = {"tau_store_held_out": fmt(d.tau), "tau_prompts": fmt(on_prompts), "prompts": len(ids),
                "threshold": TAU_GAP}
    held_out = d.prompts in HELD_OUT_SETS     # the sets that stand for unseen prompts are never trained on
    source = "SOURCE" if held_out else d.prompts
    return Finding("prompt_shift", gap > TAU_GAP, evidence, gap if gap > TAU_GAP else None,
                   f"specdraft prepare --model {command_model(d)} --conversations {source} --regenerate --out "
                   "WS/data-prompts (then capture it and train on data like both)"
                   + (f"; SOURCE: prompts like the ones you serve (a file of yours, more self:N), never the {d.prompts} "
                      "set itself: it measures prompts the drafter has not seen" if held_out else ""),
                   f"{tau_text(on_prompts, d.steps, d.prompts, len(ids))} vs "
                   f"{tau_text(d.tau, d.steps, 'held-out', len(d.held_out))}")


def val_curve(d: Doctor, metric: str) -> tuple[np.ndarray, np.ndarray]:
    points = [(r["tokens_seen"], r[metric]) for r in d.metrics.split("val")
              if r.get("tokens_seen") is not None and r.get(metric) is not None]
    return np.array([p[0] for p in points], float), np.array([p[1] for p in points], float)


def check_undertrained(d: Doctor) -> Finding:
    """The val τ still rising at the end: its gain over the last quarter of tokens; the loss is what
    the curve, continued at its own slowing rate, has left to gain."""
    x, y = val_curve(d, "accept_len")
    if len(x) < 3:
        return Finding("undertrained", False, {"skipped": f"{len(x)} val points with accept_len (3 needed)"})
    quarter = x[-1] - (x[-1] - x[0]) / 4
    last_gain = float(y[-1] - np.interp(quarter, x, y))
    before = float(np.interp(quarter, x, y) - np.interp(quarter - (x[-1] - quarter), x, y))
    evidence = {"val_tau_end": fmt(y[-1]), "gain_last_quarter": fmt(last_gain), "gain_quarter_before": fmt(before),
                "tokens_seen": int(x[-1]), "threshold": UNDERTRAINED_GAIN}
    holds = last_gain > UNDERTRAINED_GAIN
    ratio = min(last_gain / before, 1.0) if before > 0 else 1.0
    loss = sum(last_gain * ratio ** j for j in range(1, UNDERTRAINED_HORIZON + 1)) if holds else None
    return Finding("undertrained", holds, evidence, loss,
                   f"specdraft train --out {d.run} --resume --epochs {int(d.config.get('epochs', 1)) * 2}",
                   f"val τ gained {last_gain:+.2f} over the last quarter of training and is still rising")


def check_overfit(d: Doctor) -> Finding:
    """Val loss_0 rising from its minimum, or train acc_0 far above val acc_0 while val acc_0 has stopped
    improving: the plain rule docs/analysis.md states, gap > OVERFIT_GAP or val loss_0 rising. A run
    that trains on prompts (train_on_prompts) scores train acc_0 on prompt tokens too, and a val acc_0
    still rising says more epochs still pay: both are said beside the finding, not used to hide it
    (the quick recipe's run: train 0.75 vs val 0.49 was listed "checked and fine" above curves showing
    the gap). The loss is the val τ given up since the best val point, or what generalising as well as
    it fits its training samples would add (not estimated where train is scored on prompts too)."""
    _, acc = val_curve(d, "full_acc_0")
    _, loss_0 = val_curve(d, "loss_0")
    _, tau = val_curve(d, "accept_len")
    train = [r["full_acc_0"] for r in d.metrics.split("train") if r.get("full_acc_0") is not None][-5:]
    if not len(acc) or not train:
        return Finding("overfit", False, {"skipped": "no train and val full_acc_0 in metrics.jsonl"})
    gap = float(np.mean(train) - acc[-1])
    rise = float(loss_0[-1] / loss_0.min() - 1) if len(loss_0) and loss_0.min() > 0 else 0.0
    on_prompts = bool(d.config.get("train_on_prompts"))
    still_rising = len(acc) >= 2 and acc[-1] > acc[:-1].max() + VAL_STILL_RISING
    evidence = {"train_acc_0": fmt(np.mean(train)), "val_acc_0": fmt(acc[-1]), "gap": fmt(gap),
                "val_loss_rise": fmt(rise), "val_acc_0_still_rising": bool(still_rising),
                "train_on_prompts": on_prompts,
                "thresholds": {"gap": OVERFIT_GAP, "val_loss_rise": VAL_LOSS_RISE}}
    holds = rise > VAL_LOSS_RISE or gap > OVERFIT_GAP
    train_tau = [r["accept_len"] for r in d.metrics.split("train") if r.get("accept_len") is not None][-5:]
    loss = None
    if holds and len(tau) and train_tau and not (on_prompts and rise <= VAL_LOSS_RISE):
        loss = max(float(np.mean(train_tau) - tau[-1]), float(tau.max() - tau[-1]))
    notes = (["train acc_0 includes prompt tokens (train_on_prompts), part of the gap"] if on_prompts else []) + (
        ["val acc_0 still rising: more epochs still pay too"] if still_rising else [])
    return Finding("overfit", holds, evidence, loss,
                   f"more data: specdraft prepare --model {command_model(d)} --conversations SOURCE --limit "
                   f"{4 * stored_samples(d)} --regenerate --out WS/data-more (then capture "
                   f"it and train with fewer --epochs than {d.config.get('epochs', '?')}); meanwhile serve "
                   f"{run_layout.best_dir(d.run)}",
                   f"train acc_0 {np.mean(train):.2f} vs val {acc[-1]:.2f} (gap {gap:.2f}, threshold {OVERFIT_GAP}); "
                   f"val loss_0 {rise:+.0%} from its minimum" + "".join(f"; {n}" for n in notes))


def check_depth_decay(d: Doctor) -> Finding:
    """Acceptance at the first draft position past the trained ones against within them: a drop
    beyond DEPTH_DROP means the chain runs on inputs training never showed it. The first untrained
    position is the measure because every chain that gets past the trained positions meets it; the
    conditional acceptance further on is measured only on the chains that survived it (the easy
    stretches) and rises again, so a mean over all untrained positions hides the drop. The loss is τ
    with each untrained position at least at the trained positions' level."""
    rates = rates_of(d.measured, d.steps)
    n = d.trained_positions
    trained = rates[1:n] if n > 1 else rates[:1]      # position 0 reads the target's states, 1.. the drafter's own
    untrained = rates[n:]
    evidence = {"cond_acc": [fmt(a) for a in rates], "trained_positions": n, "threshold": DEPTH_DROP}
    if not untrained:
        return Finding("depth_decay", False, {**evidence, "skipped": f"{n} trained draft positions: no untrained "
                                                                     "position measured"})
    level, first = float(np.mean(trained)), untrained[0]
    holds = first < level - DEPTH_DROP
    loss = chain_accept_lengths(rates[:n] + [max(a, level) for a in untrained])[-1] - d.tau if holds else None
    vocab_path = d.config.get("vocab", "WS/vocab.safetensors")
    return Finding("depth_decay", holds,
                   {**evidence, "trained_mean": fmt(level), "first_untrained": fmt(first), "drop": fmt(level - first)},
                   loss,
                   f"specdraft train --out {d.run}-ttt{d.steps} {d.store_flags} --vocab {vocab_path} "
                   f"--ttt-steps {d.steps} --from-pretrained {d.checkpoint}",
                   f"acceptance {first:.2f} at draft position {n + 1}, the first past the {n} trained ones, "
                   f"vs {level:.2f} within them")


def context_measurements(run: Path) -> list[tuple[str, dict]]:
    """(file, by_context section) of each τ-by-context the run holds: the drafter chain of every
    bench*.json (`bench --prompts long --out RUN/bench_long.json`), every eval*.json."""
    found = []
    for path in sorted(run.glob("bench*.json")) + sorted(run.glob("eval*.json")):
        data = read_json(path, "bench or eval result")
        section = (drafter_method(data)[1].get("by_context") if path.name.startswith("bench") else
                   data.get("by_context") if isinstance(data, dict) else None)
        if len(measured_buckets(section)) >= 2:
            found.append((path.name, section))
    return found


def check_context_decay(d: Doctor) -> Finding:
    """τ at the longest context bucket measured against the shortest (the run's bench / eval
    by_context; the one reaching the longest context, the most buckets on a tie): a drop beyond
    CONTEXT_DECAY (and TAU_GAP) means the drafter was trained on short rows and loses its acceptance
    as the context grows. The loss is the τ missing at that length; the fix trains with long rows."""
    found = context_measurements(d.run)
    if not found:
        return Finding("context_decay", False, {"skipped": "no τ by context at two or more context lengths in the "
                                                           f"run; measure it: specdraft bench --drafter {d.run} "
                                                           f"--prompts long --out {d.run}/bench_long.json"})
    def reach(f):     # the longest context a measurement reached, then how many buckets it has
        rows = measured_buckets(f[1])
        return rows[-1][1].get("low") or 0, len(rows)

    name, section = max(found, key=reach)
    rows = measured_buckets(section)
    (short_label, short), (long_label, long) = rows[0], rows[-1]
    drop = short["tau"] - long["tau"]
    holds = drop > max(TAU_GAP, CONTEXT_DECAY * short["tau"])
    evidence = {"file": name, "k": section.get("k"), "shortest": short_label, "tau_shortest": fmt(short["tau"]),
                "longest": long_label, "tau_longest": fmt(long["tau"]), "threshold": CONTEXT_DECAY,
                "by_context": bucket_text(section)}
    return Finding("context_decay", holds, evidence, drop if holds else None,
                   f"train with long rows: specdraft prepare --conversations long --max-length {LONG_ROWS} --out "
                   f"WS/data-long; specdraft capture --prepared WS/data-long --out WS/hidden-long; then specdraft "
                   f"train --out {d.run}-long --store WS/hidden --store WS/hidden-long "
                   f"--vocab {d.config.get('vocab', 'WS/vocab.safetensors')} --max-tokens {LONG_ROWS} "
                   f"--from-pretrained {d.run / run_layout.BEST} (a recipe: max_tokens: {LONG_ROWS})",
                   f"τ {long['tau']:.2f} at context {long_label} vs {short['tau']:.2f} at {short_label} "
                   f"(K={section.get('k')}, {name})")


def check_below_baseline(d: Doctor) -> Finding:
    """The baseline watch (watch.py) replayed with the run's own watch settings against config.yaml's
    --baseline; the evidence adds the training settings in which the two runs differ (the likely
    cause: an init, an lr); the loss is the baseline's val τ minus the run's at the run's last
    tokens_seen."""
    base = d.config.get("baseline")
    if not base or not Path(base).exists():
        return Finding("below_baseline", False, {"skipped": f"no baseline run ({base or 'none in config.yaml'})"})
    cfg = WatchConfig(split=d.config.get("watch_split", "val"), metric=d.config.get("watch_metric", "full_acc_0"),
                      margin=float(d.config.get("watch_margin", 0.05)),
                      warmup_tokens=float(d.config.get("watch_warmup_tokens", 0)),
                      min_points=int(d.config.get("watch_min_points", 2)))
    watch = BaselineWatch.from_run(base, cfg)
    for i, rec in enumerate(d.metrics.records):
        watch.update(rec, d.metrics.where(i))
    verdict = watch.verdict
    x, y = val_curve(d, "accept_len")
    base_curve = BaselineWatch.from_run(base, WatchConfig(metric="accept_len"))._base
    at = BaselineWatch._at(base_curve, float(x[-1])) if len(x) else None
    loss = at - float(y[-1]) if verdict is not None and at is not None else None
    evidence = {"verdict": verdict.message if verdict else "level with or ahead of the baseline", "baseline": str(base),
                "settings_that_differ": settings_that_differ(d.config, base)}
    if verdict is not None and verdict.evidence:
        last = verdict.evidence[-1]
        evidence.update(metric=cfg.metric, run_value=fmt(last.run), baseline_value=fmt(last.baseline),
                        at_tokens=int(last.tokens_seen), margin=cfg.margin)
    if at is not None:
        evidence.update(val_tau=fmt(y[-1]), baseline_val_tau=fmt(at), tokens_seen=int(x[-1]))
    flags = "".join(train_flag(k, v[1]) for k, v in evidence["settings_that_differ"].items())
    return Finding("below_baseline", verdict is not None and verdict.kind == "behind", evidence, loss,
                   f"train with the baseline's settings: specdraft train --out {d.run}-as-baseline "
                   f"--store {d.config.get('store')} --vocab {d.config.get('vocab')}{flags}",
                   verdict.message if verdict else "")


# Settings that name the run or how it is logged and watched, not how it trains
NOT_TRAINING_SETTINGS = {"out", "baseline", "stop_if_behind", "watch_split", "watch_metric", "watch_margin",
                         "watch_warmup_tokens", "watch_min_points", "progress", "overwrite", "resume", "report_to",
                         "log_every", "val_every", "save_every", "keep_step_checkpoints", "stop_after", "epochs"}


def train_flag(name: str, value) -> str:
    """` --name value` as `specdraft train` takes it; nothing for a setting the baseline left unset."""
    option = name.replace("_", "-")
    if value is None:
        return ""
    if isinstance(value, bool):
        return f" --{option}" if value else f" --no-{option}"
    return f" --{option} {value}"


def settings_that_differ(config: dict, baseline: str | Path) -> dict:
    """{setting: [this run's, the baseline's]} for the training settings in which the two config.yaml
    differ; {} where the baseline is a bare metrics.jsonl."""
    folder = Path(baseline) if Path(baseline).is_dir() else Path(baseline).parent
    path = run_layout.config_file(folder)
    if not path.is_file():
        return {}
    theirs = load_yaml(path)
    return {k: [config.get(k), theirs.get(k)] for k in sorted(set(config) | set(theirs))
            if k not in NOT_TRAINING_SETTINGS and config.get(k) != theirs.get(k)}


def plan_timing(d: Doctor) -> PlanFile:
    """RUN/plan.json (schemas/plan.py) with the measured costs round_cost needs: a verify curve of at least
    two row counts and a draft step."""
    path = d.run / run_layout.PLAN
    plan = read_plan(path, d.run)
    problem = ("field 'draft_ms' is missing (the draft step's ms)" if plan.draft_ms is None else
               f"field 'verify_ms' is {plan.verify_ms} (a verify of at least 2 row counts)"
               if len(plan.verify_ms) < 2 else None)
    if problem:
        raise SpecdraftError(f"{path}: {problem}; re-run `specdraft plan --run {d.run}` (it rewrites the file)")
    return plan


def check_round_cost(d: Doctor) -> Finding:
    """plan's cost model with the measured latencies (RUN/plan.json) and the measured acceptance: does
    the K the run was exported with lose to another K? The loss is the τ the chosen K would need on
    top of its own to match the best K's tokens/s."""
    exports = d.exports
    chosen = [e.num_speculative_tokens for e in exports if e.num_speculative_tokens]
    plan_file = d.run / run_layout.PLAN
    if not chosen or not plan_file.is_file():
        return Finding("round_cost", False, {"skipped": "needs an export of the run (its served K) and RUN/plan.json "
                                                        "(measured costs: specdraft plan --run RUN)"})
    timing = plan_timing(d)
    k = int(chosen[-1])
    rates = rates_of(d.measured, d.steps)
    options = chain_options(rates, timing.verify_ms, timing.draft_ms, max(k, len(timing.verify_ms) - 1))
    best, mine = best_option(options), options[k]
    deficit = 1 - mine.tokens_per_s / best.tokens_per_s
    evidence = {"chosen_k": k, "chosen_tokens_per_s": fmt(mine.tokens_per_s), "best_k": best.k,
                "best_tokens_per_s": fmt(best.tokens_per_s), "verify_ms": timing.verify_ms,
                "draft_ms": timing.draft_ms, "threshold": ROUND_COST_MARGIN}
    holds = deficit > ROUND_COST_MARGIN
    return Finding("round_cost", holds, evidence, mine.tokens_per_cycle * deficit / (1 - deficit) if holds else None,
                   f"specdraft export {d.run} --num-speculative-tokens {best.k} --out EXPORT (or serve with -k auto)",
                   f"K={k} predicts {mine.tokens_per_s:.1f} tok/s, K={best.k} {best.tokens_per_s:.1f}")


def check_export_mismatch(d: Doctor) -> Finding:
    """The run's checkpoint and each export of the run (exports_of) read back as a serving engine reads
    them (config.json's top-level fields, its d2t), against the config the run trained with (the
    checkpoint's "specdraft" block): vLLM serves the top-level fields, so a config.json whose
    top-level fields disagree with its own block is served differently from how it trained. The loss
    is τ as served minus the run's τ, where the differences are ones the store can measure."""
    folders = [d.checkpoint] + [Path(e.out) for e in d.exports if e.out and Path(e.out).is_dir()]
    trained = d.drafter.config
    d2t, _ = mapping_of(d.checkpoint)
    differ, worst, unread = {}, None, []
    for folder in folders:
        config = read_drafter_config(folder)
        if "speculators_model_type" not in config:
            unread.append(str(folder))          # another engine's layout: formats/ checks it on export
            continue
        net = drafter_unchecked(folder, d.target, as_served=True)
        fields = served_differences(trained, net.config)
        if not torch.equal(mapping_of(folder)[0], d2t):
            fields["d2t"] = "differs"
        if not fields:
            continue
        differ[str(folder)] = fields
        served_layers = list(net.config.aux_layer_ids)
        in_range = len(served_layers) == len(trained.aux_layer_ids) and all(0 < i < d.target.num_layers
                                                                             for i in served_layers)
        if set(fields) <= MEASURABLE_FIELDS and in_range:
            tau = tau_of(d.metrics_of(net, served_layers), d.steps)
            worst = max(worst or 0.0, d.tau - tau)
    evidence = {"checked": [str(f) for f in folders], "differences": differ}
    if unread:
        evidence["not_speculators_layout"] = unread
    return Finding("export_mismatch", bool(differ), evidence, worst,
                   f"re-export from the run: specdraft export {d.run} --format speculators --out EXPORT "
                   "(its config.json top-level fields then match the run's)",
                   f"{len(differ)} drafter folder(s) would be served differently from how the run trained "
                   "(config.json top-level fields vs the run's config): "
                   + "; ".join(f"{k}: {', '.join(v)}" for k, v in differ.items()))


CHECKS = {"vocab_coverage": check_vocab_coverage, "vocab_mapping": check_vocab_mapping,
          "aux_layers": check_aux_layers, "template": check_template, "thinking_mode": check_thinking_mode,
          "prompt_shift": check_prompt_shift,
          "undertrained": check_undertrained, "overfit": check_overfit, "depth_decay": check_depth_decay,
          "below_baseline": check_below_baseline, "round_cost": check_round_cost,
          "export_mismatch": check_export_mismatch, "context_decay": check_context_decay}
NEEDS_METRICS = ("undertrained", "overfit", "below_baseline")


# ----------------------------------------------------------------------------- command, output

def diagnose(run: str | Path, model: str | None = None, store: str | Path | None = None,
             prompts: str | None = None, only: list[str] | None = None, out: str | Path | None = None) -> dict:
    """What `specdraft doctor` does: every check, the causes that hold ranked by estimated τ loss
    (largest first, unestimated after), saved to `out` (default RUN/doctor.json, the file the report shows)."""
    run = Path(run)
    if not run.is_dir():
        raise SpecdraftError(f"doctor {run}: not found; pass a run folder (specdraft train --out RUN)")
    if not run_layout.holds_run(run):
        raise SpecdraftError(f"doctor {run}: not a run folder (no config.yaml, metrics.jsonl, best/ or "
                             "checkpoints/); pass the folder `specdraft train --out` wrote")
    if prompts is not None and prompts not in PROMPT_SETS and not Path(prompts).is_file():
        raise SpecdraftError(f"--prompts {prompts}: not found; pass a jsonl file of conversations or builtin-holdout")
    d = Doctor(run, model, str(store) if store is not None else None, prompts)
    check_typed_inputs(d)           # a wrong type is one line before the progress line starts
    found, fine, skipped = [], [], []
    chosen = [(name, check) for name, check in CHECKS.items() if not only or name in only]
    with progress("doctor", len(chosen), 0, "checks") as tracker:   # a minute and more: say where it is
        for name, check in chosen:
            why = skip_reason(d, name)
            finding = None if why else check(d)
            if finding is not None and "skipped" in finding.evidence:
                why = finding.evidence["skipped"]
            if why:
                skipped.append(asdict(Skipped(name, why)))
            elif finding.holds:
                found.append(finding)
            else:
                fine.append({"id": name, "evidence": finding.evidence})
            tracker.advance(1, check=name)
    found.sort(key=rank)
    result = {"run": str(run), "checkpoint": str(d.checkpoint), "tau_held_out": fmt(d.tau), "steps": d.steps,
              "samples": len(d.held_out),
              "causes": [{"id": f.id, "evidence": f.evidence,
                          "estimated_tau_loss": None if f.estimated_tau_loss is None else fmt(f.estimated_tau_loss),
                          "fix": f.fix, "summary": f.summary} for f in found],
              "checked": fine, "skipped": skipped, "measured": measured_line(run)}
    write_json(Path(out) if out is not None else run / REPORT_FILE, result)
    return result


def check_typed_inputs(d: Doctor) -> None:
    """Read the run's small typed files (config.yaml, its exports' export.json, plan.json) up front: a wrong type
    in any is refused in one line naming the file and the field, before any check runs."""
    d.config
    d.exports
    if (d.run / run_layout.PLAN).is_file():
        plan_timing(d)


def rank(f: Finding) -> tuple:
    """LEADING causes first, then by estimated τ loss, largest first, unestimated last."""
    return (f.id not in LEADING, f.estimated_tau_loss is None, -(f.estimated_tau_loss or 0.0))


def skip_reason(d: Doctor, name: str) -> str | None:
    if name == "prompt_shift" and d.prompts is None:
        return "no --prompts given (pass the prompts you serve)"
    if name in NEEDS_METRICS and (d.metrics is None or not d.metrics.records):
        return "no metrics.jsonl records in the run"
    return None


def format_result(result: dict) -> str:
    lines = [f"doctor {result['run']}: {tau_text(result['tau_held_out'], result['steps'], 'held-out', result.get('samples'))} "
             f"of a ceiling of {result['steps'] + 1} (simulated, {result['checkpoint']})"]
    if result.get("measured"):
        lines.append(f"measured: {result['measured']}")
    if not result["causes"]:
        lines.append("no cause found")
    for i, c in enumerate(result["causes"], 1):
        loss = c["estimated_tau_loss"]
        lines.append(f"{i}. {c['id']}: {c['summary']} "
                     f"(estimated τ loss {'unknown' if loss is None else f'{loss:.2f}'})")
        lines.append("   evidence: " + json.dumps(c["evidence"], default=str))
        lines.append(f"   fix: {c['fix']}")
    if result["checked"]:
        lines.append("checked and fine: " + ", ".join(c["id"] for c in result["checked"]))
    for s in result["skipped"]:
        lines.append(f"not checked: {s['id']} ({s['why']})")
    return "\n".join(lines)


def top_cause_line(result: dict) -> str | None:
    """The first cause and its fix as one line (the demo prints it when τ < 2)."""
    if not result.get("causes"):
        return None
    c = result["causes"][0]
    return f"doctor: {c['id']}: {c['summary']}; fix: {c['fix']}"
