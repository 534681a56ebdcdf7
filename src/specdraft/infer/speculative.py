"""The speculative verify loop, shared by every proposer (EAGLE-3 chain or tree, n-gram, none).

Each round: the proposer drafts a tree (a chain is a tree), the target scores the root (the last
accepted token, not yet in its cache) plus every drafted node in ONE forward, the longest path the
target agrees with is accepted plus the target's own next token, and the target's KV cache is cut
back to that path. With greedy decoding the output is exactly the target's plain greedy output;
with sampling the rejection rule (sampling.py) keeps the target's distribution.

Cache invariant between rounds: the target's cache holds tokens[:-1]; tokens[-1] is the root of
the next round. The aux hidden states (inputs of decoder layers `aux_layer_ids`, i.e. HF
`output_hidden_states[l]`, tapped by targets.tap_hidden_states as capture does) of every position
written into the cache go to the proposer.
"""

from __future__ import annotations

import time
import weakref
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Callable, Protocol

import torch

from specdraft.adapter import mask_plan, verify_mask
from specdraft.errors import SpecdraftError
from specdraft.kernels import linear_rows, mm_flags, target_linears, whole_forward_flags
from specdraft.infer.sampling import Sampling, accept_draft, probabilities, sample
from specdraft.infer.tree import Draft, ancestor_mask, greedy_path
from specdraft.targets import decoder_layers, tap_hidden_states


@dataclass
class Profile:
    """Wall time split: target forwards (prefill + verify), drafter forwards, everything else."""

    verify_s: float = 0.0
    draft_s: float = 0.0
    total_s: float = 0.0
    sync_cuda: bool = False

    @contextmanager
    def timed(self, what: str):
        if self.sync_cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync_cuda:
                torch.cuda.synchronize()
            setattr(self, what, getattr(self, what) + time.perf_counter() - start)

    @property
    def other_s(self) -> float:
        return max(self.total_s - self.verify_s - self.draft_s, 0.0)

    def add(self, other: "Profile") -> None:
        self.verify_s += other.verify_s
        self.draft_s += other.draft_s
        self.total_s += other.total_s

    def to_dict(self) -> dict:
        total = self.total_s or 1e-12
        return {"verify_s": self.verify_s, "draft_s": self.draft_s, "other_s": self.other_s,
                "total_s": self.total_s, "verify_frac": self.verify_s / total,
                "draft_frac": self.draft_s / total, "other_frac": self.other_s / total}


class Proposer(Protocol):
    """What the verify loop needs from a drafter."""

    aux_layer_ids: list[int] | None       # target layers whose inputs it wants (None: no aux)
    profile: Profile
    max_nodes: int                        # the most nodes a round drafts (a chain: K): rows = 1 + this

    def reset(self) -> None: ...

    def observe(self, aux: torch.Tensor | None) -> None:
        """aux [T, n_aux, H] of the positions just written into the target's cache, in order."""

    def propose(self, tokens: list[int], budget: int, sampling: Sampling,
                generator: torch.Generator) -> Draft:
        """Draft at most `budget` tokens (depth) after `tokens` (whose last is the root)."""


class CostProbed(Protocol):
    """What `-k auto` and `plan` need from a proposer besides the loop's calls (with the family's
    `drafts_in_one_forward` and `max_draft`): its draft cost, measured through its own path."""

    def draft_probe(self, context: int, k: int) -> Callable[[], None]:
        """A callable that runs one round's unit of drafting on a drafter cache of `context` positions
        and leaves the cache as it found it: one draft step of a chain (a round costs K of them), or
        the one forward of a family that drafts a round at once, at K = k."""


@dataclass
class Generation:
    token_ids: list[int]                   # new tokens only
    seconds: float
    target_forwards: int                   # prefill + verify rounds
    accepted: list[int] = field(default_factory=list)   # drafts accepted per verify round
    proposed: list[int] = field(default_factory=list)   # draft depth offered per verify round
    profile: Profile = field(default_factory=Profile)
    drafts_cut: int = 0                    # rounds whose chain a confidence stop ended before K
    contexts: list[int] = field(default_factory=list)   # context length (tokens so far) per verify round

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0

    @property
    def accept_len(self) -> float:
        """Mean tokens per verify round (accepted drafts + the target's own token); 1.0 = no speedup."""
        rounds = len(self.accepted)
        return (sum(self.accepted) + rounds) / rounds if rounds else 1.0


