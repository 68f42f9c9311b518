"""The HF Trainer callback (trainer/hf.py) and the example job (examples/hf_trainer/train.py).

Real processes and real SIGTERMs: a signal between the micro-batches of a gradient-accumulation step
and one at a step boundary, each ending in exit 75 with that step committed; the resumed run's final
checkpoint equal to an uninterrupted run's on every tensor; and the negative control (a committed
checkpoint without its RNG state) that the same comparison catches. Then the store alone: numeric
order, torn and altered checkpoints passed over, the S3 mirror with `_COMMIT` last, retention.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import CORPUS, PY, REPO, base_env, run_and_sigterm
from trainer.records import read_records

HF_SCRIPT = REPO / "examples" / "hf_trainer" / "train.py"
HF_YAML = REPO / "examples" / "hf_trainer" / "config.yaml"
TOTAL = 12


def hf_cmd(model, bucket, *sets):
    cmd = [PY, str(HF_SCRIPT), "--config", str(HF_YAML)]
    for s in (
        f"model.path={model}",
        f"checkpoint.uri={bucket}",
        f"data.uri={CORPUS}",
        f"total_steps={TOTAL}",
        "checkpoint.every_steps=5",
        "model.dropout=0.1",
        *sets,
    ):
        cmd += ["--set", s]
    return cmd


def run(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env or base_env(), cwd=REPO, timeout=300)
    return p.returncode, read_records(p.stdout), p.stderr


def steps_of(recs):
    return [r["step"] for r in recs if r["event"] == "step"]


def final(bucket):
    from steps.lib.hf_checkpoint import final_hf_checkpoint, load_hf_checkpoint

    url, manifest = final_hf_checkpoint(bucket)
    return manifest["step"], load_hf_checkpoint(url)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model):
    bucket = f"file://{tmp_path_factory.mktemp('hf-ref')}/bucket"
    rc, recs, err = run(hf_cmd(tiny_model, bucket))
    assert rc == 0, err[-3000:]
    assert steps_of(recs) == list(range(1, TOTAL + 1)) and recs[-1]["event"] == "done"
    return bucket


def test_sigterm_mid_accumulation_then_at_a_boundary_exits_75_and_resume_is_bit_identical(
    tmp_path, tiny_model, reference
):
    from steps.lib.hf_checkpoint import compare_flat
    from steps.verify import verify

    bucket = f"file://{tmp_path}/bucket"
    everything = []
    # 1. The signal lands after the first of step 4's two micro-batches: the step completes, then saves.
    rc, recs, err = run_and_sigterm(
        hf_cmd(tiny_model, bucket), at_step=3, delay_s=0.5, env=base_env(BATON_PAUSE_AFTER_STEP="3:1")
    )
    assert rc == 75, err[-3000:]
    assert "1 micro-batch(es) into the next" in err
    (pre,) = [r for r in recs if r["event"] == "preempt"]
    assert (pre["step"], pre["signal"], pre["outcome"], pre["exit"]) == (4, "SIGTERM", "saved", 75)
    assert pre["during"] == "step"  # mid-step (between micro-batches), as baton's own trainer records it
    assert steps_of(recs) == [1, 2, 3, 4]
    ckpts = [r for r in recs if r["event"] == "checkpoint"]
    assert [(c["step"], c["reason"]) for c in ckpts] == [(4, "preempt")]
    assert recs.index(ckpts[0]) < recs.index(pre)  # the record comes after the commit
    assert (tmp_path / "bucket" / "checkpoint-4" / "_COMMIT").is_file()
    everything += recs
    planted = tmp_path / "planted"
    shutil.copytree(tmp_path / "bucket", planted)

    # 2. At a step boundary, after a periodic save at 5: saves 7, exits 75.
    rc, recs, err = run_and_sigterm(hf_cmd(tiny_model, bucket), at_step=7)
    assert rc == 75, err[-3000:]
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [4]
    assert steps_of(recs) == [5, 6, 7]
    assert [r["step"] for r in recs if r["event"] == "preempt"] == [7]
    everything += recs

    # 3. To the end: exit 0, done, and the final checkpoint equals the uninterrupted run's.
    rc, recs, err = run(hf_cmd(tiny_model, bucket))
    assert rc == 0, err[-3000:]
    assert steps_of(recs) == list(range(8, TOTAL + 1)) and recs[-1]["event"] == "done"
    everything += recs
    v = verify(everything, TOTAL)
    assert v["passed"] and v["replayed"] == 0 and v["resumed_from"] == [4, 7], v
    ref_step, (ref, parts) = final(reference)
    tri_step, (tri, _) = final(bucket)
    assert ref_step == tri_step == TOTAL
    assert {"model", "optimizer", "scheduler", "rng", "trainer_state"} <= parts.keys()
    worst, differing = compare_flat(ref, tri)
    assert differing == [] and worst == 0.0
    assert sum(isinstance(v, torch.Tensor) for v in tri.values()) > 100

    # Negative control: the same checkpoint-4, committed without its RNG state. The resume that
    # follows is not exact, and the same comparison says so.
    folder = planted / "checkpoint-4"
    (folder / "rng_state.pth").unlink()
    manifest = json.loads((folder / "_COMMIT").read_text())
    del manifest["files"]["rng_state.pth"]
    (folder / "_COMMIT").write_text(json.dumps(manifest))
    rc, recs, err = run(hf_cmd(tiny_model, f"file://{planted}"))
    assert rc == 0, err[-3000:]
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [4]
    _, (bad, _) = final(f"file://{planted}")
    worst, differing = compare_flat(ref, bad)
    assert sum(k.startswith("model.") for k in differing) > 10 and worst > 0


def test_a_resume_before_an_epochs_short_last_step_is_bit_identical(tmp_path, tiny_model):
    """167 packed samples in batches of 8 make 21 micro-batches an epoch: with 2 of them a step, the epoch's
    last step (11) has one. Resumed from step 10, that step's one fetch collates nothing ahead, so the
    Trainer's own RNG restore follows it; the next epoch's first batch must not restore step 10's RNG
    again (it did: every nodes=2 HF drill evicted just before an epoch's end failed "the RNG differed").
    Its control is the uninterrupted run itself: the final checkpoints are compared on every tensor."""
    from steps.lib.hf_checkpoint import compare_flat

    sets = ("data.batch_size=8", "total_steps=14", "checkpoint.every_steps=0")
    ref_bucket, bucket = f"file://{tmp_path}/ref", f"file://{tmp_path}/bucket"
    rc, recs, err = run(hf_cmd(tiny_model, ref_bucket, *sets))
    assert rc == 0, err[-3000:]
    epochs = {r["step"]: r["epoch"] for r in recs if r["event"] == "step" and "epoch" in r}
    rc, recs, err = run_and_sigterm(hf_cmd(tiny_model, bucket, *sets), at_step=10)
    assert rc == 75 and [r["step"] for r in recs if r["event"] == "preempt"] == [10], err[-3000:]
    rc, recs, err = run(hf_cmd(tiny_model, bucket, *sets))
    assert rc == 0 and steps_of(recs) == [11, 12, 13, 14], err[-3000:]
    _, (ref, _) = final(ref_bucket)
    _, (tri, _) = final(bucket)
    worst, differing = compare_flat(ref, tri)
    assert differing == [] and worst == 0.0, (differing[:5], epochs)


def test_a_resume_at_an_epoch_boundary_keeps_the_epochs_rng_snapshot_exact(tmp_path, tiny_model):
    """167 packed samples in batches of 4 make 21 steps an epoch. Resumed from step 21, the Trainer calls
    on_epoch_begin before it restores the checkpoint's RNG: the epoch RNG snapshot (baton_epoch_rng_0.pth,
    what a later resume in that epoch gives the sampler) must be the restored state, as in the uninterrupted
    run. A drill evicted at step 63 found it differing; the uninterrupted run is the control."""
    from steps.lib.hf_checkpoint import compare_flat

    sets = ("total_steps=24", "checkpoint.every_steps=0")
    ref_bucket, bucket = f"file://{tmp_path}/ref", f"file://{tmp_path}/bucket"
    rc, recs, err = run(hf_cmd(tiny_model, ref_bucket, *sets))
    assert rc == 0, err[-3000:]
    rc, recs, err = run_and_sigterm(hf_cmd(tiny_model, bucket, *sets), at_step=21)
    assert rc == 75 and [r["step"] for r in recs if r["event"] == "preempt"] == [21], err[-3000:]
    rc, recs, err = run(hf_cmd(tiny_model, bucket, *sets))
    assert rc == 0 and steps_of(recs) == [22, 23, 24], err[-3000:]
    _, (ref, _) = final(ref_bucket)
    _, (tri, _) = final(bucket)
    assert any(k.startswith("other.baton_epoch_rng_0.pth") for k in tri)
    worst, differing = compare_flat(ref, tri)
    assert differing == [] and worst == 0.0, differing[:5]


def test_a_sigterm_kills_the_stock_script_without_the_callback(tmp_path, tiny_model):
    """The negative control's trainer: the same example without the callback dies on SIGTERM (-15)."""
    rc, recs, _ = run_and_sigterm(
        hf_cmd(tiny_model, tmp_path / "out"), at_step=3, env=base_env(BATON_DISABLE_SIGTERM_HANDLER="1")
    )
    assert rc == -signal.SIGTERM
    assert not [r for r in recs if r["event"] in ("preempt", "checkpoint")]
    assert steps_of(recs)[-1] >= 3
    assert not list(tmp_path.glob("out/checkpoint-*/_COMMIT"))


