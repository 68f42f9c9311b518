"""Equivalence of an interrupted-and-resumed run with its own uninterrupted run, for both trainers.

The same experiment on both sides: the tiny Qwen2 with attention dropout 0.1 (every forward pass draws
from the RNG), the shipped corpus, batch 4 x 2 accumulation x 64 tokens, 40 steps (two epochs of 20),
interrupted by a real SIGTERM at step 25 (mid-epoch) and resumed from the checkpoint of step 25.
- baton: `python -m trainer` reference, and a run that gets SIGTERM after step 25 (it saves step 25
  and exits 75), then the restart; the final checkpoints' model and AdamW tensors are compared.
- Hugging Face Trainer (`full_determinism=True`, a checkpoint every 5 steps): reference, and a run
  held after writing checkpoint-25 and killed by SIGTERM there, then `resume_from_checkpoint`;
  checkpoint-40's model.safetensors and optimizer.pt are compared.
Negative controls show that the comparison can see a difference: baton resumed with
BATON_SKIP_RESTORE=rng, and HF resumed from a copy of checkpoint-25 without rng_state.pth.

    python -m bench.equivalence --result FILE
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

from bench.common import (
    TINY_CORPUS,
    WORK,
    child_env,
    hf_peer_cmd,
    log,
    run_records,
    section_args,
    timed_until,
    write_result,
)
from bench.models import tiny_model
from trainer.checkpoint import hf_step_name

TOTAL, AT = 40, 25


def compare(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    import torch

    if a.keys() != b.keys():
        return {
            "tensors": len(a),
            "differing": None,
            "max_abs_diff": None,
            "error": f"different keys: {sorted(a.keys() ^ b.keys())[:5]}",
        }
    differing, worst = 0, 0.0
    for k in a:
        x, y = a[k], b[k]
        if not torch.equal(x, y):
            differing += 1
            if x.is_floating_point():
                worst = max(worst, float((x.double() - y.double()).abs().max()))
    return {"tensors": len(a), "differing": differing, "max_abs_diff": worst}


def baton_side(root: Path, model: Path) -> dict[str, Any]:
    from tests.helpers import model_and_optim, run_and_sigterm, tensors, trainer_cmd

    env = child_env()
    ref, trial = root / "baton-ref", root / "baton-trial"
    sets = ("model.dropout=0.1", f"total_steps={TOTAL}", "notice.enabled=false")
    rc, _ = run_records(trainer_cmd(model, ref, *sets), env=env)
    log(f"baton reference: exit {rc}")
    rc1, recs, _ = run_and_sigterm(trainer_cmd(model, trial, *sets), AT, env=env)
    stop = next((r for r in recs if r["event"] == "preempt"), {})
    control = root / "baton-control"
    shutil.copytree(trial, control)
    rc2, recs2 = run_records(trainer_cmd(model, trial, *sets), env=env)
    resumed = next((r["from_step"] for r in recs2 if r["event"] == "resume"), None)
    log(
        f"baton trial: SIGTERM at step {AT} -> exit {rc1} (saved step {stop.get('step')}); "
        f"restart resumed from step {resumed} -> exit {rc2}"
    )
    run_records(trainer_cmd(model, control, *sets), env=child_env(BATON_SKIP_RESTORE="rng"))
    a = model_and_optim(tensors(ref, TOTAL))
    return {
        "exits": [rc, rc1, rc2],
        "resumed_from": resumed,
        "replayed_steps": AT - (resumed or 0),
        **compare(a, model_and_optim(tensors(trial, TOTAL))),
        "control": compare(a, model_and_optim(tensors(control, TOTAL))),
    }


def hf_cmd(model: Path, out: Path, *extra: str) -> list[str]:
    return hf_peer_cmd(model, TINY_CORPUS, out, TOTAL, "--save-steps", "5", "--dropout", "0.1", *extra)


def hf_tensors(ckpt: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    flat = {f"model.{k}": v for k, v in load_file(ckpt / "model.safetensors").items()}
    optim = torch.load(ckpt / "optimizer.pt", weights_only=True, map_location="cpu")
    for idx, st in optim["state"].items():
        for name, v in st.items():
            if isinstance(v, torch.Tensor):
                flat[f"optim.{idx}.{name}"] = v
    return flat


def hf_side(root: Path, model: Path) -> dict[str, Any]:
    env = child_env()
    ref, trial = root / "hf-ref", root / "hf-trial"
    rc, _ = run_records(hf_cmd(model, ref), env=env)
    log(f"HF reference: exit {rc}")

    def sigterm_on_save(rec: dict, p: Any) -> None:
        if rec["event"] == "save" and rec["step"] == AT:
            os.kill(p.pid, signal.SIGTERM)

    # Held after writing checkpoint-25, then SIGTERM: the Trainer dies of it (no handler of its own).
    _, _, rc1 = timed_until(
        hf_cmd(model, trial, "--pause-after-save", str(AT)),
        lambda r: False,
        env=env,
        on_record=sigterm_on_save,
    )
    control = root / "hf-control"
    shutil.copytree(trial / hf_step_name(AT), control / hf_step_name(AT))
    (control / hf_step_name(AT) / "rng_state.pth").unlink()
    rc2, recs2 = run_records(hf_cmd(model, trial, "--resume", str(trial / hf_step_name(AT))), env=env)
    first = next((r["step"] for r in recs2 if r["event"] == "step"), None)
    log(f"HF trial: SIGTERM after checkpoint-{AT} -> exit {rc1}; resumed, first step {first} -> exit {rc2}")
    run_records(hf_cmd(model, control, "--resume", str(control / hf_step_name(AT))), env=env)
    a = hf_tensors(ref / hf_step_name(TOTAL))
    return {
        "exits": [rc, rc1, rc2],
        "resumed_from": (first or 1) - 1,
        **compare(a, hf_tensors(trial / hf_step_name(TOTAL))),
        "control": compare(a, hf_tensors(control / hf_step_name(TOTAL))),
    }


def main() -> None:
    args = section_args(__doc__ or "")
    root = WORK / "equivalence"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    model = tiny_model()
    result = {
        "total_steps": TOTAL,
        "interrupted_at": AT,
        "baton": baton_side(root, model),
        "hf": hf_side(root, model),
    }
    for side in ("baton", "hf"):
        r = result[side]
        log(
            f"{side}: {r['differing']} of {r['tensors']} tensors differ, max abs diff {r['max_abs_diff']}; "
            f"negative control (RNG not restored): {r['control']['differing']} differ, "
            f"max abs diff {r['control']['max_abs_diff']:.3g}"
        )
    write_result(args.result, result)


if __name__ == "__main__":
    main()
