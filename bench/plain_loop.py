"""The plain loop: the same model, data order, optimizer and schedule as baton's loop, and nothing else
(no records, no stop checks, no RNG or loader capture, no checkpoints; and no FSDP2 wrapper unless
`--fsdp`, which wraps it as baton does, on one rank). Under torchrun with 2 ranks (gloo) it is the
plain FSDP2 loop: each rank its share of every batch, as baton splits it, and one all-reduce a step of
its own (the loss and a stop flag, what any preemptible loop needs), which is what baton makes too.

Prints a JSON line per optimizer step (`event`: step, `step`, `time`), like the trainer's records.

    python -m bench.plain_loop --model DIR --corpus FILE --steps N [--seq-len 64] [--batch-size 4]
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.plain_loop",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fsdp", action="store_true", help="wrap the model with FSDP2 as baton does (world 1)")
    a = ap.parse_args(argv)

    import torch
    from torch.utils.data import DataLoader
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.data import EpochSampler, Geometry, PackedDataset, pack, read_documents
    from trainer.loop import lr_factor
    from trainer.rng import seed_everything

    torch.use_deterministic_algorithms(True)
    seed_everything(a.seed, 0)
    samples = pack(read_documents(a.corpus), AutoTokenizer.from_pretrained(a.model), a.seq_len)
    dataset = PackedDataset(samples)
    geo = Geometry(len(dataset), a.batch_size, 1, 1)
    model = AutoModelForCausalLM.from_pretrained(a.model, attn_implementation="eager", dtype=torch.float32)
    import os

    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh

        from trainer.model import shard

        dist.init_process_group("gloo")
        geo = Geometry(len(dataset), a.batch_size, 1, world)
        model = shard(model, init_device_mesh("cpu", (world,)))
    elif a.fsdp:
        from torch.distributed.device_mesh import init_device_mesh

        from trainer.model import shard

        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
        model = shard(model, init_device_mesh("cpu", (1,)))
    model.train()
    optim = torch.optim.AdamW(
        model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.01, foreach=False
    )
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: lr_factor(s, a.warmup, a.steps, 0.1))
    step, epoch = 0, 0
    while step < a.steps:
        loader = DataLoader(dataset, batch_size=a.batch_size, sampler=EpochSampler(geo, a.seed, epoch, rank))
        for batch in loader:
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optim.step()
            sched.step()
            optim.zero_grad(set_to_none=True)
            step += 1
            value = float(loss)
            if world > 1:  # the loss and a stop flag, in one collective
                flags = torch.tensor([value, 0.0], dtype=torch.float64)
                dist.all_reduce(flags)
                value = flags[0].item() / world
            if rank == 0:
                sys.stdout.write(
                    json.dumps({"event": "step", "step": step, "time": time.time(), "loss": value}) + "\n"
                )
                sys.stdout.flush()
            if step == a.steps:
                break
        epoch += 1
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