def per_position_accept(accepted: list[int], proposed: list[int]) -> list[float]:
    """Rate at which draft position i (1-based) was accepted, over rounds that offered it."""
    depth = max(proposed, default=0)
    rates = []
    for i in range(1, depth + 1):
        offered = sum(1 for p in proposed if p >= i)
        rates.append(sum(1 for a, p in zip(accepted, proposed) if p >= i and a >= i) / offered)
    return rates


def eos_ids_of(model, tokenizer=None) -> set[int]:
    ids = getattr(model.generation_config, "eos_token_id", None)
    if ids is None and tokenizer is not None:
        ids = tokenizer.eos_token_id
    if ids is None:
        return set()
    return {int(ids)} if isinstance(ids, int) else {int(i) for i in ids}


class MeasuredLinear(torch.nn.Module):
    """Stands in for one nn.Linear inside few_row_matmul: its weight and bias, run per row count by the kernel
    measured fastest on this machine for its shape (kernels.py: F.linear or mm(W, x^T))."""

    def __init__(self, linear: torch.nn.Linear, use_mm: tuple[bool, ...]):
        super().__init__()
        self.linear, self.use_mm = linear, use_mm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        return linear_rows(self.linear.weight, self.linear.bias, x, rows < len(self.use_mm) and self.use_mm[rows])

    def __getattr__(self, name: str):
        """The Linear's own attributes (weight, bias, in_features, ...), for code that reads them mid-forward."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if name == "linear":
                raise
            return getattr(self.linear, name)


WRAPPED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()   # model -> {id(Linear): (its parent's modules,
                                                                     # its name there, its MeasuredLinear)}


def wrappers(model, linears: list[torch.nn.Linear]) -> dict:
    """Each Linear's place in `model` and its MeasuredLinear, made once per model: a verify round swaps ~200 of
    them in and out, and building them per round cost ~4 ms of a 45 ms SmolLM2 round."""
    made = WRAPPED.get(model, {})
    if any(id(layer) not in made for layer in linears):
        wanted = {id(layer) for layer in linears}
        made = {id(child): (parent._modules, name, MeasuredLinear(child, ())) for parent in model.modules()
                for name, child in parent._modules.items() if id(child) in wanted}
        WRAPPED[model] = made
    return made


@contextmanager
def few_row_matmul(model, linears: list[torch.nn.Linear] | None = None,
                   flags: list[tuple[bool, ...]] | None = None):
    """Within the block, each of the CPU model's nn.Linear layers is replaced in its parent module by its
    MeasuredLinear (the same weights, the kernel measured for each row count); put back after. `flags`
    (kernels.mm_flags of `linears`) saves the table lookup on a hot path. Off the CPU the model runs as it is."""
    if next(model.parameters()).device.type != "cpu":
        yield
        return
    linears = linears if linears is not None else target_linears(model)
    flags = flags if flags is not None else mm_flags(linears)
    places = wrappers(model, linears) if flags else {}
    swapped = []
    for layer, use_mm in zip(linears, flags or []):
        modules, name, wrapper = places[id(layer)]
        wrapper.use_mm = use_mm
        modules[name] = wrapper
        swapped.append((modules, name, layer))
    try:
        yield
    finally:
        for modules, name, layer in swapped:
            modules[name] = layer


def cache_kwarg(model) -> str:
    """The forward() keyword of the KV cache: `cache` since transformers 5.2x, `past_key_values`
    before (vLLM 0.32 pins transformers < 5.20, and specdraft shares its environment)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def static_cache(model, max_len: int):
    """transformers' Cache made of StaticLayers: keys/values preallocated for `max_len` slots, written
    where the runner says (TargetRunner._forward sets each layer's write slot). Every layer keeps every
    slot, sliding-window and chunked layers too: their masks (adapter.verify_mask) keep what they see."""
    from transformers.cache_utils import Cache, StaticLayer

    return Cache(layers=[StaticLayer(max_cache_len=max_len) for _ in decoder_layers(model)])


SLOT_BLOCK = 512     # a compiled runner's cache is a multiple of this many slots, so prompts share its shapes
COMPILED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()     # target -> its compiled module


