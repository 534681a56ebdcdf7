"""What bench and generate run: the methods' names, the drafter they load, the proposers built for them, and
their options checked before any model loads.

The names: greedy (transformers' generate), plain (specdraft's loop with no drafter), ngram, a drafter family's
chain, FAMILY-tree and hybrid (BASE_METHODS and the comment above them). The drafter: a checkpoint, a run folder or
`untrained[:N]`, checked against the target (load_drafter_for). The proposers: build_methods, with each loop
method's rows (assign_rows, shape_rows) and the hybrid's form (hybrid_form).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from specdraft import families
from specdraft.adapter import text_config
from specdraft.defaults import DRAFT_LENGTH, check_compute_dtype
from specdraft.errors import SpecdraftError
from specdraft.families import family, family_of
from specdraft.formats.checkpoints import load_drafter, resolve_checkpoint
from specdraft.infer.hybrid import HYBRID, TREE_PAYS, HybridProposer, tree_pays
from specdraft.infer.ngram import Datastore, NgramProposer
from specdraft.infer.prompts import LONG
from specdraft.infer.speculative import checked_rows
from specdraft.infer.tree import TreeShape
from specdraft.targets import default_aux_layers

# greedy: transformers' generate (what a user runs without us; every speedup is against it).
# plain: specdraft's own loop with no drafter, on the kernel paths measured for this machine
# (kernels.py): a drafter's speedup over plain is what the drafts alone bring.
# Then a drafter's own chain under its family's name, FAMILY-tree where the family drafts trees, and hybrid:
# the drafter's chain and the n-gram continuation verified together (infer/hybrid.py), any family.
BASE_METHODS = ("greedy", "plain", "ngram")
TREE = "-tree"


HYBRID_TREE = HYBRID + TREE   # the drafter's tree with the n-gram continuation grafted on (greedy)


def all_methods() -> tuple[str, ...]:
    return (*BASE_METHODS, *families.names(), *(n + TREE for n in families.names() if family(n).tree), HYBRID,
            HYBRID_TREE)


def needs_drafter(name: str) -> bool:
    return name in (HYBRID, HYBRID_TREE) or name.removesuffix(TREE) in families.names()


def check_drafter_methods(names: list[str], drafter, flag: str = "--methods") -> None:
    """A drafter method names the drafter's family: --methods FAMILY runs a drafter of that family
    (hybrid takes a drafter of any family). `flag`: the option the user typed (bench's --methods,
    generate's --method)."""
    wanted = [n for n in names if needs_drafter(n)]
    if wanted and drafter is None:
        raise SpecdraftError(f"{flag} {wanted[0]}: needs --drafter (a checkpoint, a run folder, or untrained)")
    for name in (n for n in wanted if n != HYBRID):
        have = family_of(drafter).model_type
        if name == HYBRID_TREE and not family_of(drafter).tree:
            raise SpecdraftError(f"{flag} {name}: the --drafter is a {have} drafter, which drafts no tree; "
                                 f"name it {flag} {HYBRID} (its chain with the n-gram continuation)")
        if name != HYBRID_TREE and name.removesuffix(TREE) != have:
            tree = TREE if name.endswith(TREE) else ""
            raise SpecdraftError(f"{flag} {name}: the --drafter is a {have} drafter; name it {flag} {have}{tree}")


DEFAULT_TREE = "4,4,16"
UNTRAINED = "untrained"


def untrained_drafter(target_model, draft_vocab_size: int = 8192, seed: int = 0, verifier: str = "",
                      model_type: str = families.DEFAULT):
    """Random drafter over the first N target ids (timing only: it is almost never accepted)."""
    from types import SimpleNamespace

    tc = text_config(target_model.config)
    n = min(draft_vocab_size, tc.vocab_size)
    torch.manual_seed(seed)
    fam = family(model_type)
    drafter = fam.build(fam.new_config(target_model.config, n, default_aux_layers(tc.num_hidden_layers), verifier))
    t2d = torch.zeros(tc.vocab_size, dtype=torch.bool)
    t2d[:n] = True
    fam.init_from_target(drafter, SimpleNamespace(model=target_model), torch.zeros(n, dtype=torch.long), t2d)
    return drafter.eval()


def check_drafter_fits(drafter, target_model, target_name: str = "") -> list[str]:
    """Raise on shape mismatches; return warnings (e.g. a different verifier name)."""
    cfg, tc = drafter.config, text_config(target_model.config)
    where = f"--drafter (verifier {cfg.verifier or 'unnamed'})"
    if cfg.hidden_size != tc.hidden_size:
        raise SpecdraftError(f"{where}: hidden size {cfg.hidden_size} != target's {tc.hidden_size}; "
                             "this drafter was trained for another target")
    if cfg.vocab_size != tc.vocab_size:
        raise SpecdraftError(f"{where}: vocab size {cfg.vocab_size} != target's {tc.vocab_size}; "
                             "this drafter was trained for another target")
    if not all(0 <= l < tc.num_hidden_layers for l in cfg.aux_layer_ids):
        raise SpecdraftError(f"{where}: aux layer ids {cfg.aux_layer_ids} do not fit a "
                             f"{tc.num_hidden_layers}-layer target")
    warnings = []
    if cfg.verifier and target_name and cfg.verifier != target_name:
        warnings.append(f"drafter was trained for {cfg.verifier}, running against {target_name}")
    return warnings


def load_drafter_for(spec: str | Path, target, device: str = "cpu", dtype: torch.dtype = torch.float32):
    """--drafter: a checkpoint folder, a run folder (best/ or newest epoch), or `untrained[:N]`,
    checked against `target` (shapes, aux layers; a warning for another verifier name)."""
    spec = str(spec)
    if spec == UNTRAINED or spec.startswith(UNTRAINED + ":"):
        try:
            n = int(spec.split(":", 1)[1]) if ":" in spec else 8192
        except ValueError:
            raise SpecdraftError(f"--drafter {spec}: expected untrained or untrained:N (draft vocab size)") from None
        if n < 1:
            raise SpecdraftError(f"--drafter {spec}: the draft vocab size N must be >= 1, e.g. untrained:8192")
        drafter = untrained_drafter(target.model, n, verifier=target.name)
    else:
        drafter = load_drafter(resolve_checkpoint(spec), target_model=target.model)  # embeds if shipped without
    for warning in check_drafter_fits(drafter, target.model, target.name):
        print(f"warning: {warning}", file=sys.stderr)
    return drafter.to(device=device, dtype=dtype).eval()


@dataclass
class Method:
    name: str
    proposer: object | None          # None: no drafts (plain decoding)
    hf: bool = False                 # plain decoding by transformers' generate, not by our loop
    rows: int | None = None          # R of every round in our loop (assign_rows)


def is_chain(name: str) -> bool:
    """A drafter family's own chain: the method -k auto chooses K (and R) for."""
    return name in families.names()


def assign_rows(methods: list[Method], rows: int | None, chain_rows: int | None, plain_rows: int | None) -> None:
    """R per loop method, refused before any run where a round needs more: --verify-rows for every one;
    else `chain_rows` for the drafter's chain and `plain_rows` for plain decoding (shape_rows); the rest at
    their own round_rows."""
    for m in methods:
        if not m.hf:
            shared = rows or (plain_rows if m.name == "plain" else chain_rows if is_chain(m.name) else None)
            m.rows = checked_rows(m.proposer, shared, m.name)


def build_methods(names: list[str], drafter, k: int, tree: TreeShape | None, ngram_max: int,
                  ngram_min: int, draft_stop: float | None = None, ngram_k: int | None = None,
                  datastore: Datastore | None = None, hybrid_tree: bool = True) -> list[Method]:
    """The methods `names` name, checked by the command that read them (run_bench, generate_one:
    known names, each drafter method with a drafter of its family) before any model loaded.
    `datastore`: the target's answers that ngram and hybrid also draft from (infer/ngram.py)."""
    methods = []
    for name in names:
        if name == "greedy":
            methods.append(Method(name, None, hf=True))
        elif name == "plain":
            methods.append(Method(name, None))
        elif name == "ngram" or (name == HYBRID and k == 0):   # hybrid without a drafter chain that pays
            methods.append(Method(name, NgramProposer(ngram_k or k or DRAFT_LENGTH, ngram_max, ngram_min, datastore)))
        elif k == 0 and not name.endswith(TREE):   # -k auto found no chain that pays here: plain decoding
            methods.append(Method(name, None))
        elif name == HYBRID:
            chain = family_of(drafter).proposer(drafter, k=k, stop=draft_stop)
            methods.append(Method(name, HybridProposer(chain, ngram_k or k, ngram_max, ngram_min, datastore=datastore,
                                                       tree=hybrid_tree)))
        elif not name.endswith(TREE):
            methods.append(Method(name, family_of(drafter).proposer(drafter, k=k, stop=draft_stop)))
        else:
            drafted = family_of(drafter).proposer(drafter, tree=tree or TreeShape.parse(DEFAULT_TREE))
            methods.append(Method(name, drafted if name != HYBRID_TREE else HybridProposer(
                drafted, ngram_k or k or DRAFT_LENGTH, ngram_max, ngram_min, datastore=datastore)))
    return methods


def shape_rows(choice, k: int, dtype: str, plain: int | None = None) -> dict:
    """R of the drafter's chain and of plain decoding when --verify-rows is not given. The chain: the R
    -k auto chose, else K+1 outside float32, else its own round_rows (None). Plain decoding: its own R,
    the one -k auto measured cheapest for one row, else `plain` (auto.plain_rows), the fastest plain
    decoding this loop has, so that every "x plain" is against it. Outside float32 plain runs at the chain's
    R too (its tokens depend on R there: that run is the chain's lossless reference), and its own R, where
    that differs, is `fastest_plain_rows`: the speed baseline."""
    from specdraft.infer.costmodel import cheapest_rows

    chain = choice.rows if choice is not None else k + 1 if dtype != "float32" else None
    own = cheapest_rows(choice.verify_ms, 1) if choice is not None else plain
    if dtype != "float32":
        return {"chain_rows": chain, "plain_rows": chain, "fastest_plain_rows": own if own != chain else None}
    return {"chain_rows": chain, "plain_rows": own}


def hybrid_form(target, names: list[str], choice, k: int, ngram_k: int, ids: list[int],
                greedy: bool = True) -> str | None:
    """"tree" or "switch" (infer/hybrid.py) for a hybrid with a drafter chain, None without one: the tree
    where hybrid.tree_pays on this machine's verify curve (-k auto's, else timed now at this prompt's
    length), said in one line on stderr. Sampling always runs the switch."""
    if HYBRID not in names or k == 0:
        return None
    if not greedy:
        return "switch"
    from rich.console import Console

    from specdraft.infer.auto import measure_costs

    rows = 1 + k + ngram_k
    verify = choice.verify_ms if choice is not None and len(choice.verify_ms) >= rows else \
        measure_costs(target.model, None, rows, len(ids), label="hybrid: timing")["verify_ms"]
    form = "tree" if tree_pays(verify, k, ngram_k) else "switch"
    switch = 1 + max(k, ngram_k)
    Console(stderr=True).print(f"hybrid: the {form} (verify of {rows} rows {verify[rows - 1]:.1f} ms, of {switch} "
                               f"{verify[switch - 1]:.1f} ms; the tree where at most {TREE_PAYS:.2f}x)",
                               highlight=False, soft_wrap=True, markup=False)
    return form


def check_bench_options(names: list[str], methods: str, chains: list[str], k, k_option, stop, tree, dtype: str,
                        datastore=None, prompts: str | None = None, max_context: int | None = None) -> None:
    """bench's settings checked before any model loads: every one names a method (or prompt set) that uses it."""
    if max_context is not None and prompts != LONG:
        raise SpecdraftError(f"--max-context {max_context}: bounds the long-context prompt set only; add "
                             "--prompts long or drop --max-context")
    bad = [n for n in names if n not in all_methods()]
    if bad or not names:
        raise SpecdraftError(f"--methods {methods}: unknown {bad or 'empty'}; choose from {', '.join(all_methods())}")
    check_compute_dtype(dtype)
    if (k is None or stop is not None) and not chains:
        raise SpecdraftError("--num-speculative-tokens auto and --draft-stop: for a drafter's chain; add its family "
                             f"({', '.join(families.names())}) to --methods")
    # a setting no method uses is refused, never measured as if it took effect
    if tree is not None and not any(n.endswith(TREE) for n in names):
        trees = [n for n in all_methods() if n.endswith(TREE)]
        raise SpecdraftError(f"--tree {tree}: no method in --methods {methods} drafts a tree; add "
                             f"{' or '.join(trees) or 'a tree method'} or drop --tree")
    if k_option is not None and all(n in ("greedy", "plain") or n.endswith(TREE) for n in names):
        raise SpecdraftError(f"-k {k_option}: no method in --methods {methods} drafts a chain (greedy and plain decode "
                             "one token a step; a tree's size is --tree's); add ngram, hybrid or a drafter family, "
                             "or drop -k")
    check_datastore_methods(datastore, names, "--methods")


AUTO_DTYPE_ROWS = 4      # --compute-dtype auto times matmuls at the rows of a K=3 chain's verify


def compute_dtype(dtype: str, model: str, device: str, trust_remote_code: bool) -> str:
    """--compute-dtype for bench and generate: as asked, or for auto the faster one on this machine
    (dtypes.auto_dtype: bf16 on a GPU, on a CPU where bf16 matmuls measure faster; float32 under
    SPECDRAFT_KERNEL_PATH=linear). Outside float32 lossless means plain decoding's tokens at the same R."""
    from specdraft.dtypes import auto_dtype
    from specdraft.targets import target_config

    return auto_dtype(dtype, target_config(model, trust_remote_code), AUTO_DTYPE_ROWS, gpu=device.startswith("cuda"))


def datastore_readers(names: list[str], form: str | None) -> list[str]:
    """The methods that draft from --datastore: n-gram and the hybrid tree (hybrid-tree, or hybrid in its
    tree form); hybrid as the switch drafts from the context alone (infer/hybrid.py)."""
    return [n for n in names if n in ("ngram", HYBRID_TREE) or n == HYBRID and form != "switch"]


def unused_datastore_line(names: list[str], form: str | None) -> str | None:
    """The line said where hybrid runs as the switch with --datastore: nothing it runs reads the datastore."""
    if HYBRID in names and form == "switch" and not datastore_readers(names, form):
        return ("--datastore: hybrid runs as the switch on this machine (its verify curve), which drafts from the "
                "context alone: the datastore is unused; --tree runs the tree form, which reads it")
    return None


def refuse_given(options: dict, line) -> None:
    """Refuse the first of `options` (flag -> value) that was given (neither None nor False): `line(flag)`."""
    given = next((flag for flag, value in options.items() if value not in (None, False)), None)
    if given is not None:
        raise SpecdraftError(line(given))


def check_served_only(options: dict) -> None:
    """Options of `bench --engine vllm` alone: refused by name in specdraft's own loop."""
    refuse_given(options, lambda flag: f"{flag}: applies to --engine vllm only; add --engine vllm or drop {flag}")


def check_datastore_methods(datastore, names: list[str], option: str) -> None:
    if datastore is not None and not {"ngram", HYBRID, HYBRID_TREE} & set(names):
        raise SpecdraftError(f"--datastore {datastore}: only ngram and hybrid draft from it; add one to {option} "
                             "or drop --datastore")
