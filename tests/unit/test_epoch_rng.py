"""EpochRng (trainer/hf_rng.py) on its own: the epoch's RNG comes back only on a mid-epoch resume into the
same epoch, and a snapshot file of the wrong shape or types (the checkpoint is untrusted input) is left
unused with a warning, never a traceback. The drill-level proof, bit-identical with `group_by_length`
and its control without the file, is tests/workflow/test_certifier.py."""

from __future__ import annotations

import torch

from trainer.hf_rng import EPOCH_FILE, EpochRng, capture, restore


def _saved(folder, doc) -> None:
    torch.save(doc, folder / EPOCH_FILE.format(rank=0))


def test_the_epochs_rng_comes_back_only_inside_the_same_epoch(tmp_path):
    torch.manual_seed(7)
    at_epoch_start = capture()
    expected = torch.rand(4)  # what the sampler drew at the epoch's start
    _saved(tmp_path, {"epoch": 1, "state": at_epoch_start})
    torch.manual_seed(99)  # the resumed process starts elsewhere
    EpochRng(0, str(tmp_path)).begin(1.4)
    assert torch.equal(torch.rand(4), expected)
    # Controls: at an epoch boundary (1.0) or in another epoch, the process's own state stands.
    for position in (1.0, 2.5):
        torch.manual_seed(99)
        own = torch.rand(4)
        torch.manual_seed(99)
        EpochRng(0, str(tmp_path)).begin(position)
        assert torch.equal(torch.rand(4), own)


def test_a_snapshot_of_the_wrong_shape_or_types_is_left_unused(tmp_path, capsys):
    for doc in (
        [1, 2],
        {"epoch": "1", "state": {}},
        {"epoch": 1, "state": {"python": 5, "numpy": 1, "cpu": 0}},
    ):
        _saved(tmp_path, doc)
        torch.manual_seed(3)
        own = capture()
        rng = EpochRng(0, str(tmp_path))
        restore(own)
        rng.begin(1.5)  # no exception
        assert rng.current is not None and rng.current["epoch"] == 1
    assert "not an epoch RNG snapshot: not used" in capsys.readouterr().err
