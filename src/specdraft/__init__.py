"""specdraft: train, adapt, evaluate and ship EAGLE-3 speculative-decoding drafters."""

__version__ = "0.1.0"
