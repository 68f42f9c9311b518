"""The floor of a multi-rank restart: what every restart of `steps.train` must do, and nothing of baton's.

Each rank, under torchrun (one node or several): import torch and transformers, join a plain gloo process
group, read its share of a committed checkpoint's bytes once (rank r every file at index i with
i % world == r, so the ranks together read each byte once), build the model from its folder and shard it
with FSDP2 (as baton does), and take one optimizer step with one all-reduce of its own (the loss, as any
loop logs it). Rank 0 prints a JSON line for the step (`event`: step), like the trainer's records.

    torchrun --nproc-per-node 2 -m bench.restart_floor --model DIR --checkpoint DIR --corpus FILE
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path


def read_share(folder: Path, rank: int, world: int) -> int:
    """Read this rank's share of every file under `folder` once; the bytes read."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    n = 0
    for p in files[rank::world]:
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(1 << 24):
                n += len(chunk)
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.restart_floor", description=__doc__)
    ap.add_argument("--model", required=True)
    ap.add_argument("--checkpoint", required=True, help="the committed step's folder")
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    a = ap.parse_args(argv)

    import torch
    import torch.distributed as dist
    import transformers  # noqa: F401 - what a restart imports, whether or not it is used here
    from torch.distributed.device_mesh import init_device_mesh
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trainer.data import PackedDataset, pack, read_documents
    from trainer.model import shard

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    read_share(Path(a.checkpoint), rank, world)
    tok = AutoTokenizer.from_pretrained(a.model)
    data = PackedDataset(pack(read_documents(a.corpus), tok, a.seq_len))
    batch = torch.stack([data[(rank * a.batch_size + i) % len(data)] for i in range(a.batch_size)])
    model = AutoModelForCausalLM.from_pretrained(a.model, attn_implementation="eager", dtype=torch.float32)
    model = shard(model, init_device_mesh("cpu", (world,)))
    model.train()
    optim = torch.optim.AdamW(model.parameters(), lr=3e-3, foreach=False)
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optim.step()
    value = torch.tensor([float(loss)], dtype=torch.float64)
    dist.all_reduce(value)
    if rank == 0:
        sys.stdout.write(
            json.dumps({"event": "step", "step": 1, "time": time.time(), "pid": os.getpid()}) + "\n"
        )
        sys.stdout.flush()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
