"""Hostile checkpoints: what an attacker with write access to the bucket can plant, run through every
reader (the resume, `compare`, `status`), from a real committed checkpoint of each format.

The assertions: no marker file is ever created (no code ran), no file appears outside the run's folders,
and each variant is refused with a reason (the resume falls back past it and finishes bit-identically to
the uninterrupted run). The controls show that each gadget does run code under plain `pickle.load`, and
that the old allowlist admitted it, so no test here can pass vacuously.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from tests.helpers import base_env, equal_count, model_and_optim, run, run_and_sigterm, tensors, trainer_cmd

TOTAL = 10
SETS = ("model.dropout=0.1", "checkpoint.every_steps=2", f"total_steps={TOTAL}", "checkpoint.keep_last=5")


# ---- gadgets -----------------------------------------------------------------------------------------


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"  # GLOBAL


def _str(text: str) -> bytes:
    data = text.encode()
    return b"X" + len(data).to_bytes(4, "little") + data  # BINUNICODE


def _call(fn: bytes, *args: bytes) -> bytes:
    return fn + b"(" + b"".join(args) + b"tR"  # MARK, args, TUPLE, REDUCE


def _pickle(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."  # PROTO 2, ..., STOP


def gadget_through_allowed_names(marker: Path) -> bytes:
    """os.system through `builtins.getattr` and `pathlib.PosixPath`, which the old allowlist admitted:
    getattr(getattr(getattr(getattr(PosixPath, "__new__"), "__globals__"), "get")("os"), "system")(...)."""
    getattr_ = _global("builtins", "getattr")
    new = _call(getattr_, _global("pathlib", "PosixPath"), _str("__new__"))
    module_globals = _call(getattr_, new, _str("__globals__"))
    os_module = _call(_call(getattr_, module_globals, _str("get")), _str("os"))
    return _pickle(_call(_call(getattr_, os_module, _str("system")), _str(f"touch {marker}")))


def gadget_direct(marker: Path) -> bytes:
    return _pickle(_call(_global("os", "system"), _str(f"touch {marker}")))


OLD_ALLOWLIST_EXTRAS = {
    ("builtins", "getattr"),
    ("pathlib", "PosixPath"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("collections", "OrderedDict"),
}


def test_the_gadgets_run_code_under_plain_pickle_and_under_the_old_allowlist(tmp_path, monkeypatch):
    """The controls: each gadget creates its marker when unpickled plainly, and the chain through
    getattr and PosixPath got past the allowlist as it was before this fix."""
    from trainer.checkpoint import read as ckpt_read

    for i, make in enumerate((gadget_through_allowed_names, gadget_direct)):
        marker = tmp_path / f"plain-{i}"
        pickle.loads(make(marker))
        assert marker.exists(), make.__name__
    marker = tmp_path / "old-allowlist"
    monkeypatch.setattr(ckpt_read, "_ALLOWED_GLOBALS", ckpt_read._ALLOWED_GLOBALS | OLD_ALLOWLIST_EXTRAS)
    monkeypatch.setattr(ckpt_read, "_enum_member", getattr)  # the old allowlist gave the real getattr
    try:
        ckpt_read._MetadataUnpickler(io.BytesIO(gadget_through_allowed_names(marker))).load()
    except Exception:  # noqa: BLE001 - the result of os.system is not metadata; the marker is what counts
        pass
    assert marker.exists(), "the old allowlist let the chain through"


def test_the_allowlist_refuses_every_gadget(tmp_path):
    from trainer.checkpoint.read import CorruptCheckpoint, _MetadataUnpickler

    for make in (gadget_through_allowed_names, gadget_direct):
        marker = tmp_path / make.__name__
        with pytest.raises(CorruptCheckpoint, match="which a DCP checkpoint never needs"):
            _MetadataUnpickler(io.BytesIO(make(marker))).load()
        assert not marker.exists()


def _enum_by_name(obj: object) -> bytes:
    """`obj` pickled as Python 3.11.0-3.11.2 pickle enum members: getattr(cls, name) (Debian bookworm's 3.11.2,
    the image's Python, does; 3.11.7 writes cls(value))."""
    import enum

    class Pickler(pickle.Pickler):
        def reducer_override(self, o):
            if isinstance(o, enum.Enum):
                return getattr, (type(o), o.name)
            return NotImplemented

    out = io.BytesIO()
    Pickler(out, protocol=pickle.DEFAULT_PROTOCOL).dump(obj)  # as DCP writes .metadata
    return out.getvalue()


def test_metadata_with_enums_pickled_by_name_is_read_and_getattr_reaches_nothing_else(tmp_path):
    """A .metadata written by Python 3.11.2 (baton's image; compare refused every checkpoint the image's trainer
    wrote, seen on the local cluster's real node) reads as the same Metadata. getattr stays refused for anything
    but a member of the allowed enum: another attribute of that enum, an attribute of another allowed class.
    The control: each refused form reaches the attribute under plain pickle."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    from trainer.checkpoint.read import CorruptCheckpoint, _MetadataUnpickler

    dcp.save(
        {"w": torch.ones(3)}, storage_writer=FsspecWriter(str(tmp_path / "ckpt")), no_dist=True
    )  # as Store does
    raw = (tmp_path / "ckpt" / ".metadata").read_bytes()
    plain = _MetadataUnpickler(io.BytesIO(raw)).load()
    by_name = _enum_by_name(plain)
    assert b"getattr" in by_name and b"getattr" not in raw
    assert _MetadataUnpickler(io.BytesIO(by_name)).load() == plain
    getattr_ = _global("builtins", "getattr")
    enum_class = _global("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING")
    for target, attr in (
        (enum_class, "__class__"),
        (enum_class, "_member_map_"),
        (_global("torch", "Size"), "__new__"),
    ):
        data = _pickle(_call(getattr_, target, _str(attr)))
        assert pickle.loads(data) is not None  # plain pickle hands out the attribute
        with pytest.raises(CorruptCheckpoint, match="no member of an enum a DCP checkpoint holds"):
            _MetadataUnpickler(io.BytesIO(data)).load()
    member = _pickle(_call(getattr_, enum_class, _str("TORCH_CONTIGUOUS_FORMAT")))
    assert _MetadataUnpickler(io.BytesIO(member)).load() is _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT


# ---- a real DCP checkpoint, and its hostile variants ------------------------------------------------


@pytest.fixture(scope="module")
def dcp_runs(tiny_model, tmp_path_factory):
    """The uninterrupted reference, and a run stopped by SIGTERM at step 6 (commits 2, 4 and 6)."""
    ref = tmp_path_factory.mktemp("hostile-ref")
    rc, _, err = run(trainer_cmd(tiny_model, ref, *SETS))
    assert rc == 0, err
    stopped = tmp_path_factory.mktemp("hostile-stopped") / "bucket"
    rc, _, err = run_and_sigterm(trainer_cmd(tiny_model, stopped, *SETS), at_step=6)
    assert rc == 75, err
    return ref, stopped


def _run_dir(bucket: Path) -> Path:
    (run_dir,) = (bucket / "runs").iterdir()
    return run_dir


def _rewrite_manifest(folder: Path, edit) -> None:
    """Rewrite manifest.json through `edit(manifest) -> text` and re-seal _COMMIT to match: what an
    attacker who can write both does."""
    manifest = json.loads((folder / "manifest.json").read_text())
    text = edit(manifest)
    (folder / "manifest.json").write_text(text)
    commit = json.loads((folder / "_COMMIT").read_text())
    commit["manifest_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    (folder / "_COMMIT").write_text(json.dumps(commit))


def _replace_metadata(folder: Path, data: bytes, reseal: bool) -> None:
    (folder / ".metadata").write_bytes(data)
    if reseal:

        def edit(m):
            m["files"][".metadata"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            return json.dumps(m)

        _rewrite_manifest(folder, edit)


def _metadata_pointing_at(folder: Path, relative_path: str) -> bytes:
    """The folder's real .metadata with one data file's location changed (re-pickled with DCP's classes)."""
    import dataclasses

    from trainer.checkpoint.read import _MetadataUnpickler

    md = _MetadataUnpickler(io.BytesIO((folder / ".metadata").read_bytes())).load()
    key = next(iter(md.storage_data))
    md.storage_data[key] = dataclasses.replace(md.storage_data[key], relative_path=relative_path)
    return pickle.dumps(md)


def plant(variant: str, folder: Path, marker: Path) -> str:
    """Make `folder` (a committed step) hostile; returns what its refusal must say."""
    size = (folder / ".metadata").stat().st_size
    if variant == "gadget padded to size":
        data = gadget_through_allowed_names(marker)
        _replace_metadata(folder, data + b"\0" * (size - len(data)), reseal=False)
        return "fails its sha256 checksum"
    if variant == "gadget, manifest rewritten":
        _replace_metadata(folder, gadget_through_allowed_names(marker), reseal=True)
        return "pathlib.PosixPath, which a DCP checkpoint never needs"
    if variant == "direct gadget, manifest rewritten":
        _replace_metadata(folder, gadget_direct(marker), reseal=True)
        return "which a DCP checkpoint never needs"
    if variant == "metadata reads outside":
        _replace_metadata(folder, _metadata_pointing_at(folder, "../../../outside.distcp"), reseal=True)
        return "not a plain file name"
    if variant == "commit not an object":
        (folder / "_COMMIT").write_text("[1, 2, 3]")
        return "_COMMIT is not a JSON object"
    if variant == "manifest not an object":
        _rewrite_manifest(folder, lambda m: "42")
        return "manifest.json is not a JSON object"
    if variant == "entry without size":

        def edit(m):
            del m["files"][".metadata"]["size"]
            return json.dumps(m)

        _rewrite_manifest(folder, edit)
        return "'size' must be a non-negative integer"
    if variant in ("traversal name", "absolute name"):
        name = "../../../escape.distcp" if variant == "traversal name" else str(marker.parent / "abs.distcp")

        def edit(m):
            m["files"][name] = {"size": 1, "sha256": "0" * 64}
            return json.dumps(m)

        _rewrite_manifest(folder, edit)
        return "not a plain file name"
    if variant == "huge step":
        commit = json.loads((folder / "_COMMIT").read_text())
        commit["step"] = 10**30
        (folder / "_COMMIT").write_text(json.dumps(commit))
        return "_COMMIT says step 1000000000000000000000000000000"
    raise AssertionError(variant)


VARIANTS = [
    "gadget padded to size",
    "gadget, manifest rewritten",
    "direct gadget, manifest rewritten",
    "metadata reads outside",
    "commit not an object",
    "manifest not an object",
    "entry without size",
    "traversal name",
    "absolute name",
    "huge step",
]


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_hostile_dcp_checkpoint_is_refused_by_every_reader(variant, dcp_runs, tmp_path, monkeypatch):
    from steps.compare import compare
    from trainer.checkpoint import CorruptCheckpoint
    from trainer.checkpoint.store import Store
    from workflows.argo import committed_steps

    _, stopped = dcp_runs
    root = tmp_path / "root"
    shutil.copytree(stopped, root / "trial")
    marker = tmp_path / "marker"
    folder = _run_dir(root / "trial") / "step-00000006"
    reason = plant(variant, folder, marker)
    shutil.copytree(stopped, root / "reference")
    before = set(tmp_path.rglob("*"))
    store = Store(str(root / "trial"), folder.parent.name)
    # The resume's path: the manifest, then .metadata's shapes (its sha256 first), then the verified load.
    with pytest.raises(CorruptCheckpoint, match=reason.replace("(", r"\(").replace(")", r"\)")[:60]):
        manifest = store.read_manifest(6)
        store.shapes(6, manifest)
        store.load_verified(6, manifest, {})
    # compare: a verdict naming the role, not a traceback.
    result = compare(str(root / "reference"), str(root / "reference"), str(root / "trial"))
    assert result["equivalent"] is False and result["problem"].startswith("trial: "), result
    # status: lists what is committed, reads nothing it would have to trust.
    assert committed_steps(str(root), "trial")[folder.parent.name] == [6, 4, 2]
    assert not marker.exists(), "code from the bucket ran"
    assert set(tmp_path.rglob("*")) == before, "a reader wrote something"


def test_the_checksum_of_metadata_is_checked_before_anything_is_unpickled(dcp_runs, tmp_path, monkeypatch):
    """With the allowlist as permissive as it was, the padded gadget still runs nothing, because its
    sha256 is checked first. Control: without a manifest (a bare DCP folder) the same permissive
    allowlist runs it."""
    from trainer.checkpoint import CorruptCheckpoint, load_flat
    from trainer.checkpoint import read as ckpt_read
    from trainer.checkpoint.store import Store

    _, stopped = dcp_runs
    shutil.copytree(stopped, tmp_path / "bucket")
    folder = _run_dir(tmp_path / "bucket") / "step-00000006"
    marker = tmp_path / "marker"
    plant("gadget padded to size", folder, marker)
    monkeypatch.setattr(ckpt_read, "_ALLOWED_GLOBALS", ckpt_read._ALLOWED_GLOBALS | OLD_ALLOWLIST_EXTRAS)
    monkeypatch.setattr(ckpt_read, "_enum_member", getattr)  # the old allowlist gave the real getattr
    store = Store(str(tmp_path / "bucket"), folder.parent.name)
    manifest = store.read_manifest(6)
    with pytest.raises(CorruptCheckpoint, match="sha256"):
        store.shapes(6, manifest)
    with pytest.raises(CorruptCheckpoint, match="sha256"):
        load_flat(f"file://{folder}", manifest["files"])
    assert not marker.exists()
    with pytest.raises(Exception):  # noqa: B017 - whatever the gadget's return value makes DCP raise
        load_flat(f"file://{folder}")
    assert marker.exists(), "control: unchecked and permissive, the gadget runs"


def test_step_folders_the_listing_and_retention_must_ignore(dcp_runs, tmp_path):
    """Non-ASCII digits, a number of the wrong width, and a symlink to a folder outside the run: none is
    listed, none takes a keep_last slot, and retention deletes nothing through the link."""
    from trainer.checkpoint.store import Store
    from workflows.argo import committed_steps

    _, stopped = dcp_runs
    shutil.copytree(stopped, tmp_path / "bucket")
    run_dir = _run_dir(tmp_path / "bucket")
    for name in ("step-٠٠٠٠٠٠٩٩", "step-000000099", "step-99"):
        shutil.copytree(run_dir / "step-00000002", run_dir / name)
    outside = tmp_path / "outside"
    shutil.copytree(run_dir / "step-00000002", outside)
    (run_dir / "step-00000098").symlink_to(outside, target_is_directory=True)
    store = Store(str(tmp_path / "bucket"), run_dir.name)
    assert store.committed_steps() == [6, 4, 2]
    assert committed_steps(str(tmp_path), "bucket") == {run_dir.name: [6, 4, 2]}
    # Retention after a (pretend) commit at 8 with keep_last 2: 2 goes, and nothing else.
    shutil.copytree(run_dir / "step-00000006", run_dir / "step-00000008")
    (run_dir / "step-00000008" / "_COMMIT").write_text(
        (run_dir / "step-00000006" / "_COMMIT").read_text().replace('"step": 6', '"step": 8')
    )
    assert store.retain(2, newest=8, best_metric="") == [2, 4]
    assert (outside / "_COMMIT").is_file() and (run_dir / "step-00000098").is_symlink()
    assert all((run_dir / n / "_COMMIT").is_file() for n in ("step-٠٠٠٠٠٠٩٩", "step-000000099", "step-99"))


def test_a_resume_falls_back_past_every_hostile_checkpoint_and_finishes_bit_identically(
    dcp_runs, tiny_model, tmp_path
):
    """End to end: step 6 holds the gadget with its manifest rewritten; a copy of step 4 sealed as step
    99 (its progress says 4); a step folder symlinked outside; a folder of non-ASCII digits. The resume
    refuses 99 and 6 with their reasons, resumes from 4, and its final checkpoint equals the reference's."""
    ref, stopped = dcp_runs
    bucket = tmp_path / "bucket"
    shutil.copytree(stopped, bucket)
    run_dir = _run_dir(bucket)
    marker = tmp_path / "marker"
    plant("gadget, manifest rewritten", run_dir / "step-00000006", marker)
    shutil.copytree(run_dir / "step-00000004", run_dir / "step-00000099")
    forged = run_dir / "step-00000099"

    def as_99(m):
        m["step"] = 99
        return json.dumps(m)

    _rewrite_manifest(forged, as_99)
    commit = json.loads((forged / "_COMMIT").read_text())
    (forged / "_COMMIT").write_text(json.dumps({**commit, "step": 99}))
    outside = tmp_path / "outside"
    shutil.copytree(run_dir / "step-00000002", outside)
    (run_dir / "step-00000098").symlink_to(outside, target_is_directory=True)
    shutil.copytree(run_dir / "step-00000002", run_dir / "step-٠٠٠٠٠١٠٠")
    rc, recs, err = run(trainer_cmd(tiny_model, bucket, *SETS), env=base_env())
    assert rc == 0, err[-3000:]
    refused = {r["step"]: r["reason"] for r in recs if r["event"] == "checkpoint_refused"}
    assert "holds progress for step 4" in refused[99] and "pathlib.PosixPath" in refused[6], refused
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [4]
    assert not marker.exists() and (outside / "_COMMIT").is_file()
    equal, n = equal_count(model_and_optim(tensors(ref, TOTAL)), model_and_optim(tensors(bucket, TOTAL)))
    assert equal == n > 50


# ---- the HF checkpoint-N format ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_runs(tiny_model, tmp_path_factory):
    """The HF example uninterrupted, and stopped by SIGTERM at step 7 (commits 5 and 7)."""
    from tests.unit.test_hf import hf_cmd
    from tests.unit.test_hf import run as hf_run

    ref = f"file://{tmp_path_factory.mktemp('hf-hostile-ref')}/bucket"
    rc, _, err = hf_run(hf_cmd(tiny_model, ref))
    assert rc == 0, err[-3000:]
    stopped = tmp_path_factory.mktemp("hf-hostile-stopped") / "bucket"
    rc, _, err = run_and_sigterm(hf_cmd(tiny_model, f"file://{stopped}"), at_step=7)
    assert rc == 75, err[-3000:]
    return ref, stopped


def _reseal_hf(folder: Path, edit) -> None:
    manifest = json.loads((folder / "_COMMIT").read_text())
    (folder / "_COMMIT").write_text(edit(manifest))


def plant_hf(variant: str, folder: Path, marker: Path) -> str:
    if variant in ("traversal name", "absolute name"):
        name = "../../../escape.pth" if variant == "traversal name" else str(marker.parent / "abs.pth")
        evil = folder / name if variant == "traversal name" else Path(name)
        evil.parent.mkdir(parents=True, exist_ok=True)
        evil.write_bytes(gadget_direct(marker))

        def edit(m):
            m["files"][name] = {
                "size": evil.stat().st_size,
                "sha256": hashlib.sha256(evil.read_bytes()).hexdigest(),
            }
            return json.dumps(m)

        _reseal_hf(folder, edit)
        return "not a plain file name"
    if variant == "commit not an object":
        (folder / "_COMMIT").write_text('"files"')
        return "_COMMIT is not a JSON object"
    if variant == "entry without size":

        def edit(m):
            del m["files"]["optimizer.pt"]["size"]
            return json.dumps(m)

        _reseal_hf(folder, edit)
        return "'size' must be a non-negative integer"
    if variant == "gadget in optimizer.pt":
        data = gadget_through_allowed_names(marker)
        (folder / "optimizer.pt").write_bytes(data)

        def edit(m):
            m["files"]["optimizer.pt"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            return json.dumps(m)

        _reseal_hf(folder, edit)
        return "optimizer.pt cannot be loaded safely"
    raise AssertionError(variant)


HF_VARIANTS = [
    "traversal name",
    "absolute name",
    "commit not an object",
    "entry without size",
    "gadget in optimizer.pt",
]


@pytest.mark.parametrize("variant", HF_VARIANTS)
def test_each_hostile_hf_checkpoint_is_refused_by_the_resume_and_by_compare(variant, hf_runs, tmp_path):
    from steps.lib.hf_checkpoint import compare_hf
    from trainer.checkpoint import CorruptCheckpoint
    from trainer.checkpoint.hf_store import HFStore

    _, stopped = hf_runs
    bucket = tmp_path / "bucket"
    shutil.copytree(stopped, bucket)
    marker = tmp_path / "marker"
    reason = plant_hf(variant, bucket / "checkpoint-7", marker)
    local = tmp_path / "scratch" / "a" / "b" / "local"
    store = HFStore(f"file://{bucket}", str(local))
    before = set(tmp_path.rglob("*"))
    with pytest.raises(CorruptCheckpoint, match=reason):
        store.fetch(7)
    result = compare_hf(f"file://{bucket}", f"file://{bucket}", f"file://{bucket}")
    assert result["equivalent"] is False and reason.split(" ")[-1] in result["problem"], result
    assert not marker.exists(), "code from the bucket ran"
    written = set(tmp_path.rglob("*")) - before
    assert all(local in p.parents or p == local or p in local.parents for p in written), sorted(written)
    assert store.fetch(5) == str(local / "checkpoint-5")  # the one before is intact, and fetched


def test_the_optimizer_gadget_would_run_under_plain_torch_load(tmp_path):
    """Control for the gadget in optimizer.pt: torch.load without weights_only runs it."""
    import torch

    path, marker = tmp_path / "optimizer.pt", tmp_path / "marker"
    path.write_bytes(gadget_through_allowed_names(marker))
    with pytest.raises(RuntimeError, match="magic number"):  # the legacy format's first pickle: the gadget
        torch.load(path, weights_only=False)
    assert marker.exists()


def test_hf_folders_the_listing_and_retention_must_ignore(hf_runs, tmp_path):
    from trainer.checkpoint.hf_store import HFStore

    _, stopped = hf_runs
    bucket = tmp_path / "bucket"
    shutil.copytree(stopped, bucket)
    for name in ("checkpoint-٩٩", "checkpoint-99999999999999999999", "checkpoint-1x"):
        shutil.copytree(bucket / "checkpoint-5", bucket / name)
    outside = tmp_path / "outside"
    shutil.copytree(bucket / "checkpoint-5", outside)
    (bucket / "checkpoint-98").symlink_to(outside, target_is_directory=True)
    store = HFStore(f"file://{bucket}", str(tmp_path / "local"))
    assert store.committed_steps() == [7, 5]
    store.retain(keep_last=1)
    assert store.committed_steps() == [7] and (outside / "_COMMIT").is_file()


def test_a_stale_local_copy_is_never_used(hf_runs, tmp_path):
    """Fetched from a bucket: the local folder is cleared first (a stale extra file is gone). Committed in
    place: a file beside the committed ones that _COMMIT does not list is removed before the Trainer
    could load it. Control for both: the stale file was there before the fetch."""
    from trainer.checkpoint.hf_store import HFStore

    _, stopped = hf_runs
    bucket, local = tmp_path / "bucket", tmp_path / "local"
    shutil.copytree(stopped, bucket)
    stale = local / "checkpoint-7" / "scaler.pt"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"stale")
    path = HFStore(f"file://{bucket}", str(local)).fetch(7)
    listed = set(json.loads((bucket / "checkpoint-7" / "_COMMIT").read_text())["files"])
    assert set(os.listdir(path)) == listed and not stale.exists()
    in_place = tmp_path / "in-place"
    shutil.copytree(stopped, in_place)
    stale = in_place / "checkpoint-7" / "scaler.pt"
    stale.write_bytes(b"stale")
    store = HFStore(str(in_place), str(in_place))
    assert store.in_place
    path = store.fetch(7)
    assert set(os.listdir(path)) == listed | {"_COMMIT"} and not stale.exists()


def test_an_hf_resume_falls_back_past_a_traversal_commit_and_finishes_bit_identically(
    hf_runs, tiny_model, tmp_path
):
    from steps.lib.hf_checkpoint import compare_flat
    from tests.unit.test_hf import final, hf_cmd
    from tests.unit.test_hf import run as hf_run

    ref, stopped = hf_runs
    bucket = tmp_path / "deep" / "er" / "bucket"
    shutil.copytree(stopped, bucket)
    marker = tmp_path / "marker"
    plant_hf("traversal name", bucket / "checkpoint-7", marker)
    shutil.copytree(bucket / "checkpoint-5", bucket / "checkpoint-٩٩")
    local = tmp_path / "deep" / "local"
    rc, recs, err = hf_run(
        hf_cmd(tiny_model, f"file://{bucket}"), env=base_env(BATON_HF_OUTPUT_DIR=str(local))
    )
    assert rc == 0, err[-3000:]
    refused = {r["step"]: r["reason"] for r in recs if r["event"] == "checkpoint_refused"}
    assert "not a plain file name" in refused[7]
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [5]
    landing = (local / "checkpoint-7" / "../../../escape.pth").resolve()  # where the old fetch wrote it
    assert landing == tmp_path / "escape.pth" and not landing.exists() and not marker.exists()
    _, (a, _) = final(ref)
    _, (b, _) = final(f"file://{bucket}")
    assert compare_flat(a, b)[1] == []


# ---- the second round: files that hang, exhaust or recurse (trainer/untrusted.py) ---------------------

DEEP = "[" * 20_000 + "]" * 20_000


def test_a_resume_falls_back_past_a_fifo_commit_and_a_deep_manifest_and_finishes_bit_identically(
    dcp_runs, tiny_model, tmp_path
):
    """Step 6's _COMMIT is a FIFO (a plain open blocks for ever, and SIGTERM cannot end it); step 4's
    manifest nests 20,000 deep and is resealed (json.loads raises RecursionError, which was a traceback
    and exit 1 at every restart). The resume refuses both by name, resumes from 2 and ends bit-identical."""
    from tests.unit.test_untrusted import blocks_on_plain_open

    ref, stopped = dcp_runs
    bucket = tmp_path / "bucket"
    shutil.copytree(stopped, bucket)
    run_dir = _run_dir(bucket)
    (run_dir / "step-00000006" / "_COMMIT").unlink()
    os.mkfifo(run_dir / "step-00000006" / "_COMMIT")
    assert blocks_on_plain_open(run_dir / "step-00000006" / "_COMMIT"), (
        "control: the FIFO blocks a plain open"
    )
    _rewrite_manifest(run_dir / "step-00000004", lambda m: DEEP)
    with pytest.raises(RecursionError):  # the control for the manifest
        json.loads((run_dir / "step-00000004" / "manifest.json").read_text())
    rc, recs, err = run(trainer_cmd(tiny_model, bucket, *SETS), env=base_env())
    assert rc == 0, err[-3000:]
    refused = {r["step"]: r["reason"] for r in recs if r["event"] == "checkpoint_refused"}
    assert "not a regular file (a FIFO)" in refused[6] and "nests deeper" in refused[4], refused
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [2]
    equal, n = equal_count(model_and_optim(tensors(ref, TOTAL)), model_and_optim(tensors(bucket, TOTAL)))
    assert equal == n > 50


def test_an_hf_checkpoint_with_one_byte_flipped_and_its_size_kept_is_refused(hf_runs, tmp_path):
    """A fetch that compared sizes alone would take it: the sizes match (the control); the sha256 does not."""
    from trainer.checkpoint import CorruptCheckpoint
    from trainer.checkpoint.hf_store import HFStore

    _, stopped = hf_runs
    bucket = tmp_path / "bucket"
    shutil.copytree(stopped, bucket)
    target = bucket / "checkpoint-7" / "optimizer.pt"
    data = bytearray(target.read_bytes())
    data[len(data) // 2] ^= 0x01
    target.write_bytes(bytes(data))
    listed = json.loads((bucket / "checkpoint-7" / "_COMMIT").read_text())["files"]["optimizer.pt"]
    assert listed["size"] == target.stat().st_size  # control: the size alone says nothing is wrong
    store = HFStore(f"file://{bucket}", str(tmp_path / "local"))
    with pytest.raises(CorruptCheckpoint, match="optimizer.pt does not match its size or sha256"):
        store.fetch(7)
    assert store.fetch(5) == str(tmp_path / "local" / "checkpoint-5")


def test_an_hf_checkpoint_with_a_deep_trainer_state_is_refused_before_the_trainer_parses_it(
    hf_runs, tmp_path
):
    from steps.lib.hf_checkpoint import compare_hf
    from trainer.checkpoint import CorruptCheckpoint
    from trainer.checkpoint.hf_store import HFStore

    _, stopped = hf_runs
    bucket = tmp_path / "bucket"
    shutil.copytree(stopped, bucket)
    state = bucket / "checkpoint-7" / "trainer_state.json"
    state.write_text(DEEP)

    def edit(m):
        m["files"]["trainer_state.json"] = {
            "size": len(DEEP),
            "sha256": hashlib.sha256(DEEP.encode()).hexdigest(),
        }
        return json.dumps(m)

    _reseal_hf(bucket / "checkpoint-7", edit)
    with pytest.raises(RecursionError):  # the control: what the Trainer's json.load does with it
        json.loads(state.read_text())
    with pytest.raises(CorruptCheckpoint, match="trainer_state.json nests deeper"):
        HFStore(f"file://{bucket}", str(tmp_path / "local")).fetch(7)
    result = compare_hf(f"file://{bucket}", f"file://{bucket}", f"file://{bucket}")
    assert result["equivalent"] is False and "nests deeper" in result["problem"], result
