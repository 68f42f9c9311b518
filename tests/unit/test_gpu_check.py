"""gpu/ (check.py, model.py, results.py), its pure logic on the CPU: the 0.5B shape, the model it builds, the
metrics it reports, phase timeouts, and the exit code when there is no CUDA device."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest
import torch

from gpu import check, model, results
from tests.helpers import CORPUS


def test_the_shape_is_qwen2_5_0_5b_and_counts_494m_parameters():
    config = model.qwen_config()
    want = dict(
        hidden_size=896,
        num_hidden_layers=24,
        num_attention_heads=14,
        num_key_value_heads=2,
        intermediate_size=4864,
        vocab_size=151936,
        tie_word_embeddings=True,
    )
    assert {k: getattr(config, k) for k in want} == want
    rope = getattr(config, "rope_parameters", None) or {"rope_theta": config.rope_theta}
    assert rope["rope_theta"] == 1e6 and config.rms_norm_eps == 1e-6 and config.hidden_act == "silu"
    assert model.parameter_count(config) == model.QWEN25_05B_PARAMETERS == 494_032_768


def test_the_built_model_keeps_every_embedding_row_and_its_tokenizer_stays_below_them(tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    from trainer.data import pack, read_documents

    docs = read_documents(str(CORPUS))
    path = model.build_model(tmp_path / "m", docs, dtype="bfloat16", tiny=True, vocab_size=151936)
    config = AutoConfig.from_pretrained(path)
    assert config.vocab_size == 151936 and config.tie_word_embeddings
    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) <= 512 and config.eos_token_id == tok.eos_token_id
    ids = pack(docs, tok, 64)
    assert int(ids.max()) < len(tok)
    lm = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    assert lm.get_input_embeddings().weight.shape[0] == 151936
    assert lm.lm_head.weight.data_ptr() == lm.get_input_embeddings().weight.data_ptr()
    assert model.build_model(tmp_path / "m", docs) == path  # built once


def test_the_drill_config_is_a_valid_trainer_config(tmp_path):
    from trainer.config import load_config

    raw = check.drill_config(tmp_path / "model", tmp_path / "corpus.txt", total_steps=100, every_steps=50)
    path = check.write_drill_config(tmp_path / "drill.yaml", raw)
    cfg = load_config(
        path,
        [
            "checkpoint.uri=file:///x/reference",
            "total_steps=100",
            "seed=0",
            "model.dropout=0.1",
            "checkpoint.every_steps=50",
        ],
    )  # what the drill sets per role
    assert cfg.model.path == str(tmp_path / "model") and cfg.model.dtype == "bfloat16" and cfg.deterministic
    assert (cfg.data.seq_len, cfg.data.batch_size, cfg.data.grad_accum) == (512, 4, 2)
    assert cfg.checkpoint.keep_last == 1


def test_a_bad_drill_config_is_refused_before_the_drill():
    from trainer.config import ConfigError

    raw = check.drill_config("/m", "/c.txt")
    raw["data"]["seq_len"] = 1
    with pytest.raises(ConfigError, match="data.seq_len"):
        check.write_drill_config(Path("/nonexistent/never-written.yaml"), raw)


def _rec(event, step, attempt=1, **kw):
    return {"event": event, "step": step, "attempt": attempt, "time": 1000.0 + step, **kw}


def test_drill_metrics_headroom_flush_and_throughput():
    trial = [_rec("step", s, tokens_per_s=100.0 * s) for s in range(1, 6)]
    trial += [
        _rec("checkpoint", 5, reason="preempt", save_ms=2500.0, bytes=3_000_000_000),
        _rec("preempt", 5, save_ms=2500.0, grace_left_s=117.0, outcome="saved"),
    ]
    trial += [_rec("resume", 5, attempt=2, from_step=5), _rec("step", 6, attempt=2, tokens_per_s=1.0)]
    trial[-2]["time"] = 1020.0
    reference = [_rec("step", s, tokens_per_s=1000.0) for s in range(1, 8)]
    reference.append(_rec("checkpoint", 7, reason="final", save_ms=1500.0, bytes=3_000_000_000))
    report = {
        "tier": 2,
        "equivalent": True,
        "passed": True,
        "floor": 1e-3,
        "max_abs_diff": 5e-4,
        "tensors": 10,
        "equal_tensors": 4,
        "steps": {"total": 6},
    }
    m = results.drill_metrics(report, {"trial": trial, "reference": reference}, grace_s=120, warmup_steps=3)
    (p,) = m["preemptions"]
    assert p["sigterm_to_commit_s"] == 3.0 and p["headroom_15s"] == 12.0 and p["headroom_120s"] == 117.0
    assert m["headroom_s"] == {"15": 12.0, "120": 117.0}
    assert m["flush_ms"]["all"] == {"n": 2, "median": 2000.0, "min": 1500.0, "max": 2500.0}
    assert m["flush_ms"]["preempt"]["max"] == 2500.0
    assert m["tokens_per_s"]["reference"]["median"] == 1000.0 and m["tokens_per_s"]["reference"]["n"] == 4
    assert m["tokens_per_s"]["trial"]["n"] == 2  # warm-up steps of each attempt left out
    assert m["checkpoint_gb"] == 3.0 and m["restart_s"] == [15.0]
    assert (m["floor"], m["max_abs_diff"], m["equivalent"]) == (1e-3, 5e-4, True)
    md = results.markdown(
        {
            "passed": True,
            "device": {"name": "H200", "count": 1},
            "drill": {**m, "total_steps": 6},
            "phases": {},
        }
    )
    assert "headroom 12.0 s of 15 s" in md and "headroom 117.0 s of 120 s" in md and "within the floor" in md
    assert "3.0 GB" in md


def test_junit_counts(tmp_path):
    (tmp_path / "j.xml").write_text(
        '<testsuites><testsuite name="pytest" errors="1" failures="2" skipped="3" '
        'tests="10" time="1"/></testsuites>'
    )
    assert results.junit_counts(tmp_path / "j.xml") == {
        "tests": 10,
        "passed": 4,
        "failed": 2,
        "errors": 1,
        "skipped": 3,
    }


def test_a_phase_that_overruns_is_stopped(tmp_path):
    t0 = time.monotonic()
    ph = check.run_phase(
        check.Phase("slow"),
        [sys.executable, "-c", "import time; time.sleep(60)"],
        1,
        tmp_path / "slow.log",
        echo=False,
    )
    assert ph.timed_out and not ph.ok and "timed out" in ph.error
    assert time.monotonic() - t0 < 30


def test_without_cuda_it_says_so_and_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert check.main(["--out", str(tmp_path / "o")]) == check.EXIT_NO_CUDA == 2
    assert check.NO_CUDA in capsys.readouterr().out
    assert not (tmp_path / "o").exists()


def test_it_never_clears_a_folder_it_did_not_write(tmp_path, monkeypatch):
    monkeypatch.setattr(check, "device_info", lambda: pytest.fail("must refuse before touching the device"))
    (tmp_path / "precious.txt").write_text("x")
    with pytest.raises(SystemExit, match="something else"):
        check.main(["--out", str(tmp_path), "--allow-cpu"])
    assert (tmp_path / "precious.txt").exists()
