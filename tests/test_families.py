"""The drafter-family seam (issue 24): a toy third family, defined and registered inside this test,
trains through `train`, round-trips through the speculators layout and generates losslessly,
with no change to any file outside model/<family>/ and the registry."""

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
import torch
from torch import nn

from specdraft.errors import SpecdraftError
from specdraft.formats.checkpoints import load_checkpoint, load_drafter
from specdraft.infer.speculative import Profile, generate
from specdraft.infer.tree import Draft
from specdraft import families as registry
from specdraft.train.loop import train
from test_train import config, ws  # noqa: F401  (the tiny workspace fixture)


@dataclass
class ToyConfig:
    model_type = "toy"
    hidden_size: int
    vocab_size: int
    draft_vocab_size: int
    aux_layer_ids: list[int] = field(default_factory=list)
    verifier: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ToyConfig":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


class ToyDrafter(nn.Module):
    """Token t+2 from aux(t) and the embedding of token t+1, through one hidden layer."""

    def __init__(self, cfg: ToyConfig):
        super().__init__()
        H, n_aux = cfg.hidden_size, len(cfg.aux_layer_ids)
        self.config = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, H).requires_grad_(False)
        self.fc = nn.Linear((n_aux + 1) * H, H, bias=False)
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(cfg.vocab_size, dtype=torch.bool))

    def forward(self, aux: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """aux [..., n_aux, H], next_ids [...] -> draft-vocab logits [..., N]."""
        x = torch.cat([aux.flatten(-2).to(self.fc.weight.dtype), self.embed_tokens(next_ids)], dim=-1)
        return self.lm_head(torch.relu(self.fc(x)))


class ToyObjective(nn.Module):
    """KL(teacher || draft) at every position whose next two tokens lie in its document; one step."""

    def __init__(self, drafter, teacher):
        super().__init__()
        self.drafter, self.teacher = drafter, teacher

    def forward(self, batch):
        ids, doc = batch["input_ids"], batch["doc_ids"]
        logp = torch.log_softmax(self.drafter(batch["aux"][:, :-2], ids[:, 1:-1]).float(), -1)   # [B, T-2, N]
        with torch.no_grad():
            t_logp = self.teacher.log_probs(batch["last"][:, 1:-1])                              # [B, T-2, N]
        keep = (doc[:, 2:] == doc[:, :-2]) & batch["loss_mask"][:, 2:].bool()                    # [B, T-2]
        per_pos = (t_logp.exp() * (t_logp - logp)).sum(-1)[keep]
        correct = (logp.argmax(-1) == t_logp.argmax(-1))[keep]
        sums = {"loss_sum_0": per_pos.detach().sum().double(),
                "count_0": torch.tensor(float(per_pos.numel()), dtype=torch.float64),
                "full_correct_0": correct.sum().double(), "prev_correct_0": torch.tensor(float(correct.numel()),
                                                                                          dtype=torch.float64)}
        return per_pos.sum() / max(per_pos.numel(), 1), sums


class ToyProposer:
    """One draft token per round from the aux states of the last position in the target's cache."""

    def __init__(self, drafter, k=1, tree=None, stop=None):
        self.drafter = drafter.eval()
        self.aux_layer_ids = list(drafter.config.aux_layer_ids)
        self.profile = Profile()
        self.max_nodes = 1
        self.reset()

    def reset(self):
        self.last_aux = None

    def observe(self, aux):
        if aux is not None and len(aux):
            self.last_aux = aux[-1]                          # [n_aux, H] of position len(tokens) - 2

    def draft_probe(self, context, k=1):
        """-k auto's and plan's draft cost (infer.speculative.CostProbed): one draft from the last aux."""
        cfg = self.drafter.config
        aux, token = torch.randn(len(cfg.aux_layer_ids), cfg.hidden_size), torch.tensor([0])

        def step():
            with torch.no_grad():
                self.drafter(aux[None], token)
        return step

    def propose(self, tokens, budget, sampling, generator):
        if self.last_aux is None or budget < 1:
            return Draft([], [])
        with torch.no_grad():
            draft_id = int(self.drafter(self.last_aux[None], torch.tensor([tokens[-1]]))[0].argmax())
        return Draft([draft_id + int(self.drafter.d2t[draft_id])], [0])


class Toy(registry.Family[ToyConfig, ToyDrafter]):
    """The toy family: what a family's __init__.py defines, here inside the test."""

    model_type = "toy"
    config_type = ToyConfig

    def new_config(self, target_config, draft_vocab_size, aux_layer_ids, verifier="", run=None) -> ToyConfig:
        return ToyConfig(target_config.hidden_size, target_config.vocab_size, draft_vocab_size, list(aux_layer_ids),
                         verifier)

    def build(self, cfg: ToyConfig) -> ToyDrafter:
        return ToyDrafter(cfg)

    def init_from_target(self, drafter: ToyDrafter, target, d2t, t2d, run=None) -> None:
        drafter.embed_tokens.weight.data.copy_(target.model.get_input_embeddings().weight.detach())
        drafter.d2t.copy_(d2t)
        drafter.t2d.copy_(t2d)

    def objective(self, drafter: ToyDrafter, teacher, run) -> ToyObjective:
        return ToyObjective(drafter, teacher)

    def proposer(self, drafter: ToyDrafter, k=1, tree=None, stop=None) -> ToyProposer:
        return ToyProposer(drafter, k, tree, stop)

    def checkpoint_config(self, cfg: ToyConfig, dtype, speculative_tokens, verifier_architectures) -> dict:
        return {"architectures": ["ToySpeculator"], "speculators_model_type": "toy", "dtype": dtype,
                "specdraft": {"drafter_config": cfg.to_dict()}}

    def parse_config(self, config: dict, where: str) -> ToyConfig:
        return ToyConfig.from_dict(config["specdraft"]["drafter_config"])

    def validate(self, tensors, cfg: ToyConfig, where: str) -> None:
        H, n_aux = cfg.hidden_size, len(cfg.aux_layer_ids)
        shapes = {"embed_tokens.weight": (cfg.vocab_size, H), "fc.weight": (H, (n_aux + 1) * H),
                  "lm_head.weight": (cfg.draft_vocab_size, H), "d2t": (cfg.draft_vocab_size,),
                  "t2d": (cfg.vocab_size,)}
        for name, shape in shapes.items():
            if name not in tensors or tuple(tensors[name].shape) != shape:
                raise SpecdraftError(f"{where}: tensor {name} missing or not {list(shape)}")

    def max_draft(self, cfg: ToyConfig) -> int:
        return 1


class ToyWithTree(Toy):
    """The toy family as if its proposer drafted a tree (Family.tree)."""

    tree = True


TOY = Toy()


@pytest.fixture
def toy_family(monkeypatch):
    monkeypatch.setitem(registry.FAMILIES, "toy", TOY)
    yield TOY


def test_a_toy_family_trains_round_trips_and_generates_losslessly(ws, toy_family, tmp_path):  # noqa: F811
    run = tmp_path / "run"
    summary = train(config(ws, run, family="toy", epochs=1, ttt_steps=1))
    assert summary["val"]["loss"] == summary["val"]["loss"]                       # a number, not NaN
    tensors, cfg, layout = load_checkpoint(run / "best")
    assert (layout, type(cfg), cfg.aux_layer_ids) == ("speculators", ToyConfig, [2, 4, 5])
    drafter = load_drafter(run / "best")
    assert isinstance(drafter, ToyDrafter) and registry.family_of(drafter) is TOY

    target = ws["target"].model
    for prompt in ws["samples"][:3]:
        x = torch.tensor([prompt[:10]])
        ref = target.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False,
                              eos_token_id=None, pad_token_id=0)[0, 10:].tolist()
        out = generate(target, prompt[:10], TOY.proposer(drafter, k=1), max_new_tokens=16, eos_token_ids=set())
        assert out.token_ids == ref and len(out.accepted) > 0


