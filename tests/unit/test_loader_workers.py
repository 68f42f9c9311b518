"""Data loader workers outlive a SIGTERM sent to the pod's process group (what an eviction sends: Argo's
emissary and the local runner signal the whole group), also one that comes while a worker starts
(trainer/data.py: IgnoreSigterm, started with SIGTERM blocked), and still end when their parent exits: its
own SIGTERM (multiprocessing ends its daemonic children at exit) must not be ignored, or the exit would wait.

torch's workers install a SIGTERM handler that ends them (torch/csrc/DataLoader.cpp) before they run the
loader's worker_init_fn. To hit that window every time, the script below slows the workers down right after
torch installs its handlers; the SIGTERM then lands inside it. Controls: without baton's fix, and with only
IgnoreSigterm (no blocked start), the same signal kills the workers.
"""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import PY, REPO, base_env

SCRIPT = r"""
import os, signal, sys, time
import torch
import torch.utils.data._utils.worker as worker
from trainer.data import IgnoreSigterm, ignore_sigterm_in_workers

handlers = worker.signal_handling._set_worker_signal_handlers


def slow_start(*args):  # in each worker: torch's handlers installed, then a pause before worker_init_fn
    handlers(*args)
    time.sleep(1.0)


worker.signal_handling._set_worker_signal_handlers = slow_start
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append(1))  # the trainer's own handler: a flag


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return i


mode = sys.argv[1]
loader = torch.utils.data.DataLoader(Numbers(), batch_size=2, num_workers=2)
if mode == "baton":
    ignore_sigterm_in_workers(loader)
elif mode == "ignore_only":
    loader.worker_init_fn = IgnoreSigterm()
it = iter(loader)  # the workers start
time.sleep(0.4)  # inside their pause
import subprocess  # from another process, as an eviction's comes (the emissary, the runner)
subprocess.run([sys.executable, "-c", f"import os, signal; os.killpg({os.getpgid(0)}, signal.SIGTERM)"])
try:
    n = sum(len(b) for b in it)
except RuntimeError as e:
    print("workers died:", str(e).splitlines()[0])
    sys.exit(3)
print("served", n, "signalled", bool(got), flush=True)
alive = iter(loader)  # workers still running at exit: multiprocessing SIGTERMs and joins them
next(alive)
"""


@pytest.mark.parametrize("mode, survives", [("baton", True), ("ignore_only", False), ("none", False)])
def test_workers_outlive_a_sigterm_that_comes_while_they_start(tmp_path, mode, survives):
    script = tmp_path / "window.py"
    script.write_text(SCRIPT)
    p = subprocess.run(
        [PY, str(script), mode],
        capture_output=True,
        text=True,
        env=base_env(),
        cwd=REPO,
        timeout=120,
        start_new_session=True,
    )
    if survives:
        assert p.returncode == 0 and "served 16 signalled True" in p.stdout, p.stdout + p.stderr[-2000:]
    else:
        assert p.returncode == 3 and "workers died" in p.stdout, p.stdout + p.stderr[-2000:]
