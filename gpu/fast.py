"""The GPU check's fast mode: the configuration people fine-tune with, and how fast it runs.

The deterministic drill certifies eager attention and deterministic kernels (Tier 1 on one GPU). The fast
mode certifies what a fine-tune actually runs: `sdpa` attention, `torch.compile` of each decoder layer,
`deterministic: false`, bf16, and a fine-tune's sequence length. Its kernels are not bit-reproducible, so
its drill is judged by Tier 2 (steps/lib/judge.py): the trial against the floor that the reference and its
replay measure.

MFU: achieved model FLOP/s over the chip's dense bf16 peak. FLOPs per token are the usual
6 * parameters (forward and backward of every matmul, the LM head included) plus attention's
12 * layers * hidden * seq (QK^T and AV, forward and backward; PaLM's appendix B accounting). The
embedding lookup is not a matmul, so with tied embeddings the LM head's matmul is counted once through
the shared weight, as it runs once.
"""

from __future__ import annotations

from typing import Any

# NVIDIA H200 SXM: 989.4 TFLOP/s dense bf16 (1,979 with 2:4 sparsity), as published for the H100 SXM it
# shares its compute with.
PEAK_BF16_FLOPS = {"H200": 989.4e12, "H100": 989.4e12}

FAST_MODEL = {"attn_implementation": "sdpa", "compile": True}
FAST_DEFAULTS = {
    "seq_len": 2048,
    "batch_size": 4,
    "grad_accum": 1,
    "steps": 40,
    "evictions": 1,
    "every_steps": 20,
}


def fast_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A drill config (gpu/check.py's drill_config) turned to the fast mode."""
    out = {**raw, "deterministic": False, "name": f"{raw['name']}-fast"}
    out["model"] = {**raw["model"], **FAST_MODEL}
    return out


def flops_per_token(parameters: int, layers: int, hidden: int, seq_len: int) -> float:
    return 6.0 * parameters + 12.0 * layers * hidden * seq_len


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a known chip, by name; None for one this table does not know."""
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in device_name:
            return flops
    return None


def mfu(
    tokens_per_s: float | None, parameters: int, layers: int, hidden: int, seq_len: int, peak: float | None
) -> float | None:
    if not tokens_per_s or not peak:
        return None
    return tokens_per_s * flops_per_token(parameters, layers, hidden, seq_len) / peak