def test_info_lists_the_registered_families(tiny_target, toy_family):
    from typer.testing import CliRunner

    from specdraft.cli import app

    res = CliRunner().invoke(app, ["info", "--model", str(tiny_target), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["drafter_families"] == ["dflash", "dspark", "eagle3", "peagle", "toy"]


def test_a_family_is_a_subclass_with_every_abstract_method_and_the_defaults_for_the_rest():
    """Family is an ABC: a subclass that leaves out a method it must define cannot be made (the error
    names the method), and what it leaves out that has a default takes the default."""
    class Half(registry.Family):
        model_type, config_type = "half", ToyConfig

        def build(self, cfg):
            return ToyDrafter(cfg)

    with pytest.raises(TypeError, match=r"abstract.*new_config"):
        Half()
    assert TOY.fsdp_units(nn.Linear(2, 2)) == [] and registry.Family.max_draft(TOY, None) is None
    assert (TOY.layouts, TOY.draft_vocab_rows, TOY.drafts_in_one_forward, TOY.tree, TOY.title, TOY.shape_flags) == \
        ((), ("lm_head.weight",), False, False, "", ())
    assert dict(TOY.vllm_speculative) == {"method": registry.DEFAULT} and TOY.max_draft(None) == 1


def test_an_unknown_family_is_one_line_listing_the_registered_ones(ws, tmp_path):  # noqa: F811
    with pytest.raises(SpecdraftError, match=r"drafter family 'nope': not registered; choose one of .*eagle3"):
        registry.family("nope")
    with pytest.raises(SpecdraftError, match="drafter family 'nope'"):       # at parse time, before any work
        config(ws, tmp_path / "run", family="nope").check()
    assert not (tmp_path / "run").exists()


def test_a_store_with_four_aux_layers_trains_eagle3_exports_and_generates_losslessly(ws, tmp_path,  # noqa: F811
                                                                                   monkeypatch):
    """The aux layers' number comes from the store: 4 captured layers give an EAGLE-3 drafter whose fc
    reads 4H, whose speculators config names the 4 ids (vLLM sizes fc from them), and which drafts
    losslessly in our loop."""

    import test_train

    from specdraft.formats.checkpoints import export
    from specdraft.model.eagle3.proposer import EagleProposer

    root, target = tmp_path / "four", ws["target"]
    monkeypatch.setattr(test_train, "LAYERS", [1, 2, 4, 5])                  # the store's capture layers
    test_train.write_workspace(root, target, ws["samples"], ws["masks"])
    run = tmp_path / "run"
    train(config(ws, run, store=str(root / "hidden"), vocab=str(root / "vocab.safetensors"), epochs=1))
    drafter = load_drafter(run / "best")
    assert drafter.config.aux_layer_ids == [1, 2, 4, 5] and drafter.fc.weight.shape[1] == 4 * target.hidden_size
    info = export(run, tmp_path / "export", "speculators")
    config_json = json.loads((tmp_path / "export" / "config.json").read_text())
    assert info["layout"] == "speculators" and config_json["eagle_aux_hidden_state_layer_ids"] == [1, 2, 4, 5]
    for prompt in ws["samples"][:3]:
        x = torch.tensor([prompt[:10]])
        ref = target.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)[0, 10:].tolist()
        out = generate(target.model, prompt[:10], EagleProposer(drafter, k=3), max_new_tokens=16, eos_token_ids=set())
        assert out.token_ids == ref


def test_the_toy_family_runs_bench_with_k_auto_and_plan(ws, toy_family, tmp_path):  # noqa: F811
    """bench's default path, -k auto, and plan ask the toy family only what the seam offers: its
    proposer's draft_probe, drafts_in_one_forward and max_draft (1 here), never the EAGLE-3 proposer's
    internals."""
    from specdraft.analysis import plan
    from specdraft.infer.bench import run_bench

    run = tmp_path / "run"
    train(config(ws, run, family="toy", epochs=1, ttt_steps=1))
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"tell me about {w}"}) + "\n" for w in ("cats", "rain")))
    report = run_bench(ws["model"], str(run / "best"), str(prompts), "greedy,toy", 12, None, None, 1, None, (1, 3),
                       None, "cpu", "float32", False)
    choice = report["config"]["k_auto"]
    assert choice["k_auto"] is True and choice["k"] in (0, 1) and len(choice["rates"]) == 1
    assert choice["draft_ms"] > 0 and report["config"]["k"] == choice["k"]
    assert report["methods"]["toy"]["identical_to_greedy"] is True
    planned = plan.run(drafter=str(run / "best"), model=ws["model"], accept="0.6", context=16, rounds=1, k_max=1)
    assert planned["draft_ms"] > 0 and "draft" in planned["measured"] and planned["draft_in_one_forward"] is False
    with pytest.raises(SpecdraftError, match=r"--max-k 2: .* drafts at most 1 tokens per round .*toy family"):
        plan.run(drafter=str(run / "best"), model=ws["model"], accept="0.6", context=16, rounds=1, k_max=2)


