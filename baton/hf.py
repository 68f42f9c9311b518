"""The HF Trainer contract (trainer/hf.py) under baton's own name: see trainer/hf.py's docstring."""

from trainer.hf import BatonCallback, baton_args

__all__ = ["BatonCallback", "baton_args"]