# ---- the store, without training ----------------------------------------------------------------------


def fake_checkpoint(local: Path, step: int, size: int = 64) -> Path:
    folder = local / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(size))
    # A real torch file: a resume loads it (weights_only) before it hands the folder to the Trainer.
    torch.save({"state": {0: {"exp_avg": torch.randn(size)}}}, folder / "optimizer.pt")
    (folder / "training_args.bin").write_bytes(b"pickled, never mirrored")
    return folder


def args_for(output_dir, **kw):
    return SimpleNamespace(
        output_dir=str(output_dir),
        save_total_limit=kw.get("save_total_limit"),
        save_only_model=False,
        device=torch.device("cpu"),
    )


def test_newest_committed_is_numeric_and_torn_or_altered_ones_are_passed_over(tmp_path, capsys):
    from trainer.checkpoint import CorruptCheckpoint
    from trainer.checkpoint.hf_store import HFStore
    from trainer.checkpoint.layout import COMMIT
    from trainer.hf import BatonCallback

    local, bucket = tmp_path / "local", tmp_path / "bucket"
    store = HFStore(f"file://{bucket}", str(local))
    for step in (9, 10, 11, 100):
        fake_checkpoint(local, step)
        if step != 100:
            store.commit(step, world_size=1)
    # checkpoint-100 was written but never committed: a save cut short
    shutil.copytree(local / "checkpoint-100", bucket / "checkpoint-100")
    assert store.committed_steps() == [11, 10, 9]  # numeric, newest first: a lexical sort would put 9 first
    assert not (bucket / "checkpoint-9" / "training_args.bin").exists()
    assert json.loads((bucket / "checkpoint-9" / COMMIT).read_text())["step"] == 9
    # 11 altered after its commit, 10 lost a file: both passed over, 9 is resumed.
    (bucket / "checkpoint-11" / "optimizer.pt").write_bytes(b"x" * 64)
    (bucket / "checkpoint-10" / "model.safetensors").unlink()
    with pytest.raises(CorruptCheckpoint, match="sha256"):
        store.fetch(11)
    shutil.rmtree(local)
    cb = BatonCallback(checkpoint_uri=f"file://{bucket}")
    try:
        path = cb.resume_checkpoint(args_for(local))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    assert path == str(local / "checkpoint-9")
    assert sorted(os.listdir(path)) == ["model.safetensors", "optimizer.pt"]
    recs = read_records(capsys.readouterr().out)
    assert [(r["event"], r["step"]) for r in recs] == [
        ("checkpoint_refused", 11),
        ("checkpoint_refused", 10),
        ("resume", 9),
    ]
    assert recs[-1]["checkpoint"] == f"file://{bucket}/checkpoint-9" and recs[-1]["attempt"] == 1


