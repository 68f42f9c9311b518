"""Retention never deletes the checkpoint that has just committed, nor the newest verified one, whatever
keep_last is and whichever of them is newer: pinned before the checkpoint code moved into its package."""

from __future__ import annotations

import torch

from trainer.checkpoint.store import Store


def _save(store: Store, step: int, attempt: int, read_back: bool) -> None:
    state = {"w": torch.full((8,), float(step)), "progress": torch.tensor([step])}
    store.save(step, state, {"fingerprint": "f"}, attempt, read_back=read_back)


def test_the_newest_commit_survives_when_an_older_checkpoint_is_the_verified_one(tmp_path):
    store = Store(f"file://{tmp_path}", "run")
    attempt = store.claim_attempt({})
    _save(store, 10, attempt, read_back=True)  # verified (read back)
    _save(store, 12, attempt, read_back=False)
    _save(store, 14, attempt, read_back=False)  # the one that has just committed, not verified
    assert store.verified_step == 10
    deleted = store.retain(keep_last=1, newest=14, best_metric="")
    assert deleted == [12] and store.committed_steps() == [14, 10]


def test_the_newest_commit_survives_below_a_higher_numbered_checkpoint(tmp_path):
    """A resume that fell back past a (refused) step 99 commits 14: with keep_last 1 the listing's newest is
    99, and 14, just committed, must stay all the same."""
    store = Store(f"file://{tmp_path}", "run")
    attempt = store.claim_attempt({})
    for step in (10, 99):
        _save(store, step, attempt, read_back=True)
    _save(store, 14, attempt, read_back=False)
    store.verified_step = 10  # what this attempt's resume loaded
    deleted = store.retain(keep_last=1, newest=14, best_metric="")
    assert 14 not in deleted and 14 in store.committed_steps() and 10 in store.committed_steps()
