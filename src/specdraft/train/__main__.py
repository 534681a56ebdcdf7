"""`python -m specdraft.train [--config run.yaml] [--lr 3e-4 ...]`, also under torchrun: the same
command as `specdraft train` (train/command.py), options generated from RunConfig."""

import sys

from specdraft.train.command import main

if __name__ == "__main__":
    sys.exit(main())