def test_in_place_commit_and_save_total_limit_1_is_refused(tmp_path):
    from trainer.checkpoint.hf_store import HFStore
    from trainer.checkpoint.layout import COMMIT
    from trainer.hf import BatonCallback

    store = HFStore(str(tmp_path), str(tmp_path))
    assert store.in_place
    fake_checkpoint(tmp_path, 3)
    url, size = store.commit(3, world_size=1)
    files = ("model.safetensors", "optimizer.pt")
    assert url == f"file://{tmp_path}/checkpoint-3" and size == sum(
        (tmp_path / "checkpoint-3" / f).stat().st_size for f in files
    )
    assert (tmp_path / "checkpoint-3" / COMMIT).is_file() and store.committed_steps() == [3]
    cb = BatonCallback()
    try:
        with pytest.raises(ValueError, match="save_total_limit=1"):
            cb._setup(args_for(tmp_path, save_total_limit=1))
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def test_s3_mirror_commits_last_fetches_back_and_retains(tmp_path, s3):
    import fsspec

    from trainer.checkpoint.hf_store import HFStore
    from trainer.checkpoint.layout import COMMIT

    root = s3.new_prefix("hf")
    store = HFStore(root, str(tmp_path / "local"))
    assert not store.in_place
    originals = {}
    for step in (2, 4, 6, 8):
        folder = fake_checkpoint(tmp_path / "local", step)
        originals[step] = (folder / "model.safetensors").read_bytes()
        store.commit(step, world_size=1)
        store.retain(keep_last=2)
    assert store.committed_steps() == [8, 6]
    fs = fsspec.filesystem(
        "s3", client_kwargs={"endpoint_url": s3.url}, skip_instance_cache=True, use_listings_cache=False
    )
    base = root.removeprefix("s3://")
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{base}/checkpoint-8")) == [
        COMMIT,
        "model.safetensors",
        "optimizer.pt",
    ]
    assert not fs.exists(f"{base}/checkpoint-2")
    # The pod's disk is gone: the newest committed one comes back from the bucket, checked.
    shutil.rmtree(tmp_path / "local")
    path = store.fetch(8)
    assert Path(path, "model.safetensors").read_bytes() == originals[8]


