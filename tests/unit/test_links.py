"""Nothing is written, renamed or deleted through a symbolic link in a file:// store (trainer/nofollow.py):
a link where a step's folder should be is foreign and only the link goes; a link at a file baton writes, or
above it inside the store, is refused. docs/checkpoints.md promises nothing outside the run's prefix is
ever deleted.

Each attack has its control: the plain fsspec call that the code made before (rm of `<step>/_COMMIT`,
open for writing, put_file) does reach through the same link and changes the folder outside.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import fsspec
import pytest
import torch

import trainer.checkpoint.store as store_module
import trainer.checkpoint.write as write_module
from trainer import nofollow
from trainer.checkpoint.hf_store import HFStore
from trainer.checkpoint.store import Store
from trainer.storage import StorageError

FP = "f" * 64


def _state(step: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((16,), float(step)), "progress": torch.tensor([step])}


def _outside(tmp_path: Path) -> Path:
    """A folder outside the store that looks like a committed checkpoint: what a link points at."""
    out = tmp_path / "outside"
    out.mkdir()
    (out / "_COMMIT").write_text("precious")
    (out / "data.bin").write_bytes(b"x" * 100)
    return out


def _store(tmp_path: Path) -> tuple[Store, int]:
    store = Store(f"file://{tmp_path}/bucket", "run")
    return store, store.claim_attempt({})


def _naive_delete(self: Store, path: str) -> None:
    """The old Store._delete: fsspec's rm of _COMMIT, then of the folder (it follows a link in the path)."""
    for target, recursive in ((f"{path}/_COMMIT", False), (path, True)):
        try:
            self.fs.rm(target, recursive=recursive)
        except (FileNotFoundError, OSError):
            pass


def test_a_step_folder_that_is_a_link_is_removed_as_a_link_and_the_save_commits(tmp_path, capsys):
    store, attempt = _store(tmp_path)
    outside = _outside(tmp_path)
    link = Path(store.step_path(10))
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    store.save(10, _state(10), {"fingerprint": FP}, attempt)
    assert (outside / "_COMMIT").read_text() == "precious" and sorted(p.name for p in outside.iterdir()) == [
        "_COMMIT",
        "data.bin",
    ]
    assert not link.is_symlink() and (link / "_COMMIT").is_file() and store.committed_steps() == [10]
    assert "step-00000010 was a symbolic link" in capsys.readouterr().err


def test_control_the_old_delete_reaches_through_the_link(tmp_path, monkeypatch):
    store, attempt = _store(tmp_path)
    outside = _outside(tmp_path)
    link = Path(store.step_path(10))
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside, target_is_directory=True)
    monkeypatch.setattr(store_module.Store, "_delete", _naive_delete)
    try:
        store.save(10, _state(10), {"fingerprint": FP}, attempt)
    except StorageError:
        pass  # whatever the save does next: the damage is done first
    assert not (outside / "_COMMIT").exists()  # deleted outside the bucket


def test_retention_and_replacing_never_delete_through_a_link(tmp_path):
    store, attempt = _store(tmp_path)
    for step in (2, 4):
        store.save(step, _state(step), {"fingerprint": FP}, attempt)
    outside = _outside(tmp_path)
    link = Path(store.step_path(3))  # a torn-looking step older than the newest: what retention clears
    link.symlink_to(outside, target_is_directory=True)
    store.save(6, _state(6), {"fingerprint": FP}, attempt)
    store.retain(keep_last=1, newest=6)
    store.delete_step(3)  # the store's own deletion of a step, given a link
    assert (outside / "_COMMIT").read_text() == "precious" and (outside / "data.bin").is_file()
    assert not link.exists() and not link.is_symlink() and store.committed_steps() == [6]


def test_a_link_above_the_step_inside_the_store_is_refused(tmp_path):
    outside = _outside(tmp_path)
    (tmp_path / "bucket" / "runs").mkdir(parents=True)
    (tmp_path / "bucket" / "runs" / "run").symlink_to(outside, target_is_directory=True)
    with pytest.raises(StorageError, match="is a symbolic link: baton writes and deletes through no link"):
        Store(f"file://{tmp_path}/bucket", "run")
    assert sorted(p.name for p in outside.iterdir()) == ["_COMMIT", "data.bin"]
    # Control: a real folder there is a store.
    (tmp_path / "bucket" / "runs" / "run").unlink()
    Store(f"file://{tmp_path}/bucket", "run")


