"""Run under torchrun with 2 ranks: one rank plays an attacker that sends a pickle to the other.

    python -m torch.distributed.run --standalone --nproc-per-node 2 tests/dist/peer_pickle.py MARKER MODE

MODE `torch`: the control, torch's object collectives (what trainer/collectives.py used): rank 0's
broadcast unpickles on rank 1 and its gadget creates MARKER. MODE `baton`: the attacker speaks baton's
framing (a length, then the bytes) with the same pickle, on `broadcast` (rank 0 attacks) and `gather`
(rank 1 attacks); the honest rank prints REFUSED for each and nothing runs."""

from __future__ import annotations

import os
import pickle
import sys

import torch
import torch.distributed as dist

from trainer import collectives
from trainer.untrusted import Refused


class Gadget:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def main() -> None:
    marker, mode = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    payload = pickle.dumps(Gadget(marker))
    if mode == "torch":
        box = [Gadget(marker) if rank == 0 else None]
        dist.broadcast_object_list(box, src=0)
    else:
        if rank == 0:  # attacker: baton's broadcast framing, a pickle for bytes
            dist.broadcast(torch.tensor([len(payload)], dtype=torch.int64), src=0)
            dist.broadcast(torch.frombuffer(bytearray(payload), dtype=torch.uint8), src=0)
        else:
            try:
                collectives.broadcast(None)
                print("ACCEPTED broadcast", flush=True)
            except Refused as e:
                print(f"REFUSED broadcast: {e}", flush=True)
        if rank == 1:  # attacker: baton's gather framing
            lengths = torch.zeros(2, dtype=torch.int64)
            lengths[1] = len(payload)
            dist.all_reduce(lengths)
            width = int(lengths.max())
            mine = torch.zeros(width, dtype=torch.uint8)
            mine[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
            dist.all_gather([torch.empty(width, dtype=torch.uint8) for _ in range(2)], mine)
        else:
            try:
                collectives.gather("hello")
                print("ACCEPTED gather", flush=True)
            except Refused as e:
                print(f"REFUSED gather: {e}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