def test_steps_train_trainer_choice_is_argv_never_a_shell():
    from steps.train import HF_EXAMPLE, program

    assert program("baton") == ["-m", "trainer"]
    assert program("hf") == [str(REPO / HF_EXAMPLE)]
    nasty = "my_train.py --note 'x\"; echo $(id)' `whoami`"
    assert program(nasty) == ["my_train.py", "--note", 'x"; echo $(id)', "`whoami`"]
    assert program("-m mypkg.train --lr 3e-4") == ["-m", "mypkg.train", "--lr", "3e-4"]
    with pytest.raises(SystemExit, match="empty"):
        program("  ")


def test_a_users_script_under_steps_train_on_s3_exits_75_and_resumes_from_the_bucket(s3, tiny_model):
    """The contract end to end for a script given by path (not the `hf` alias): PID 1 keeps exit 75
    through torchrun, checkpoints live only in the bucket (each launch has a fresh local folder), and
    the next launch fetches the newest committed one back."""
    root = s3.new_prefix("hf-user")
    script = "examples/hf_trainer/train.py --config examples/hf_trainer/config.yaml"
    cmd = [PY, "-m", "steps.train", "--nproc", "1", "--trainer", script]
    for s in (
        f"model.path={tiny_model}",
        f"checkpoint.uri={root}",
        f"data.uri={CORPUS}",
        "total_steps=8",
        "checkpoint.every_steps=0",
    ):
        cmd += ["--set", s]
    rc, recs, err = run_and_sigterm(cmd, at_step=3, env=s3.env(BATON_GRACE="20"))
    assert rc == 75, err[-3000:]
    assert [r["step"] for r in recs if r["event"] == "preempt"] == [3]
    keys = s3.keys(root)
    assert "checkpoint-3/_COMMIT" in keys and "checkpoint-3/model.safetensors" in keys
    assert not any(k.endswith("training_args.bin") for k in keys)
    rc, recs, err = run(cmd, env=s3.env(BATON_GRACE="20"))
    assert rc == 0, err[-3000:]
    (res,) = [r for r in recs if r["event"] == "resume"]
    assert res["from_step"] == 3 and res["checkpoint"] == f"{root}/checkpoint-3" and res["attempt"] == 2
    assert steps_of(recs) == [4, 5, 6, 7, 8] and recs[-1]["event"] == "done"
    assert "checkpoint-8/_COMMIT" in s3.keys(root)