def test_the_commit_markers_are_never_written_through_a_link(tmp_path):
    store, _ = _store(tmp_path)
    target = tmp_path / "outside.txt"
    target.write_text("precious")
    folder = Path(store.step_path(7))
    folder.mkdir(parents=True)
    (folder / "_COMMIT").symlink_to(target)
    with pytest.raises(nofollow.LinkRefused):
        store._write(str(folder / "_COMMIT"), "forged")
    assert target.read_text() == "precious"
    with fsspec.filesystem("file").open(str(folder / "_COMMIT"), "w") as f:  # control: the plain open follows
        f.write("forged")
    assert target.read_text() == "forged"


def test_dcps_files_are_never_written_into_a_link_put_in_the_folders_place(tmp_path, monkeypatch):
    """The step's folder becomes a link after the leftover was cleared (a race): DCP's writes are refused,
    nothing lands outside. Control: through fsspec's plain open, DCP's files land there."""
    store, attempt = _store(tmp_path)
    outside = _outside(tmp_path)
    link = Path(store.step_path(10))

    def plant(self: Store, path: str) -> None:
        link.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.symlink_to(outside, target_is_directory=True)

    monkeypatch.setattr(store_module.Store, "_delete", plant)
    with pytest.raises(StorageError):
        store.save(10, _state(10), {"fingerprint": FP}, attempt)
    assert sorted(p.name for p in outside.iterdir()) == ["_COMMIT", "data.bin"]
    monkeypatch.setattr(write_module, "is_local", lambda fs: False)  # the control: fsspec's own open
    try:
        store.save(10, _state(10), {"fingerprint": FP}, attempt)
    except StorageError:
        pass  # the damage is what is checked
    assert any(p.name.endswith(".distcp") for p in outside.iterdir())


def test_an_hf_upload_into_a_link_removes_the_link_and_writes_nothing_outside(tmp_path, capsys):
    local = tmp_path / "out"
    (local / "checkpoint-5").mkdir(parents=True)
    (local / "checkpoint-5" / "model.safetensors").write_bytes(b"m" * 64)
    bucket = tmp_path / "bucket"
    bucket.mkdir()
    outside = _outside(tmp_path)
    (bucket / "checkpoint-5").symlink_to(outside, target_is_directory=True)
    hf = HFStore(str(bucket), str(local))
    hf.commit(5, world_size=1)
    assert sorted(p.name for p in outside.iterdir()) == ["_COMMIT", "data.bin"]
    assert (outside / "_COMMIT").read_text() == "precious"
    assert (
        not (bucket / "checkpoint-5").is_symlink()
        and (bucket / "checkpoint-5" / "model.safetensors").is_file()
    )
    assert hf.committed_steps() == [5] and "checkpoint-5 was a symbolic link" in capsys.readouterr().err
    # Control: fsspec's put_file, what the upload used, writes through such a link.
    (bucket / "checkpoint-6").symlink_to(outside, target_is_directory=True)
    fsspec.filesystem("file").put_file(
        str(local / "checkpoint-5" / "model.safetensors"), str(bucket / "checkpoint-6" / "model.safetensors")
    )
    assert (outside / "model.safetensors").is_file()


def test_remove_says_what_it_removed(tmp_path):
    fs = fsspec.filesystem("file")
    assert nofollow.remove(fs, str(tmp_path / "none")) == "absent"
    (tmp_path / "f").write_text("x")
    assert nofollow.remove(fs, str(tmp_path / "f")) == "file"
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "_COMMIT").write_text("x")
    (tmp_path / "d" / "inner").symlink_to(_outside(tmp_path), target_is_directory=True)
    assert nofollow.remove(fs, str(tmp_path / "d"), first="_COMMIT") == "folder"
    assert (tmp_path / "outside" / "_COMMIT").is_file()  # a link inside the folder: only the link went
    shutil.rmtree(tmp_path / "outside")
