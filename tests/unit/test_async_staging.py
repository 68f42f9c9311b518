"""Async saves stage their copy on a thread of their own, overlapping the next step's forward and
backward passes; `Store.before_update` is where the loop waits for it, before the optimizer writes.

In-process on file:// (no process group). The staging is slowed on purpose so that the order matters:
state changed after `before_update` must not reach the checkpoint (the test), and state changed before
it does (the control: the wait is what protects the copy).
"""

from __future__ import annotations

import time

import pytest
import torch

from trainer.checkpoint import load_flat
from trainer.checkpoint.store import Store

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def slow_staging(store: Store, monkeypatch, delay_s: float = 0.5) -> None:
    stager = store.asyncs.staging_buffers()
    real = stager._stage

    def late(state, **kw):
        time.sleep(delay_s)
        return real(state, **kw)

    monkeypatch.setattr(stager, "_stage", late)


@pytest.mark.parametrize("mutate", ["after_before_update", "before_before_update"])
def test_the_update_waits_for_the_staging_copy(tmp_path, monkeypatch, mutate):
    store = Store(f"file://{tmp_path}/ck", "run-a", io_threads=2)
    attempt = store.claim_attempt({})
    slow_staging(store, monkeypatch)
    w = torch.arange(4096, dtype=torch.float32)
    state = {"w": w, "progress": torch.tensor([1])}
    committed = []
    t0 = time.perf_counter()
    store.asyncs.save_async(1, state, {"fingerprint": "f"}, attempt, committed.append)
    store.asyncs.step_boundary()
    assert time.perf_counter() - t0 < 0.4, "the call and the boundary do not wait for the staging copy"
    assert store.asyncs.pending is not None and store.asyncs.pending.staging is not None
    if mutate == "after_before_update":
        store.asyncs.before_update()
        w.add_(1)  # the optimizer's update
    else:  # the control: an update that does not wait
        w.add_(1)
        store.asyncs.before_update()
    store.asyncs.drain()
    assert [r.step for r in committed] == [1]
    saved = load_flat(committed[0].path)["w"]
    if mutate == "after_before_update":
        assert torch.equal(saved, torch.arange(4096, dtype=torch.float32))
    else:
        assert torch.equal(saved, w), "the control should have caught the update in the copy"