# ---- faults: baton's exit-code rule (trainer/faults.py) ----------------------------------------------------


def fault_env(**faults) -> dict[str, str]:
    env = base_env(BATON_TEST_FAULTS=json.dumps(faults))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests" / "faultfs"), env["PYTHONPATH"]])
    return env


def test_failing_saves_go_on_then_end_with_75_a_store_down_at_resume_passes_over_nothing_and_the_end_is_exact(
    tmp_path, tiny_model, reference
):
    from steps.lib.hf_checkpoint import compare_flat

    root = tmp_path / "bucket"
    cmd = hf_cmd(tiny_model, f"faulty://{root}", "checkpoint.every_steps=3", "faults.max_failed_saves=2")
    # 1. A full disk at 6 and 9: the run goes on after the first failure, the second in a row ends it with 75.
    rc, recs, err = run(cmd, env=fault_env(enospc_steps=[6, 9]))
    assert rc == 75, err[-3000:]
    failed = [(r["step"], r["in_a_row"], r["limit"]) for r in recs if r["event"] == "checkpoint_failed"]
    assert failed == [(6, 1, 2), (9, 2, 2)]
    assert "No space left on device" in err
    (later,) = [r for r in recs if r["event"] == "retry_later"]
    assert (later["reason"], later["exit"], later["checkpoint"]) == (
        "saves_failing",
        75,
        f"faulty://{root}/checkpoint-3",
    )
    assert steps_of(recs) == list(range(1, 10))
    assert sorted(p.parent.name for p in root.glob("checkpoint-*/_COMMIT")) == ["checkpoint-3"]

    # 2. The store fails every read while resuming: retried for faults.read_retry_s, then 75; checkpoint-3
    # is not passed over for a fresh start (that would replay its steps).
    rc, recs, err = run(cmd + ["--set", "faults.read_retry_s=1"], env=fault_env(read_errors=-1))
    assert rc == 75, err[-3000:]
    assert [r["reason"] for r in recs if r["event"] == "retry_later"] == ["store_unreachable"]
    assert not [r for r in recs if r["event"] in ("checkpoint_refused", "resume", "step")]
    assert "reading the checkpoint failed" in err

    # 3. Two failed reads, then the store answers: the resume retries and takes checkpoint-3 itself.
    rc, recs, err = run(cmd, env=fault_env(read_errors=2))
    assert rc == 0, err[-3000:]
    assert err.count("reading the checkpoint failed") == 2
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [3]
    assert not [r for r in recs if r["event"] == "checkpoint_refused"]
    assert steps_of(recs) == list(range(4, TOTAL + 1)) and recs[-1]["event"] == "done"
    _, (ref, _) = final(reference)
    tri_step, (tri, _) = final(f"file://{root}")
    _, differing = compare_flat(ref, tri)
    # All equal but the cadence the reference was saved with (every 5 steps), which trainer_state records.
    assert tri_step == TOTAL and differing == ["trainer_state.save_steps"]
    assert sum(isinstance(v, torch.Tensor) for v in tri.values()) > 100  # compare_flat: torch.equal on each


def test_the_gradient_noise_seam_reaches_an_hf_script(tmp_path, tiny_model):
    """BATON_NOISE (tests/faultfs) perturbs the HF Trainer's gradients too, through trainer/hooks.py at
    on_pre_optimizer_step, so that Tier 2 can be tried on a CPU with one's own script: one seed gives one
    run (a resume redraws the same noise), another seed another. Control: without the seam both seeds'
    runs would be equal, as the two runs of one seed are."""

    def model_of(seed: str, name: str) -> dict:
        bucket = f"file://{tmp_path}/{name}"
        rc, _, err = run(
            hf_cmd(tiny_model, bucket, "total_steps=4"), env=base_env(BATON_NOISE=f"1e-3,{seed}")
        )
        assert rc == 0, err[-3000:]
        _, (flat, _) = final(bucket)
        return {k: v for k, v in flat.items() if k.startswith("model.")}

    a, a2, b = model_of("1", "a"), model_of("1", "a2"), model_of("2", "b")
    assert a and all(torch.equal(a[k], a2[k]) for k in a)
    assert not all(torch.equal(a[k], b[k]) for k in a), "the noise did not reach the HF Trainer's gradients"
