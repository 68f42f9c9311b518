"""Run under torchrun on CUDA: `python -m torch.distributed.run --nproc-per-node N probe_collectives.py OUT_DIR`.

Initialises the process group exactly as the trainer does (`trainer.loop.init_distributed`), then checks
what runs where and writes OUT_DIR/rank<r>.json: the backend, the device that object collectives and
barriers use, an all-reduce of the stop flag on the CPU (the trainer's choice: the gloo half of
`cpu:gloo,cuda:nccl`) and on the GPU (the NCCL half), `Preemption.should_stop()` with only the last rank
signalled, and an FSDP2 forward/backward (NCCL all-gather and reduce-scatter) on the device.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _get_object_coll_device
from torch.distributed.fsdp import fully_shard

from trainer.loop import init_distributed
from trainer.preemption import Preemption


def main() -> int:
    out_dir = Path(sys.argv[1])
    rank, world, device = init_distributed()
    res: dict = {
        "rank": rank,
        "world": world,
        "device": str(device),
        "backend": str(dist.get_backend()),
        "object_collective_device": _get_object_coll_device(),
    }
    for where in (
        "cpu",
        "cuda",
    ):  # "cuda": the rank's own device (the CPU too on a CPU machine, for a dry run)
        dev = torch.device("cpu") if where == "cpu" else device
        t = torch.tensor([rank + 1], dtype=torch.int32, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        res[f"all_reduce_{where}"] = int(t.item())
        p = Preemption()
        p.device = dev
        if rank == world - 1:
            p.signal_name = "SIGTERM"
        res[f"should_stop_{where}"] = p.should_stop()
        res[f"signal_{where}"] = p.signal_name
    box = [{"from": 0, "rank0_device": str(device)} if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    res["broadcast_object"] = box[0]["from"] == 0
    dist.barrier()
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)).to(device)
    fully_shard(net[0])
    fully_shard(net)
    x = torch.randn(16, 64, device=device)
    net(x).square().mean().backward()
    res["fsdp_grads_on"] = sorted({p.grad.device.type for p in net.parameters()})
    res["fsdp_grads_finite"] = all(bool(torch.isfinite(p.grad.full_tensor()).all()) for p in net.parameters())
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    (out_dir / f"rank{rank}.json").write_text(json.dumps(res, sort_keys=True))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
