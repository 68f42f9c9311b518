"""A one-rank restart reads its checkpoint on a thread while the model is built
(trainer/checkpoint/prefetch.py): what it hands over equals what the load would have read, it hands
nothing over that differs from the template, and a corrupt checkpoint it read is still refused, the
fallback exact.

In-process, on file://, plain tensors (no process group), as tests/unit/test_verified_load.py.
"""

from __future__ import annotations

import pytest
import torch

from trainer.checkpoint.prefetch import Prefetch
from trainer.checkpoint.resolve import LoadTimes, resolve_and_load
from trainer.checkpoint.store import Store

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
FP = "f" * 64


def state(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {
        "model": {"w": torch.randn(64, 32, generator=g), "b": torch.randn(4096, generator=g)},
        "half": torch.randn(9, 3, generator=g).to(torch.bfloat16),
        "progress": torch.tensor([step]),
    }


def template() -> dict:
    return {
        "model": {"w": torch.empty(64, 32), "b": torch.empty(4096)},
        "half": torch.empty(9, 3, dtype=torch.bfloat16),
        "progress": torch.empty(1, dtype=torch.int64),
    }


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(
        equal(a[k], b[k]) if isinstance(a[k], dict) else a[k].dtype == b[k].dtype and torch.equal(a[k], b[k])
        for k in a
    )


@pytest.fixture
def store(tmp_path):
    return Store(f"file://{tmp_path}/ck", "run-x", io_threads=2)


def save(store: Store, step: int) -> None:
    store.save(step, state(step), {"fingerprint": FP}, attempt=store.claim_attempt({}))


def flip_last_file(store: Store, step: int) -> None:
    names = sorted(n for n in store.fs.ls(store.step_path(step), detail=False) if n.endswith(".distcp"))
    data = bytearray(store.fs.cat_file(names[-1]))
    data[len(data) - 100] ^= 0x01
    store.fs.pipe_file(names[-1], bytes(data))


def test_what_it_hands_over_is_the_checkpoint_arranged_as_the_template(store):
    save(store, 4)
    pre = Prefetch(store, 4)
    got = pre.take(4, store.read_manifest(4), template())
    assert got is not None and equal(got, state(4)) and pre.used
    assert pre.copies["direct"] == 4 and pre.read_s > 0
    assert pre.take(4, store.read_manifest(4), template()) is None, "handed over once"


@pytest.mark.parametrize("change", ["step", "manifest", "missing", "shape", "dtype", "extra"])
def test_nothing_that_differs_from_the_template_is_handed_over(store, change):
    save(store, 4)
    pre = Prefetch(store, 4)
    manifest, t = store.read_manifest(4), template()
    step = 5 if change == "step" else 4
    if change == "manifest":
        manifest = {**manifest, "time": -1}
    elif change == "missing":
        t["model"]["bias"] = torch.empty(3)
    elif change == "shape":
        t["model"]["w"] = torch.empty(32, 64)
    elif change == "dtype":
        t["half"] = torch.empty(9, 3)
    elif change == "extra":
        t["model"] = {"w": t["model"]["w"], "b": t["model"]["b"], "c": torch.empty(0)}
    assert pre.take(step, manifest, t) is None and not pre.used


def test_control_the_unchanged_template_is_handed_over(store):
    save(store, 4)
    assert Prefetch(store, 4).take(4, store.read_manifest(4), template()) is not None


def load(store: Store, prefetch: Prefetch | None) -> tuple[int, dict, list, LoadTimes]:
    refused: list = []
    times = LoadTimes()
    found = resolve_and_load(
        store,
        FP,
        lambda step, manifest: template(),
        lambda s, why: refused.append((s, why)),
        times=times,
        prefetched=prefetch.take if prefetch else None,
    )
    assert found is not None
    return found[0], found[2], refused, times


def test_a_resume_takes_it_and_reads_nothing_itself(store):
    save(store, 2)
    save(store, 4)
    pre = Prefetch(store, 4)
    step, staged, refused, times = load(store, pre)
    assert step == 4 and not refused and equal(staged, state(4)) and pre.used
    assert sum(times.copies.values()) == 0, "the load read nothing of its own"


def test_a_corrupt_checkpoint_it_read_is_refused_and_the_fallback_is_exact(store):
    save(store, 2)
    save(store, 4)
    flip_last_file(store, 4)
    pre = Prefetch(store, 4)
    step, staged, refused, times = load(store, pre)
    assert pre.failure and "checksum" in pre.failure and not pre.used
    assert step == 2 and [s for s, _ in refused] == [4] and "checksum" in refused[0][1]
    assert equal(staged, state(2)) and times.copies["direct"] > 0


def test_control_without_the_flip_the_newest_loads(store):
    save(store, 2)
    save(store, 4)
    step, staged, refused, _ = load(store, Prefetch(store, 4))
    assert step == 4 and not refused and equal(staged, state(4))
