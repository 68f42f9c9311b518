"""A restart copies each tensor's bytes once, from the file into its staging tensor
(trainer/checkpoint/tensor_record.py, read.VerifyingReader): every path loads every tensor exactly, a
corrupt file still falls back, and a hostile archive gets torch.load's path or a refusal, never a
traceback, a hang or code run.

Each equivalence has its control: the reader's counters show which path ran, and a record placed one
element off is seen.
"""

from __future__ import annotations

import io
import pickle
import struct
import zipfile
from collections import Counter

import pytest
import torch

import trainer.checkpoint.read as read
import trainer.checkpoint.tensor_record as tensor_record
from trainer.checkpoint.resolve import LoadTimes, resolve_and_load
from trainer.checkpoint.store import Store

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
FP = "f" * 64


def state(step: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return {
        "w": torch.randn(64, 32, generator=g),
        "b": torch.randn(4096, generator=g),
        "half": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(float(step)),
        "empty": torch.zeros(0, 5),
        "progress": torch.tensor([step]),
    }


ITEMS = sum(v.numel() > 0 for v in state(0).values())  # DCP reads no item for a tensor with no elements


@pytest.fixture
def store(tmp_path):
    return Store(f"file://{tmp_path}/ck", "run-x", io_threads=2)


def save(store: Store, step: int) -> None:
    store.save(step, state(step), {"fingerprint": FP}, attempt=store.claim_attempt({}))


def load(store: Store) -> tuple[int, dict[str, torch.Tensor], list, Counter]:
    live = {k: torch.zeros_like(v) for k, v in state(0).items()}
    refused: list = []
    times = LoadTimes()
    found = resolve_and_load(
        store, FP, lambda step, manifest: live, lambda s, why: refused.append((s, why)), times=times
    )
    assert found is not None
    step, _, staged = found
    return step, staged, refused, times.copies


def archive(t: torch.Tensor, crc: bool = False) -> bytes:
    """torch.save's archive of `t`: without its records' CRC-32, as the checkpoint's writer threads
    save, or with (`crc`), which Python's zipfile needs to read it back."""
    torch.serialization.set_crc32_options(crc)
    try:
        buf = io.BytesIO()
        torch.save(t, buf)
        return buf.getvalue()
    finally:
        torch.serialization.set_crc32_options(True)


def place(raw: bytes, target: torch.Tensor) -> tensor_record.Record | None:
    """The in-memory path's lookup, as read.VerifyingReader._deliver makes it."""
    central = tensor_record.read_central(lambda n: raw[len(raw) - n :], len(raw))
    return tensor_record.locate(raw, central, target) if central is not None else None


# ---- every path loads every tensor exactly ----------------------------------------------------------


@pytest.mark.parametrize("path", ["direct", "buffered", "torch_load"])
def test_each_path_loads_every_tensor_exactly(store, monkeypatch, path):
    save(store, 5)
    if path != "direct":  # no descriptor: an object store's file, read into memory first
        monkeypatch.setattr(read, "_descriptor", lambda stream: None)
    if path == "torch_load":
        monkeypatch.setattr(tensor_record, "locate", lambda *a: None)
    step, staged, refused, copies = load(store)
    assert step == 5 and not refused
    for k, v in state(5).items():
        assert staged[k].dtype == v.dtype and torch.equal(staged[k], v), k
    # The control: the counters show the path under test ran for every tensor.
    assert copies[path] == ITEMS and sum(copies.values()) == ITEMS, copies


def test_control_a_record_placed_one_element_off_is_seen(store, monkeypatch):
    save(store, 5)
    real = tensor_record.locate

    def shifted(head, central, target):
        found = real(head, central, target)
        return found and tensor_record.Record(found.start + 4, found.size)

    monkeypatch.setattr(tensor_record, "locate", shifted)
    monkeypatch.setattr(read, "_descriptor", lambda stream: None)  # the buffered path: no checksum stops it
    _, staged, _, copies = load(store)
    assert copies["buffered"] == ITEMS
    assert not torch.equal(staged["w"], state(5)["w"])


def test_a_corrupt_last_file_falls_back_and_the_fallback_is_exact(store):
    save(store, 2)
    save(store, 4)
    names = sorted(n for n in store.fs.ls(store.step_path(4), detail=False) if n.endswith(".distcp"))
    data = bytearray(store.fs.cat_file(names[-1]))
    data[len(data) - 200] ^= 0x01  # near its end: the items before it are already in the staging copy
    store.fs.pipe_file(names[-1], bytes(data))
    step, staged, refused, copies = load(store)
    assert step == 2 and [s for s, _ in refused] == [4] and "checksum" in refused[0][1]
    for k, v in state(2).items():
        assert torch.equal(staged[k], v), k
    assert copies["direct"] >= ITEMS, copies  # step 2 itself came through the one-copy path


def test_control_an_intact_last_file_loads_the_newest(store):
    save(store, 2)
    save(store, 4)
    step, staged, refused, _ = load(store)
    assert step == 4 and not refused and torch.equal(staged["w"], state(4)["w"])


# ---- what is not the plain layout goes through torch.load --------------------------------------------


@pytest.mark.parametrize(
    "tensor, target",
    [
        (torch.arange(10.0)[2:5], torch.empty(3)),  # a view: its whole storage is saved
        (torch.zeros(3, 4).t(), torch.empty(4, 3)),  # strides that are not contiguous
        (torch.arange(6.0), torch.empty(6, dtype=torch.float64)),  # another dtype: torch.load converts
        (torch.arange(6.0), torch.empty(2, 3)),  # another shape
    ],
)
def test_layouts_other_than_a_whole_contiguous_tensor_are_not_placed(tensor, target):
    assert place(archive(tensor), target) is None


def test_control_the_plain_layout_is_placed_where_its_bytes_are():
    t = torch.randn(5, 3)
    raw = archive(t)
    found = place(raw, torch.empty(5, 3))
    assert found is not None and raw[found.start : found.start + found.size] == t.numpy().tobytes()


def _rezip(raw: bytes, replace: dict[str, bytes]) -> bytes:
    """The archive `raw` written again with some records replaced (stored, as torch writes them)."""
    src = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            z.writestr(info.filename, replace.get(info.filename, src.read(info.filename)))
    return out.getvalue()


def test_control_a_rezipped_plain_archive_is_still_placed():
    t = torch.randn(4)
    raw = _rezip(archive(t, crc=True), {})
    found = place(raw, torch.empty(4))
    assert found is not None and raw[found.start : found.start + found.size] == t.numpy().tobytes()


def test_big_endian_bytes_are_not_placed():
    assert (
        place(_rezip(archive(torch.randn(4), crc=True), {"archive/byteorder": b"big"}), torch.empty(4))
        is None
    )


def test_a_second_storage_record_is_not_placed():
    raw = archive(torch.randn(4), crc=True)
    src = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            z.writestr(info.filename, src.read(info.filename))
        z.writestr("archive/data/1", b"\0" * 16)
    assert place(out.getvalue(), torch.empty(4)) is None


class _Plant:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_planted_pickle_runs_no_code(tmp_path):
    marker = tmp_path / "ran"
    planted = pickle.dumps(_Plant(str(marker)), protocol=2)
    raw = _rezip(archive(torch.randn(4), crc=True), {"archive/data.pkl": planted})
    assert place(raw, torch.empty(4)) is None
    assert not marker.exists()
    pickle.loads(planted)  # the control: the same bytes, unpickled plainly, run the code
    assert marker.exists()


def test_every_single_byte_change_and_truncation_is_handled():
    """No traceback and no out-of-range record, whatever one byte of the archive's structure says."""
    raw = archive(torch.randn(6, 2))
    target = torch.empty(6, 2)
    found = place(raw, target)
    assert found is not None
    placed = 0
    for i in [*range(0, found.start), *range(found.start + found.size, len(raw))]:
        for value in (0x00, 0xFF, raw[i] ^ 0x01):
            bad = bytearray(raw)
            bad[i] = value
            got = place(bytes(bad), target)
            if got is not None:
                placed += 1
                assert 0 <= got.start and got.start + got.size <= len(raw) and got.size == 48
    for n in range(len(raw)):
        got = place(raw[:n], target)
        assert got is None or got.start + got.size <= n
    assert placed > 0  # the control: bytes nothing reads (the timestamps, the CRCs) still place it


def test_a_huge_central_directory_claim_is_refused_before_it_is_read():
    raw = bytearray(archive(torch.randn(4)))
    eocd = len(raw) - tensor_record.EOCD.size
    fields = list(tensor_record.EOCD.unpack_from(raw, eocd))
    fields[5] = 0x7FFFFFFF  # cd_size
    struct.pack_into("<IHHHHIIH", raw, eocd, *fields)
    assert tensor_record.central_span(bytes(raw[eocd:]), len(raw)) is None
    fields[5], fields[6] = 100, 0  # a small directory said to start at the item's first byte
    struct.pack_into("<IHHHHIIH", raw, eocd, *fields)
    assert tensor_record.central_span(bytes(raw[eocd:]), 1 << 30) is None  # not a read of most of the item
    fields = list(tensor_record.EOCD.unpack_from(archive(torch.randn(4)), eocd))
    assert tensor_record.central_span(struct.pack("<IHHHHIIH", *fields), len(raw)) is not None  # the control
    fields[5], fields[3], fields[4] = 100, 65535, 65535  # entry count
    struct.pack_into("<IHHHHIIH", raw, eocd, *fields)
    assert tensor_record.central_directory(bytes(raw), len(raw)) is None


# ---- no inflation past a cap: a compressed record is refused before torch.load allocates it ---------------


def _deflated(raw: bytes) -> bytes:
    """`raw` (torch.save's archive) written again with its storage record deflated: what a forger who wants
    the reader to allocate far more than the file's bytes writes."""
    src = zipfile.ZipFile(io.BytesIO(raw))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for info in src.infolist():
            method = zipfile.ZIP_DEFLATED if info.filename.endswith("/data/0") else zipfile.ZIP_STORED
            z.writestr(info.filename, src.read(info.filename), compress_type=method, compresslevel=9)
    return out.getvalue()


def test_a_compressed_record_is_refused_and_a_plain_archive_is_not():
    raw = archive(torch.zeros(1 << 16), crc=True)
    assert tensor_record.bytes_problem(raw) is None  # the control: torch.save's own archive
    bomb = _deflated(raw)
    assert len(bomb) * 50 < len(raw)
    assert "is compressed (method 8)" in tensor_record.bytes_problem(bomb)
    assert torch.equal(
        torch.load(io.BytesIO(bomb), weights_only=True), torch.zeros(1 << 16)
    )  # torch inflates it


def test_records_declaring_more_than_the_archive_and_other_formats_are_refused():
    raw = bytearray(archive(torch.randn(8)))
    cd_offset = tensor_record.EOCD.unpack_from(raw, len(raw) - tensor_record.EOCD.size)[6]
    for field, value in ((20, 1 << 30), (24, 1 << 30)):  # one of the two sizes of the first record
        bad = bytearray(raw)
        struct.pack_into("<I", bad, cd_offset + field, value)
        assert "declares" in tensor_record.bytes_problem(bytes(bad))
    legacy = io.BytesIO()
    torch.save(torch.randn(8), legacy, _use_new_zipfile_serialization=False)
    assert tensor_record.bytes_problem(legacy.getvalue()) == "not a zip archive (torch.save's format)"


def test_every_single_byte_change_of_the_ends_is_handled_without_a_traceback():
    raw = archive(torch.randn(6, 2))
    cd_offset = tensor_record.EOCD.unpack_from(raw, len(raw) - tensor_record.EOCD.size)[6]
    refused = 0
    for i in [*range(0, 64), *range(cd_offset, len(raw))]:
        for value in (0x00, 0xFF, raw[i] ^ 0x01):
            bad = bytearray(raw)
            bad[i] = value
            refused += tensor_record.bytes_problem(bytes(bad)) is not None
    for n in range(len(raw)):
        tensor_record.bytes_problem(raw[:n])
    assert refused > 0


# torch.save's archive of 400 MB of zeros, written again with its storage record deflated (streamed: the
# measured process below never holds the 400 MB).
_BOMB = r"""
import sys, zipfile, torch
plain = sys.argv[1] + ".plain"
torch.save(torch.zeros(100 << 20), plain)
with zipfile.ZipFile(plain) as src, zipfile.ZipFile(sys.argv[1], "w") as out:
    for info in src.infolist():
        record = zipfile.ZipInfo(info.filename)
        record.compress_type = zipfile.ZIP_DEFLATED if info.filename.endswith("/data/0") else zipfile.ZIP_STORED
        with src.open(info) as fin, out.open(record, "w") as fout:
            while chunk := fin.read(1 << 20):
                fout.write(chunk)
"""
_RESUME_MEMORY = r"""
import io, json, pickle, sys, zipfile, hashlib, dataclasses
import torch
sys.path.insert(0, {repo!r})
from trainer.checkpoint.read import _MetadataUnpickler
from trainer.checkpoint.resolve import resolve_and_load
from trainer.checkpoint.store import Store
from trainer.checkpoint import digest

root, mode = sys.argv[1], sys.argv[2]
small = {{"w": torch.randn(16), "progress": torch.tensor([0])}}
store = Store("file://" + root, "run")
attempt = store.claim_attempt({{}})
for step in (2, 4):
    store.save(step, {{**small, "progress": torch.tensor([step])}}, {{"fingerprint": "f" * 64}}, attempt)
# Step 4: the item of "w" replaced by a deflated archive of 400 MB of zeros, every checksum resealed.
folder = store.step_path(4)
md = _MetadataUnpickler(io.BytesIO(open(folder + "/.metadata", "rb").read())).load()
key, info = next((k, v) for k, v in md.storage_data.items() if k.fqn == "w")
data = open(f"{{folder}}/{{info.relative_path}}", "rb").read()
bomb = open(sys.argv[3], "rb").read()
delta = len(bomb) - info.length
for k, v in list(md.storage_data.items()):
    if v.relative_path == info.relative_path and v.offset > info.offset:
        md.storage_data[k] = dataclasses.replace(v, offset=v.offset + delta)
md.storage_data[key] = dataclasses.replace(info, length=len(bomb))
new = data[:info.offset] + bomb + data[info.offset + info.length:]
open(f"{{folder}}/{{info.relative_path}}", "wb").write(new)
meta = pickle.dumps(md)
open(folder + "/.metadata", "wb").write(meta)
manifest = json.loads(open(folder + "/manifest.json").read())
manifest["files"][info.relative_path] = digest.entry(len(new), "crc32c", digest.of_bytes("crc32c", new))
manifest["files"][".metadata"] = digest.entry(len(meta), "sha256", digest.of_bytes("sha256", meta))
text = json.dumps(manifest)
open(folder + "/manifest.json", "w").write(text)
commit = json.loads(open(folder + "/_COMMIT").read())
commit["manifest_sha256"] = hashlib.sha256(text.encode()).hexdigest()
open(folder + "/_COMMIT", "w").write(json.dumps(commit))
def peak_kb():  # this process's own high-water mark: ru_maxrss starts at the parent's peak (kept through exec)
    return int(next(line for line in open("/proc/self/status") if line.startswith("VmHWM:")).split()[1])
before = peak_kb()
if mode == "control":  # what the reader did with the item before the check: torch.load of its bytes
    assert torch.load(io.BytesIO(bomb), weights_only=True).numel() == 100 << 20
    refused = []
else:
    refused = []
    found = resolve_and_load(Store("file://" + root, "run"), "f" * 64,
                             lambda step, manifest: {{k: torch.zeros_like(v) for k, v in small.items()}},
                             lambda s, why: refused.append((s, why)))
    assert found[0] == 2 and int(found[2]["progress"][0]) == 2, found
grown = peak_kb() - before
print(json.dumps({{"grown_kb": grown, "bomb": len(bomb), "refused": refused}}))
"""


@pytest.mark.parametrize("mode", ["resume", "control"])
def test_a_resume_refuses_a_compressed_item_without_inflating_it(tmp_path, mode):
    """The reader falls back past a checkpoint whose item declares 400 MB in a few hundred KB, and its memory
    stays within a few MB while it refuses; the control, torch.load of the same item, grows by the 400 MB."""
    import json
    import subprocess

    from tests.helpers import PY, REPO, base_env

    big = tmp_path / "zeros.pt"
    subprocess.run([PY, "-c", _BOMB, str(big)], check=True, env=base_env(), cwd=REPO, timeout=300)
    script = tmp_path / "resume.py"
    script.write_text(_RESUME_MEMORY.format(repo=str(REPO)))
    p = subprocess.run(
        [PY, str(script), str(tmp_path / "bucket"), mode, str(big)],
        capture_output=True,
        text=True,
        env=base_env(),
        cwd=REPO,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    if mode == "control":
        assert got["grown_kb"] > 350_000, got  # inflated to its declared size
    else:
        assert got["refused"] and got["refused"][0][0] == 4 and "is compressed" in got["refused"][0][1], got
        assert got["grown_kb"] < 32_000 and got["bomb"] < 2_000_000, got
