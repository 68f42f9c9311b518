"""A resume does not read the weights its checkpoint replaces, and a fresh start still does.

The trainer's build and resume run in this process (world size 1); the runs that make the checkpoints
are real processes. Controls: the model a fresh start builds equals `from_pretrained`'s, and the model
a resume builds empty differs from it until the checkpoint is loaded, so each check can fail.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.helpers import CORPUS, TINY_YAML, equal_count, run, run_and_sigterm, step_dir, tensors, trainer_cmd
from trainer.checkpoint import load_flat
from trainer.config import load_config
from trainer.loop import Trainer
from trainer.preemption import Preemption

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
SETS = ("model.dropout=0.1", "total_steps=12", "checkpoint.every_steps=4")


def built(tiny_model, ckpt) -> Trainer:
    cfg = load_config(
        str(TINY_YAML),
        [
            f"model.path={tiny_model}",
            f"checkpoint.uri={ckpt}",
            f"data.uri={CORPUS}",
            "notice.enabled=false",
            *SETS,
        ],
    )
    t = Trainer(cfg, Preemption())
    t.build()
    return t


def pretrained(tiny_model) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model, attn_implementation="eager").state_dict()


@pytest.fixture
def process_group():
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


def test_a_fresh_start_reads_the_pretrained_weights(tiny_model, tmp_path, process_group):
    t = built(tiny_model, tmp_path / "ck")
    t.resume()
    assert not t.empty_model and t.times.keys() >= {"startup_s", "init_s", "build_s", "listing_s"}
    want = pretrained(tiny_model)
    got = t.model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)


def test_a_resume_builds_the_model_empty_and_loads_it_from_the_checkpoint(
    tiny_model, tmp_path, process_group
):
    ckpt = tmp_path / "ck"
    rc, _, err = run_and_sigterm(trainer_cmd(tiny_model, ckpt, *SETS), at_step=6)
    assert rc == 75, err
    t = built(tiny_model, ckpt)
    assert t.empty_model
    want = pretrained(tiny_model)
    before = t.model.state_dict()
    # Control: built empty, the model is not the pretrained one (it would be, had the build read it).
    assert not all(torch.equal(before[k], want[k]) for k in want)
    t.resume()
    saved = load_flat(t.last_checkpoint)
    got = t.model.state_dict()
    assert t.step == 6 and all(torch.equal(got[k], saved[f"model.{k}"]) for k in got)


def test_every_checkpoint_refused_falls_back_to_the_pretrained_weights(tiny_model, tmp_path):
    """Built empty (a checkpoint exists), but it fails its sha256: the run must start as a fresh one
    would, pretrained weights and seed included, and end bit-identical to an uninterrupted run."""
    ref = tmp_path / "ref"
    rc, _, err = run(trainer_cmd(tiny_model, ref, *SETS))
    assert rc == 0, err
    ckpt = tmp_path / "trial"
    rc, _, err = run_and_sigterm(trainer_cmd(tiny_model, ckpt, *SETS, "checkpoint.keep_last=1"), at_step=2)
    assert rc == 75, err
    shard = max(step_dir(ckpt, 2).glob("__0_*.distcp"), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    rc, recs, err = run(trainer_cmd(tiny_model, ckpt, *SETS, "checkpoint.keep_last=1"))
    assert rc == 0, err
    assert [r["step"] for r in recs if r["event"] == "checkpoint_refused"] == [2]
    resume = [r for r in recs if r["event"] == "resume"][0]
    assert resume.get("fresh") and "load_verify_s" in resume["phases"]
    (start,) = [r for r in recs if r["event"] == "start"]  # the exact start, before the first step
    assert len(start["weights_sha"]) == len(start["optim_sha"]) == 64
    assert "reading the pretrained weights" in err
    first = [r for r in recs if r["event"] == "step"][0]
    assert first["step"] == 1 and first["since_process_start_s"] > 0
    equal, total = equal_count(tensors(ref, 12), tensors(ckpt, 12))
    assert equal == total and total > 100


def test_the_resume_record_times_each_phase(tiny_model, tmp_path):
    ckpt = tmp_path / "ck"
    rc, _, err = run_and_sigterm(trainer_cmd(tiny_model, ckpt, *SETS), at_step=5)
    assert rc == 75, err
    shutil.copytree(ckpt, tmp_path / "copy")
    rc, recs, err = run(trainer_cmd(tiny_model, tmp_path / "copy", *SETS))
    assert rc == 0, err
    resume = [r for r in recs if r["event"] == "resume"][0]
    assert resume["from_step"] == 5
    phases = resume["phases"]
    parts = {
        "init": ("group", "store", "claim"),
        "build": ("weights", "read_corpus", "corpus", "model", "optimizer"),
    }
    loaded = {
        "prefetch_read_s",
        "prefetch_wait_s",
        "prefetch_used",
        "items",
        "items_direct",
        "items_buffered",
        "items_torch_load",
        "copies_per_item",
    }
    assert (
        set(phases)
        == {
            "startup_s",
            "init_s",
            "build_s",
            "listing_s",
            "manifest_s",
            "load_verify_s",
            "restore_s",
            "collector_frozen",
        }
        | {f"{p}_{part}_s" for p, ps in parts.items() for part in ps}
        | loaded
    ), json.dumps(phases)
    assert all(v >= 0 for v in phases.values())
    # One rank: the checkpoint was read on a thread beside the build, each item straight into its tensor.
    assert phases["prefetch_used"] == 1 and phases["items"] == phases["items_direct"] > 0, json.dumps(phases)
    assert phases["copies_per_item"] == 1.0
    # The start imported with the cyclic collector paused and froze what it built (trainer/collector.py).
    assert phases["collector_frozen"] > 100_000, json.dumps(phases)
    for whole, ps in parts.items():  # the parts are inside their whole (each rounded to the millisecond)
        assert sum(phases[f"{whole}_{p}_s"] for p in ps) <= phases[f"{whole}_s"] + 0.001 * len(ps), (
            json.dumps(phases)
        )
    assert "built empty for the resume" in err
    # The first start tokenized the corpus and kept it packed; the restart read it back (trainer/packed.py).
    assert resume["corpus"]["packed"] == "cache"


def test_deterministic_mode_is_set_without_importing_inductor_unless_compiled():
    import subprocess
    import sys

    probe = (
        "import sys, torch; from trainer.loop import deterministic_algorithms; "
        "deterministic_algorithms(compiled={}); "
        "print(torch.are_deterministic_algorithms_enabled(), 'torch._inductor' in sys.modules)"
    )
    for compiled, expected in (
        (False, "True False"),
        (True, "True True"),
    ):  # True: the full call, the control
        out = subprocess.run(
            [sys.executable, "-c", probe.format(compiled)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert out.stdout.strip() == expected, out.stderr[-2000:]


def test_unfilled_skips_the_nan_fill_only_inside_and_puts_it_back():
    import torch

    from trainer.empty import unfilled

    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert torch.empty(4).isnan().all()  # deterministic mode fills: the cost unfilled avoids
        with unfilled():
            assert torch.utils.deterministic.fill_uninitialized_memory is False
        assert torch.utils.deterministic.fill_uninitialized_memory is True
        assert torch.empty(4).isnan().all()
    finally:
        torch.use_deterministic_algorithms(before)
