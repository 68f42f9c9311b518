"""The trainer's own state for the big model: baton's Trainer, built in this process, after one step.

What the saves write is exactly what a periodic checkpoint of the trainer holds (FSDP2-wrapped model,
AdamW moments after one step, scheduler, RNG, loader position), taken through `Checkpointer.state`.
"""

from __future__ import annotations

import time
from typing import Any

from bench.common import TINY_CORPUS, log
from bench.models import big_model


def open_trainer(ckpt_uri: str, quick: bool = False, name: str = "bench-save") -> Any:
    """A built trainer (process group up, world 1) that has taken one optimizer step."""
    from trainer.config import load_config
    from trainer.loop import Trainer
    from trainer.preemption import Preemption

    model = big_model(quick)
    cfg = load_config(
        None,
        [
            f"name={name}",
            f"model.path={model}",
            f"data.uri={TINY_CORPUS}",
            "data.seq_len=64",
            "data.batch_size=1",
            "data.grad_accum=1",
            "total_steps=1000",
            f"checkpoint.uri={ckpt_uri}",
            "checkpoint.every_steps=0",
            "notice.enabled=false",
        ],
    )
    t = Trainer(cfg, Preemption())
    t.build()
    t0 = time.perf_counter()
    batch = t.data.next_batch()
    t.model(input_ids=batch, labels=batch).loss.backward()
    t.optim.step()
    t.sched.step()
    t.optim.zero_grad(set_to_none=True)
    t.step = 1
    log(
        f"trainer state ready: {sum(p.numel() for p in t.model.parameters()) / 1e6:.1f} M parameters, "
        f"one step in {time.perf_counter() - t0:.1f} s"
    )
    return t


def state_of(t: Any) -> dict[str, Any]:
    return t.ckpt.state(t.boundary(), t.parts)


def manifest_of(t: Any) -> dict[str, Any]:
    return {
        "fingerprint": t.cfg.fingerprint,
        "run_id": t.cfg.run_id,
        "epoch": 0,
        "device": "cpu",
        "reason": "bench",
        "config": t.cfg.to_dict(),
        "time": time.time(),
        "metrics": {},
    }


def state_bytes(state: dict[str, Any]) -> int:
    import torch

    total = 0

    def walk(node: Any) -> None:
        nonlocal total
        if isinstance(node, dict):
            for v in node.values():
                walk(v)
        elif isinstance(node, torch.Tensor):
            local = node.to_local() if hasattr(node, "to_local") else node
            total += local.numel() * local.element_size()

    walk(state)
    return total


def close(t: Any) -> None:
    import torch.distributed as dist

    if getattr(t, "notice", None):
        t.notice.stop()
    if dist.is_initialized():
        dist.destroy_process_group()
