"""The fast configuration's keys (model.attn_implementation, model.compile): validation, what enters the
fingerprint, and a checkpoint format that does not depend on compilation. The GPU check's fast mode: its
config and its MFU arithmetic."""

from __future__ import annotations

import pytest
import torch

from gpu import check, fast, results
from trainer.config import ConfigError, config_from_dict, fingerprint_fields

BASE = {"name": "t", "model": {"path": "/m"}, "data": {"uri": "/c.txt"}, "checkpoint": {"uri": "/ck"}}


def _cfg(**model):
    return config_from_dict({**BASE, "model": {"path": "/m", **model}})


def test_attention_and_compile_keys_are_validated_by_name():
    assert _cfg().model.attn_implementation == "eager" and _cfg().model.compile is False
    with pytest.raises(ConfigError, match="model.attn_implementation"):
        _cfg(attn_implementation="flash")
    with pytest.raises(ConfigError, match="model.compile"):
        _cfg(compile="yes")


def test_the_new_keys_enter_the_fingerprint_only_when_set():
    default = _cfg()
    # A run started before these keys existed keeps its run_id: the defaults are not hashed.
    assert "attn_implementation" not in fingerprint_fields(default)["model"]
    assert "compile" not in fingerprint_fields(default)["model"]
    assert _cfg(attn_implementation="eager").fingerprint == default.fingerprint
    sdpa, compiled = _cfg(attn_implementation="sdpa"), _cfg(compile=True)
    assert len({default.fingerprint, sdpa.fingerprint, compiled.fingerprint}) == 3


def test_compiling_keeps_the_state_dict_keys(tiny_model):
    from transformers import AutoModelForCausalLM

    from trainer.model import compile_layers

    plain = AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa")
    keys = list(plain.state_dict())
    compiled = compile_layers(AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="sdpa"))
    assert list(compiled.state_dict()) == keys  # torch.compile(model) would prefix every key with _orig_mod.
    assert not any("_orig_mod" in k for k in compiled.state_dict())
    # and what a compiled run saves loads into an uncompiled one, tensor for tensor
    plain.load_state_dict(compiled.state_dict())
    assert all(
        torch.equal(a, b)
        for a, b in zip(plain.state_dict().values(), compiled.state_dict().values(), strict=True)
    )


def test_the_fast_drill_config_is_a_valid_trainer_config_judged_by_tier_2(tmp_path):
    from steps.compare import resolve_tier

    raw = fast.fast_config(check.drill_config(tmp_path / "m", tmp_path / "c.txt", seq_len=2048, grad_accum=1))
    cfg = config_from_dict({**raw, "checkpoint": {**raw["checkpoint"], "uri": "file:///x"}})
    assert (cfg.model.attn_implementation, cfg.model.compile, cfg.deterministic) == ("sdpa", True, False)
    assert cfg.data.seq_len == 2048
    assert resolve_tier("auto", {"device": "cuda", "config": cfg.to_dict()}) == 2
    assert (
        resolve_tier("auto", {"device": "cpu", "config": cfg.to_dict()}) == 2
    )  # nondeterministic on a CPU too
    det = config_from_dict({**BASE})
    assert resolve_tier("auto", {"device": "cpu", "config": det.to_dict()}) == 1
    assert resolve_tier("auto", {"device": "cuda", "config": det.to_dict()}) == 2


def test_mfu_counts_6n_plus_attention_against_the_dense_bf16_peak():
    n, layers, hidden, seq = 494_032_768, 24, 896, 2048
    per_token = 6 * n + 12 * layers * hidden * seq
    assert fast.flops_per_token(n, layers, hidden, seq) == per_token
    peak = fast.peak_flops("NVIDIA H200")
    assert peak == 989.4e12 and fast.peak_flops("Tesla T4") is None
    tps = 0.35 * peak / per_token  # the tokens/s that is exactly 35% MFU
    assert fast.mfu(tps, n, layers, hidden, seq, peak) == pytest.approx(0.35, rel=1e-12)
    assert (
        fast.mfu(None, n, layers, hidden, seq, peak) is None
        and fast.mfu(tps, n, layers, hidden, seq, None) is None
    )


def test_the_report_shows_the_fast_mode_and_its_tier_2_verdict():
    drill = {
        "total_steps": 40,
        "evictions": 1,
        "seq_len": 2048,
        "tokens_per_step": 8192,
        "tier": 2,
        "equivalent": True,
        "passed": True,
        "floor": 2e-3,
        "max_abs_diff": 1.5e-3,
        "diff_over_floor": 0.75,
        "floor_l2": 0.02,
        "l2_diff": 0.015,
        "tensors": 10,
        "equal_tensors": 0,
        "floor_differing": 10,
        "preemptions": [],
    }
    md = results.markdown(
        {
            "passed": True,
            "device": {"name": "NVIDIA H200", "count": 1},
            "phases": {},
            "solo_fast": {
                "seq_len": 2048,
                "tokens_per_step": 8192,
                "tokens_per_s": 100000.0,
                "mfu": 0.381,
                "peak_flops": 989.4e12,
            },
            "drill_fast": drill,
        }
    )
    assert "MFU 38.1% of 989.4 TFLOP/s" in md
    assert "| fast drill | 40 steps, 1 evictions, seq 2048" in md
    assert "0.75x the floor" in md and "equivalence (tier 2) | within the floor" in md


def test_modes_and_the_fast_geometry():
    import argparse

    assert check.modes("both") == ("deterministic", "fast") and check.modes("fast") == ("fast",)
    args = argparse.Namespace(
        tiny=False,
        seq_len=512,
        batch_size=4,
        grad_accum=2,
        steps=100,
        evictions=2,
        every_steps=50,
        **{f"fast_{k}": v for k, v in fast.FAST_DEFAULTS.items()},
    )
    assert check.geometry(args, "deterministic")["seq_len"] == 512
    assert check.geometry(args, "fast") == fast.FAST_DEFAULTS
