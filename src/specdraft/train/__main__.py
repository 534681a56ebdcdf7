"""`python -m specdraft.train [--config run.yaml] [--lr 3e-4 ...]`, also under torchrun.

Options are generated from RunConfig (flags override the yaml). Under torchrun (RANK set),
train/distributed.py provides the Runtime.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from specdraft.errors import SpecdraftError
from specdraft.train.config import RunConfig, resolve_config


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdraft.train", description="Train an EAGLE-3 drafter (TTT).")
    p.add_argument("--config", default=None, help="run.yaml; flags override it")
    for f in dataclasses.fields(RunConfig):
        flag = "--" + f.name.replace("_", "-")
        if isinstance(f.default, bool):
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None,
                           help=f"(default {f.default})")
        else:
            kind = type(f.default) if f.default is not None else str
            p.add_argument(flag, dest=f.name, type=kind, default=None, help=f"(default {f.default})")
    # online mode and the multi-process strategy (train-scale: train/online.py, train/distributed.py)
    p.add_argument("--online", action="store_true", help="compute hidden states with --model in the loop")
    p.add_argument("--data", default=None, help="prepared data (WS/data) for --online")
    p.add_argument("--parallel", default="ddp", choices=["ddp", "fsdp"], help="under torchrun: DDP or FSDP2")
    p.add_argument("--engine", default="auto", help="with --online: hf, vllm or auto")
    p.add_argument("--tensor-parallel-size", type=int, default=1, help="with --online --engine vllm")
    p.add_argument("--engine-args", default=None, help="with --online --engine vllm: JSON for vllm.LLM")
    return p


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    args = vars(parser().parse_args(argv))
    config_file = args.pop("config")
    online, data, parallel = args.pop("online"), args.pop("data"), args.pop("parallel")
    engine = (args.pop("engine"), args.pop("tensor_parallel_size"), args.pop("engine_args"))
    overrides = {k: v for k, v in args.items() if v is not None}
    try:
        cfg = resolve_config(config_file, **overrides)
        from specdraft.data.vllm_engine import engine_options
        from specdraft.train.loop import Runtime, train
        from specdraft.train.online import online_setup

        # (cfg, runtime) -> dict(data=..., target=...)
        setup = online_setup(data, engine_options(*engine)) if online else None
        if "RANK" in os.environ and int(os.environ.get("WORLD_SIZE", "1")) > 1:
            from specdraft.train import distributed  # written by train-scale

            distributed.run(cfg, strategy=parallel, setup=setup)
        else:
            train(cfg, **(setup(cfg, Runtime()) if setup else {}))
    except SpecdraftError as e:
        Console(stderr=True).print(f"[red]error:[/] {e}", highlight=False, soft_wrap=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
