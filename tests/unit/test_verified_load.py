"""A restart reads the checkpoint once: each file is hashed while DCP reads it (trainer.checkpoint.read), and
a checkpoint that fails its checksum leaves nothing of itself in the live state.

In-process, on file://, with a state of plain tensors (no process group: every collective of the
store is a no-op on one process). Each test has a control that shows the check can fail.
"""

from __future__ import annotations

import pytest
import torch

import trainer.checkpoint.resolve as resolve
import trainer.checkpoint.store as ckpt
from trainer.checkpoint.resolve import resolve_and_load
from trainer.checkpoint.store import Store

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
FP = "f" * 64


def state(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {
        "w": torch.randn(64, 32, generator=g),
        "b": torch.randn(4096, generator=g),
        "progress": torch.tensor([step]),
    }


def save(store: Store, step: int) -> None:
    store.save(step, state(step), {"fingerprint": FP}, attempt=store.claim_attempt({}))


def flip(store: Store, step: int) -> str:
    """Flip one byte in the middle of the biggest data file of `step`; returns its name."""
    names = [n for n in store.fs.ls(store.step_path(step), detail=False) if n.endswith(".distcp")]
    path = max(names, key=store.fs.size)
    data = bytearray(store.fs.cat_file(path))
    data[len(data) // 2] ^= 0x01
    store.fs.pipe_file(path, bytes(data))
    return path.rsplit("/", 1)[-1]


@pytest.fixture
def store(tmp_path):
    return Store(f"file://{tmp_path}/ck", "run-x", io_threads=2)


def load(store: Store, live: dict[str, torch.Tensor], refused: list, monkeypatch=None):
    return resolve_and_load(store, FP, lambda step, manifest: live, lambda s, why: refused.append((s, why)))


def test_an_intact_checkpoint_loads_and_every_file_is_hashed_once(store, monkeypatch):
    save(store, 5)
    hashed_fully: list[str] = []
    original = ckpt._file_hexdigest
    monkeypatch.setattr(
        ckpt, "_file_hexdigest", lambda fs, p, a: hashed_fully.append(p) or original(fs, p, a)
    )
    seen: list[set[str]] = []
    real_load = Store.load_verified

    def spy(self, step, manifest, st, *rest):
        got = real_load(self, step, manifest, st, *rest)
        seen.append(set(got))
        return got

    monkeypatch.setattr(Store, "load_verified", spy)
    live = {k: torch.zeros_like(v) for k, v in state(5).items()}
    refused: list = []
    step, manifest, staged = load(store, live, refused)
    assert step == 5 and not refused
    assert all(torch.equal(staged[k], v) for k, v in state(5).items())
    assert seen == [set(manifest["files"])], "every file hashed while loading"
    assert hashed_fully == [], "no separate read for verification"


def test_a_flipped_byte_is_refused_and_the_live_state_is_untouched(store):
    save(store, 3)
    save(store, 5)
    name = flip(store, 5)
    live = {k: torch.full_like(v, 7) for k, v in state(5).items()}
    before = {k: v.clone() for k, v in live.items()}
    refused: list = []
    step, _, staged = load(store, live, refused)
    assert [s for s, _ in refused] == [5]
    assert name in refused[0][1] and "crc32c checksum" in refused[0][1]
    assert step == 3 and all(torch.equal(staged[k], v) for k, v in state(3).items())
    assert all(torch.equal(live[k], before[k]) for k in live), (
        "a refused checkpoint wrote into the live state"
    )


def test_control_without_staging_the_refused_checkpoint_reaches_the_live_state(store, monkeypatch):
    """The planted bug: load straight into the live tensors. The refusal still happens (the hash
    is checked), but the corrupt file's items are already in the live state: the test above catches it."""
    monkeypatch.setattr(resolve, "_staging_like", lambda st: st)
    save(store, 5)
    flip(store, 5)
    live = {k: torch.full_like(v, 7) for k, v in state(5).items()}
    before = {k: v.clone() for k, v in live.items()}
    refused: list = []
    assert load(store, live, refused) is None and [s for s, _ in refused] == [5]
    assert not all(torch.equal(live[k], before[k]) for k in live)


def test_control_a_reader_that_does_not_hash_loads_the_flipped_byte(store, monkeypatch):
    """The planted bug: the verifying reader skips its hash. The flipped checkpoint then loads, so
    the refusal above comes from the hash while reading, not from anything else."""
    from trainer.checkpoint import read as ckpt_read

    monkeypatch.setattr(
        ckpt_read.VerifyingReader,
        "prepare_global_plan",
        lambda self, plans: [p.__class__(p.items, {"hash": []}, p.planner_data) for p in plans],
    )
    monkeypatch.setattr(resolve, "_all_hashed", lambda *a: None)
    save(store, 5)
    flip(store, 5)
    live = {k: torch.zeros_like(v) for k, v in state(5).items()}
    refused: list = []
    step, _, staged = load(store, live, refused)
    assert step == 5 and not refused
    assert not all(torch.equal(staged[k], v) for k, v in state(5).items()), "the flipped byte got through"


def test_a_file_no_item_is_read_from_is_still_hashed(store):
    """A partial load (here: one key of three) leaves files unread; rank 0 hashes those on their own."""
    save(store, 5)
    flip(store, 5)
    refused: list = []
    got = resolve_and_load(
        store,
        FP,
        lambda s, m: {"progress": torch.zeros(1, dtype=torch.int64)},
        lambda s, why: refused.append((s, why)),
    )
    assert got is None and [s for s, _ in refused] == [5] and "checksum" in refused[0][1]


@pytest.mark.parametrize("verified", [True, False], ids=["verified-kept", "control-none-verified"])
def test_retention_never_deletes_the_newest_verified_checkpoint(store, verified):
    """Step 1 read back (verified), steps 2-4 hashed while writing: keep_last=2 keeps 3 and 4, and
    step 1 as the newest verified one. The control, with nothing verified, deletes it."""
    attempt = store.claim_attempt({})
    for step in (1, 2, 3, 4):
        store.save(step, state(step), {"fingerprint": FP}, attempt, read_back=(step == 1 and verified))
    assert store.verified_step == (1 if verified else None)
    deleted = store.retain(2, 4)
    assert deleted == ([2] if verified else [1, 2])
    assert store.committed_steps() == ([4, 3, 1] if verified else [4, 3])


def test_a_resume_marks_what_it_loaded_as_verified(store):
    attempt = store.claim_attempt({})
    for step in (1, 2):
        store.save(step, state(step), {"fingerprint": FP}, attempt, read_back=False)
    fresh = Store(store.root_uri, store.run_id)
    assert fresh.verified_step is None
    got = resolve_and_load(
        fresh, FP, lambda s, m: {k: torch.zeros_like(v) for k, v in state(s).items()}, lambda s, why: None
    )
    assert got is not None and got[0] == 2 and fresh.verified_step == 2