def test_tree_drafting_is_a_family_capability(toy_family, monkeypatch):
    """bench's FAMILY-tree methods and generate --tree ask the family (Family.tree), not the name eagle3."""
    from specdraft.infer import methods
    from specdraft.infer.generate import generate_one
    from specdraft.infer.sampling import Sampling

    assert "eagle3-tree" in methods.all_methods() and "toy-tree" not in methods.all_methods()
    assert "dspark-tree" not in methods.all_methods()
    with pytest.raises(SpecdraftError, match=r"--tree: only with --method eagle3 or hybrid and greedy"):
        generate_one("hi", "default", None, "toy", None, None, "4,4,16", Sampling(), 8, (1, 3), "cpu", "float32",
                     False, False)
    monkeypatch.setitem(registry.FAMILIES, "toy", ToyWithTree())
    assert "toy-tree" in methods.all_methods()
    with pytest.raises(SpecdraftError, match=r"--tree: only with --method eagle3 or toy or hybrid and greedy"):
        generate_one("hi", "default", None, "toy", None, None, "4,4,16", Sampling(temperature=0.5), 8, (1, 3),
                     "cpu", "float32", False, False)


def shared_files_naming_a_family(src: Path, family_folders: set[str], names: list[str]) -> list[str]:
    """'file: name' for each source file under `src` outside model/<family>/ and families.py whose
    text names a family (its model type, any case, not inside a longer word: code, strings, help
    and comments alike)."""
    leaks = []
    for path in sorted(p for p in src.rglob("*") if p.is_file() and p.suffix in (".py", ".yaml", ".jsonl")):
        rel = path.relative_to(src)
        if rel == Path("families.py") or rel.parts[:1] == ("model",) and rel.parts[1] in family_folders:
            continue
        text = path.read_text().lower()
        leaks += [f"{rel}: {name}" for name in names if re.search(rf"(?<![a-z]){re.escape(name)}", text)]
    return leaks