def compiled(model) -> torch.nn.Module:
    """The target under torch.compile (inductor, static shapes: one graph per row count and cache
    length), made once per model per process; the first round of each shape pays the compile."""
    if model not in COMPILED:
        import torch._dynamo.config as dynamo
        from torch._inductor.cpp_builder import get_cpp_compiler

        if next(model.parameters()).device.type == "cpu":
            try:
                get_cpp_compiler()                    # inductor builds C++ kernels on a CPU
            except Exception as e:
                raise SpecdraftError(f"--compile: torch.compile needs a C++ compiler on a CPU and found none "
                                     f"({e}); install g++ or drop --compile") from None

        dynamo.recompile_limit = max(dynamo.recompile_limit, 64)    # a graph per (R, slots), not 8 at most
        COMPILED[model] = torch.compile(model, dynamic=False)
    return COMPILED[model]


class TargetRunner:
    """The target over a static KV cache, every verify round in ONE forward shape: `rows` rows (the root,
    the drafted nodes, pad rows after them) against all `max_len` cache slots, masked per row. Plain
    decoding runs the same shape, so a row's logits do not depend on how many drafts came with it: the
    kernels (matmul blocking, SDPA) see identical shapes every round, and speculation is bit-identical
    to this loop's own plain decoding in any dtype (issue 35). A pad row writes a slot past the real ones,
    which the next round overwrites before any row may see it. Also: the aux hidden states, and the cache
    surgery that keeps exactly the accepted positions.

    The core (masks, cache, one verify) is exact on its own; three speed layers sit on it, each switchable
    and measured on and off by benchmarks/runner_layers.py. pad_rows: every round R rows (off: a round runs
    only its own rows, its shape changes with its draft, so its bits may differ from plain decoding's).
    kernels: the few-row Linear kernels measured on this machine (few_row_matmul; off: F.linear). compile:
    verify rounds under torch.compile (`compiled`; the prompt's prefill stays eager, its length varies)
    instead of the measured kernels."""

    def __init__(self, model, aux_layer_ids: list[int] | None, profile: Profile, rows: int = 1,
                 max_len: int = 2048, compile: bool = False, pad_rows: bool = True, kernels: bool = True):
        self.model = model
        self.pad_rows = pad_rows
        self.verify_model = compiled(model) if compile else model
        self.aux_layer_ids = aux_layer_ids
        decoder_layers(model)            # refuse a target without a decoder's layers up front
        self.masks = mask_plan(model)    # per layer type (full, sliding, chunked), additive where eager
        if self.masks.refusal:
            raise SpecdraftError(self.masks.refusal)
        self.profile = profile
        self.device = next(model.parameters()).device
        self.rows, self.max_len, self.length = rows, max_len, 0
        self.cache = static_cache(model, max_len)
        self.cache_key = cache_kwarg(model)
        self.linears = target_linears(model)
        self.mm_flags = whole_forward_flags(self.linears, mm_flags(self.linears)) if kernels and not compile else None
        self.slots = torch.arange(max_len, device=self.device)                     # [S]

    def cache_len(self) -> int:
        return self.length

    def prefill(self, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The prompt into slots [0, T), causal: -> logits [1, V] of its last position, aux [T, n_aux, H]."""
        if len(ids) + self.rows > self.max_len:
            raise SpecdraftError(f"prompt of {len(ids)} tokens does not fit a cache of {self.max_len} slots")
        positions = list(range(len(ids)))
        visible = self.slots[None, :] <= torch.tensor(positions, device=self.device)[:, None]   # [T, S]
        return self._forward(ids, positions, visible, self.slots, start=0, last_only=True)

    def verify(self, ids: list[int], positions: list[int], ancestors: torch.Tensor | None = None
               ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Root + drafted nodes (ids[0] the root) into slots [past, past+n), padded to `rows` rows.
        ancestors: bool [n, n] (tree.ancestor_mask), None for a chain. -> logits [n, V], aux [n, n_aux, H]."""
        n, past = len(ids), self.length
        if n > self.rows:
            raise SpecdraftError(f"a round of {n} rows in a runner of {self.rows}: raise rows")
        rows = self.rows if self.pad_rows else n
        own = torch.ones(n, n, dtype=torch.bool).tril() if ancestors is None else ancestors      # [n, n]
        block = torch.eye(rows, dtype=torch.bool)                                               # pad rows: themselves
        block[:n, :n] = own
        visible = self.slots[None, :] < past                                                    # [1, S] the cached past
        visible = visible.expand(rows, -1).clone()                                              # [R, S]
        visible[:, past:past + rows] = block.to(self.device)
        pad = rows - n
        ids = ids + [ids[0]] * pad
        positions = positions + [positions[-1] + 1 + i for i in range(pad)]
        slot_pos = self.slots                           # [S] each slot's position: read by sliding/chunked masks only
        if self.masks.per_type:
            slot_pos = slot_pos.clone()
            slot_pos[past:past + rows] = torch.tensor(positions, device=self.device)
        logits, aux = self._forward(ids, positions, visible, slot_pos, start=past)
        return logits[:n], aux[:n] if aux is not None else None

    @torch.no_grad()
    def _forward(self, ids: list[int], positions: list[int], visible: torch.Tensor, slot_pos: torch.Tensor,
                 start: int, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids into slots [start, start+len(ids)); visible bool [T, S] (True = may attend, before each layer
        type's own rule); slot_pos [S] the position each slot holds."""
        captured: dict[int, torch.Tensor] = {}                                    # slot -> [T, H]
        input_ids = torch.tensor([ids], device=self.device)                       # [1, T]
        position_ids = torch.tensor([positions], device=self.device)              # [1, T]
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(start)                                  # StaticLayer writes from here
        taps = self.aux_layer_ids or []
        mask = verify_mask(self.masks, visible, position_ids[0], slot_pos)
        kwargs = dict(input_ids=input_ids, position_ids=position_ids, attention_mask=mask,
                      use_cache=True, logits_to_keep=1 if last_only else 0, **{self.cache_key: self.cache})
        if last_only or self.verify_model is self.model:        # eager: hooks tap, measured per-Linear kernels
            with tap_hidden_states(self.model, taps, lambda slot, h: captured.update({slot: h[0]})):
                with self.profile.timed("verify_s"), self.kernel_layer(len(ids)):
                    out = self.model(**kwargs)
        else:   # compiled: dynamo skips hooks added after tracing, so the states come as outputs, with or
            with self.profile.timed("verify_s"):      # without taps: one graph per R, whatever the proposer
                out = self.verify_model(**kwargs, output_hidden_states=True)
            captured = {slot: out.hidden_states[lid][0] for slot, lid in enumerate(taps)}   # HF [l] = layer l's input
        self.length = start + len(ids)
        aux = torch.stack([captured[slot] for slot in range(len(self.aux_layer_ids))], dim=1) \
            if self.aux_layer_ids else None
        return out.logits[0], aux

    def kernel_layer(self, rows: int):
        """The measured kernels for a forward of `rows` rows: few_row_matmul where some Linear runs mm(W, x^T) at
        that row count; nothing to swap where every one runs F.linear (most CPUs' 1-row choice) or the layer is off."""
        if not self.mm_flags or not any(rows < len(f) and f[rows] for f in self.mm_flags):
            return nullcontext()
        return few_row_matmul(self.model, self.linears, self.mm_flags)

    def keep(self, start: int, path: list[int]) -> None:
        """The cache holds [0, start) plus one slot per tree node; keep [0, start) + the path's nodes."""
        if path != list(range(len(path))):
            index = torch.tensor(path, device=self.device) + start
            for layer in self.cache.layers:
                layer.keys[:, :, start:start + len(path)] = layer.keys[:, :, index]
                layer.values[:, :, start:start + len(path)] = layer.values[:, :, index]
        self.length = start + len(path)


def round_rows(proposer: "Proposer | None") -> int:
    """The row count R every round of this proposer runs at: the root plus the most nodes it drafts."""
    return 1 + (proposer.max_nodes if proposer is not None else 0)


def checked_rows(proposer: "Proposer | None", rows: int | None, method: str = "this method") -> int:
    """R for a run: `rows` (--verify-rows) when given, refused below what a round needs; else round_rows."""
    need = round_rows(proposer)
    if rows is not None and rows < need:
        raise SpecdraftError(f"--verify-rows {rows}: a round of {method} needs {need} rows (the root and its "
                             "drafts); raise it or lower -k")
    return rows or need


def cache_slots(need: int, compile: bool) -> int:
    """The runner's cache length for `need` slots: under compile rounded up to SLOT_BLOCK (prompts share a graph)."""
    return -(-need // SLOT_BLOCK) * SLOT_BLOCK if compile else need


def sample_chain(draft: Draft, logits: torch.Tensor, sampling: Sampling,
                 generator: torch.Generator) -> tuple[list[int], int]:
    """Rejection sampling along a chain. logits [N+1, V] -> (accepted path, next token)."""
    if not draft.is_chain:
        raise SpecdraftError("--tree: tree drafting is greedy only; use --temperature 0 or drop --tree")
    p = probabilities(logits, sampling)                                           # [N+1, V]
    path = [0]
    for i, token in enumerate(draft.tokens):
        q = draft.q[i] if draft.q is not None else None
        ok, replacement = accept_draft(p[i], q, token, generator)
        if not ok:
            return path, replacement
        path.append(i + 1)
    return path, sample(p[len(draft.tokens)], generator)


@torch.no_grad()
def generate(model, prompt_ids: list[int], proposer: Proposer | None = None, max_new_tokens: int = 128,
             sampling: Sampling | None = None, eos_token_ids: set[int] | None = None,
             on_tokens: Callable[[list[int]], None] | None = None, sync_cuda: bool = False,
             rows: int | None = None, compile: bool = False, pad_rows: bool = True, kernels: bool = True
             ) -> Generation:
    """Speculative decoding of one prompt (batch 1). proposer None = plain decoding by this loop.
    rows: R, the row count of every round (default round_rows(proposer)); two runs with the same R emit
    the same tokens in any dtype, drafter or not. compile: verify under torch.compile (TargetRunner),
    the cache rounded up to SLOT_BLOCK slots so that every prompt of a length class reuses one graph.
    pad_rows, kernels: the runner's other speed layers (TargetRunner), on unless a benchmark turns them off."""
    sampling = sampling or Sampling()
    eos = eos_ids_of(model) if eos_token_ids is None else eos_token_ids
    profile = Profile(sync_cuda=sync_cuda)
    rows = checked_rows(proposer, rows)
    slots = cache_slots(len(prompt_ids) + max(max_new_tokens, 1) + rows, compile)
    runner = TargetRunner(model, proposer.aux_layer_ids if proposer else None, profile, rows, slots, compile,
                          pad_rows, kernels)
    generator = sampling.generator(runner.device)
    if proposer is not None:
        proposer.profile = profile
        proposer.reset()
    result = Generation(token_ids=[], seconds=0.0, target_forwards=0, profile=profile)
    if max_new_tokens <= 0 or not prompt_ids:
        return result
    start = time.perf_counter()

    def emit(new: list[int]) -> bool:
        """Append up to the budget / the first EOS; True when generation is over."""
        out = []
        for t in new:
            out.append(t)
            if t in eos or len(result.token_ids) + len(out) >= max_new_tokens:
                break
        result.token_ids.extend(out)
        tokens.extend(out)
        if on_tokens:
            on_tokens(out)
        return out[-1] in eos or len(result.token_ids) >= max_new_tokens

    logits, aux = runner.prefill(prompt_ids)
    result.target_forwards += 1
    first = int(logits[-1].argmax()) if sampling.greedy else sample(probabilities(logits[-1], sampling), generator)
    tokens = list(prompt_ids)
    done = emit([first])
    if proposer is not None:
        proposer.observe(aux)
    while not done:
        budget = max_new_tokens - len(result.token_ids) - 1      # drafts beyond this are never used
        draft = proposer.propose(tokens, budget, sampling, generator) if proposer and budget > 0 \
            else Draft([], [])
        path, bonus, aux = verify_round(runner, draft, tokens, sampling, generator)
        result.target_forwards += 1
        if proposer is not None:
            proposer.observe(aux[path] if aux is not None else None)
            result.accepted.append(len(path) - 1)
            result.proposed.append(max(draft.depths()))
            result.contexts.append(len(tokens))
        done = emit([draft.tokens[i - 1] for i in path[1:]] + [bonus])
    result.seconds = time.perf_counter() - start
    profile.total_s = result.seconds
    result.drafts_cut = getattr(proposer, "drafts_cut", 0)
    return result


def verify_round(runner, draft: Draft, tokens: list[int], sampling: Sampling, generator):
    """One target forward over the last token and `draft`: (the accepted path of draft positions,
    the target's bonus token after it, aux hidden states of every position); the target's cache
    keeps the path only."""
    past = len(tokens) - 1
    logits, aux = runner.verify([tokens[-1]] + draft.tokens, [past + d for d in draft.depths()],
                                None if draft.is_chain else ancestor_mask(draft.parents))
    if sampling.greedy:
        choice = logits.argmax(dim=-1).tolist()
        path = greedy_path(draft, choice)
        bonus = choice[path[-1]]
    else:
        path, bonus = sample_chain(draft, logits, sampling, generator)
    runner.keep(past, path)
    return path, bonus, aux
