"""Run under torchrun: resume a run, then report whether the loaded state equals the checkpoint's.

torchrun --nproc-per-node N tests/dist/probe_reshard.py CONFIG OUT_JSON [--set k=v ...]
"""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

from trainer.checkpoint import load_flat
from trainer.config import load_config
from trainer.loop import Trainer
from trainer.preemption import Preemption


def main() -> None:
    config, out, *rest = sys.argv[1:]
    sets = [rest[i + 1] for i in range(0, len(rest), 2)]
    t = Trainer(load_config(config, sets), Preemption())
    t.build()
    t.resume()
    model_sd, optim_sd = get_state_dict(t.model, t.optim, options=StateDictOptions(full_state_dict=True))
    if t.rank == 0:
        saved = load_flat(t.last_checkpoint)
        checks = {}
        for k, v in model_sd.items():
            checks[f"model.{k}"] = torch.equal(v, saved[f"model.{k}"])
        for fqn, st in optim_sd["state"].items():
            for name, v in st.items():
                checks[f"optim.state.{fqn}.{name}"] = torch.equal(v, saved[f"optim.state.{fqn}.{name}"])
        progress = saved["progress"].tolist()
        manifest_world = json.load(open(t.last_checkpoint.removeprefix("file://") + "/manifest.json"))[
            "world_size"
        ]
        json.dump(
            {
                "equal": sum(checks.values()),
                "total": len(checks),
                "world": t.world,
                "saved_world": manifest_world,
                "saved_progress": progress,
                "epoch": t.data.epoch,
                "position": t.data.position,
                "step": t.step,
                "batch_size": t.cfg.data.batch_size,
            },
            open(out, "w"),
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