def test_a_new_family_touches_its_folder_and_one_registry_line(toy_family, tmp_path):
    """The seam, measured (issue 34). A family is its folder under model/ (config, module, objective,
    proposer, checkpoint, and an __init__ that registers its Family) plus one line in
    families.BUILTIN; the toy family is the same with its folder being this test. So no other source
    file names a family: train/, infer/, formats/, analysis/, the CLI, the pipeline, the recipes and
    model/common/ ask the registry (Family's methods and attributes, families.DEFAULT). A leak fails here by name."""
    src = Path(registry.__file__).parent
    folders = {module.rsplit(".", 1)[1] for module in registry.BUILTIN}
    for module in registry.BUILTIN:                      # each registry line is one package under model/
        assert module.startswith("specdraft.model.") and (src / "model" / module.rsplit(".", 1)[1]).is_dir()
    assert all(registry.family(n).model_type in folders or n == "toy" for n in registry.names())
    assert "toy" in registry.names()
    assert shared_files_naming_a_family(src, folders, registry.names()) == []

    # the check can fail: a shared file that names a family (here a copy of the tree with one leak) is found
    copy = tmp_path / "specdraft"
    for path in src.rglob("*.py"):
        (copy / path.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
        (copy / path.relative_to(src)).write_text(path.read_text())
    (copy / "pipeline.py").write_text((copy / "pipeline.py").read_text() + '\nMETHOD = "dflash"\n')
    (copy / "infer" / "bench.py").write_text((copy / "infer" / "bench.py").read_text() + "\n# the Toy family\n")
    assert shared_files_naming_a_family(copy, folders, registry.names()) == ["infer/bench.py: toy",
                                                                             "pipeline.py: dflash"]


def test_the_recipe_and_the_readers_of_bench_json_use_the_runs_family(toy_family, tmp_path, monkeypatch):
    """The recipe benches the family its training settings name (its tree only where the family
    drafts one); the report, the card, plan's rates and the recipe's summary read that family's
    chain from bench.json (`config.family`), and older files without it their first drafter method."""
    from specdraft.infer.costmodel import cond_rates_from
    from specdraft.metrics import drafter_method
    from specdraft.pipeline import bench_methods, load_recipe, natural_methods

    path = tmp_path / "r.yaml"
    path.write_text("family: toy\nepochs: 1\n"
                    "recipe: {samples: 6, max_new_tokens: 12, regen_batch: 3, draft_vocab: 64}\n")
    recipe = load_recipe(path)
    assert recipe.family == "toy"
    assert bench_methods(recipe.family, tree=True) == ["greedy", "plain", "ngram", "toy"]  # no toy tree
    assert natural_methods(recipe.family, tree=True) == ["plain", "ngram", "toy", "hybrid"]         # nor hybrid-tree
    monkeypatch.setitem(registry.FAMILIES, "toy", ToyWithTree())
    assert bench_methods("toy", tree=True)[-1] == "toy-tree" and "toy-tree" not in bench_methods("toy", tree=False)
    assert natural_methods("toy", tree=True) == ["plain", "ngram", "toy", "hybrid", "hybrid-tree"]
    assert natural_methods("toy", tree=False) == ["plain", "ngram", "toy", "hybrid"]

    chain = {"accept_len": 1.5, "per_position_accept": [0.5]}
    other = {"accept_len": 2.5, "per_position_accept": [0.9, 0.6]}
    bench = {"methods": {"greedy": {"accept_len": 1.0}, "eagle3": other, "toy": chain, "hybrid": other},
             "config": {"family": "toy"}}
    assert drafter_method(bench) == ("toy", chain)
    assert cond_rates_from(bench) == [0.5]
    del bench["config"]["family"]                                    # a bench.json written before config.family
    assert drafter_method(bench) == ("eagle3", other)
    assert drafter_method({"methods": {"greedy": {}, "hybrid": other}}) == ("", {})
