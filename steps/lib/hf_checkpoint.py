"""`compare` on Hugging Face Trainer roots: the three final `checkpoint-N/` folders, read safely
(trainer/checkpoint/hf_read.py) and judged by steps/lib/judge.py, as DCP checkpoints are."""

from __future__ import annotations

from typing import Any

import torch

from trainer.checkpoint import (  # noqa: F401 - the reading API, where tests and tools look for it
    committed_checkpoints,
    final_hf_checkpoint,
    is_hf_root,
    load_hf_checkpoint,
    numpy_safe_globals,
)


def compare_flat(a: dict[str, Any], b: dict[str, Any]) -> tuple[float, list[str]]:
    """(largest |a-b| over differing floating tensors, names that differ): torch.equal for tensors,
    == for the rest; a name on one side only differs."""
    worst, differing = 0.0, []
    for k in sorted(a.keys() | b.keys()):
        if k not in a or k not in b:
            differing.append(k)
            worst = float("inf")
            continue
        x, y = a[k], b[k]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                differing.append(k)
                worst = float("inf")
            elif not torch.equal(x, y):
                differing.append(k)
                if x.is_floating_point() or x.is_complex():
                    worst = max(worst, (x.double() - y.double()).abs().max().item())
                else:
                    worst = float("inf")
        elif x != y:
            differing.append(k)
            worst = float("inf")
    return worst, differing


def compare_hf(
    reference: str, replay: str, trial: str, total_steps: int | None = None, tier: str = "auto"
) -> dict[str, Any]:
    """`compare` for three roots of HF checkpoints: every entry judged as DCP checkpoints are
    (steps/lib/judge.py; Tier 2 leaves out the fields kernels change, `EXCLUDED_AT_TIER_2`)."""
    from steps.compare import compare

    return compare(reference, replay, trial, total_steps, tier)
