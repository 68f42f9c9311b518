"""The data files' checksum algorithm (trainer/checkpoint/digest.py): recorded per file in the manifest,
every algorithm still read, `.metadata` always cryptographic, an unknown one refused.

In-process on file://, as tests/unit/test_verified_load.py (whose helpers these are). Each refusal has
its control: the same checkpoint, unaltered, loads.
"""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from tests.unit.test_verified_load import FP, flip, save, state
from trainer.checkpoint.digest import ALGORITHMS, CRYPTOGRAPHIC, expected, of_bytes
from trainer.checkpoint.resolve import resolve_and_load
from trainer.checkpoint.store import Store

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _load(store: Store) -> tuple[int | None, list[tuple[int, str]]]:
    live = {k: torch.zeros_like(v) for k, v in state(5).items()}
    refused: list[tuple[int, str]] = []
    got = resolve_and_load(store, FP, lambda step, manifest: live, lambda s, why: refused.append((s, why)))
    if got is not None:
        step, _, staged = got
        assert all(torch.equal(staged[k], v) for k, v in state(step).items())
        return step, refused
    return None, refused


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_algorithm_is_recorded_per_file_and_a_flipped_byte_is_refused(tmp_path, algorithm):
    store = Store(f"file://{tmp_path}/ck", "run", io_threads=2, digest_algorithm=algorithm)
    save(store, 3)
    save(store, 5)
    for name, entry in store.read_manifest(5)["files"].items():
        stored = store.fs.cat_file(f"{store.step_path(5)}/{name}")
        got, hexdigest = expected(entry, name)
        assert got == ("sha256" if name == ".metadata" else algorithm) and hexdigest == of_bytes(got, stored)
    assert _load(store) == (5, [])  # control: intact, it loads
    name = flip(store, 5)
    step, refused = _load(store)
    assert step == 3 and [s for s, _ in refused] == [5]
    assert name in refused[0][1] and f"fails its {algorithm} checksum" in refused[0][1]


def test_a_checkpoint_written_with_sha256_loads_under_the_default(tmp_path):
    """Every checkpoint written before the algorithm was recorded has sha256 entries only."""
    old = Store(f"file://{tmp_path}/ck", "run", io_threads=2, digest_algorithm="sha256")
    save(old, 5)
    assert all(set(e) - {"hashed"} == {"size", "sha256"} for e in old.read_manifest(5)["files"].values())
    new = Store(f"file://{tmp_path}/ck", "run", io_threads=2)
    assert new.digest == "crc32c"
    assert _load(new) == (5, [])
    new.verify_files(5, new.read_manifest(5))
    flip(new, 5)
    step, refused = _load(new)
    assert step is None and "fails its sha256 checksum" in refused[0][1]


def _reseal(store: Store, step: int, edit) -> None:
    """Rewrite manifest.json through `edit(manifest)` and re-seal _COMMIT to match."""
    folder = store.step_path(step)
    manifest = json.loads(store.fs.cat_file(f"{folder}/manifest.json"))
    edit(manifest)
    text = json.dumps(manifest)
    store.fs.pipe_file(f"{folder}/manifest.json", text.encode())
    commit = json.loads(store.fs.cat_file(f"{folder}/_COMMIT"))
    commit["manifest_sha256"] = hashlib.sha256(text.encode()).hexdigest()
    store.fs.pipe_file(f"{folder}/_COMMIT", json.dumps(commit).encode())
    store._manifests.clear()


def _data_file(manifest: dict) -> str:
    return next(n for n in manifest["files"] if n.endswith(".distcp"))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda m: m["files"][_data_file(m)].update(md5="0" * 32), "unknown checksum algorithm 'md5'"),
        (lambda m: m["files"][_data_file(m)].update(sha256="0" * 64), "exactly one checksum"),
        (lambda m: m["files"][_data_file(m)].pop("crc32c"), "exactly one checksum"),
        (lambda m: m["files"][_data_file(m)].update(crc32c="XYZ"), "is not 8 lowercase hex digits"),
        # .metadata is unpickled once it matches: a check that a forger can satisfy is refused for it
        (
            lambda m: m["files"].__setitem__(
                ".metadata", {"size": m["files"][".metadata"]["size"], "crc32c": "0" * 8}
            ),
            "crc32c is not accepted here",
        ),
    ],
)
def test_a_manifest_with_an_unusable_checksum_is_refused_and_the_loader_falls_back(tmp_path, edit, message):
    store = Store(f"file://{tmp_path}/ck", "run", io_threads=2)
    save(store, 3)
    save(store, 5)
    _reseal(store, 5, lambda m: None)  # control: resealed unchanged, it loads
    assert _load(store) == (5, [])
    _reseal(store, 5, edit)
    step, refused = _load(store)
    assert step == 3 and [s for s, _ in refused] == [5] and message in refused[0][1], refused


def test_metadata_is_checked_with_a_cryptographic_hash_whatever_the_data_files_use():
    assert set(CRYPTOGRAPHIC) == {"sha256", "blake3"} and "crc32c" not in CRYPTOGRAPHIC
    # crc32c is linear: a same-size forgery that matches it is a matter of arithmetic, so it guards only
    # against accidents. Here: two different 8-byte inputs, chosen, with the same crc32c.
    a = b"\x00" * 8
    crc = int(of_bytes("crc32c", a), 16)
    forged = _crc32c_preimage(crc, prefix=b"\x01\x02\x03\x04")
    assert forged != a and len(forged) == len(a) and of_bytes("crc32c", forged) == of_bytes("crc32c", a)
    assert of_bytes("sha256", forged) != of_bytes("sha256", a)


def _crc32c_preimage(target: int, prefix: bytes) -> bytes:
    """`prefix` + 4 bytes whose crc32c is `target`: found by solving the 32 linear equations over GF(2)
    that the 4 free bytes satisfy (crc32c(x ^ y) = crc32c(x) ^ crc32c(y) ^ crc32c(0) for equal lengths)."""

    def crc(b: bytes) -> int:
        return int(of_bytes("crc32c", b), 16)

    base = prefix + b"\0" * 4
    zero = crc(b"\0" * len(base))
    cols = []  # the crc contribution of each of the 32 free bits
    for bit in range(32):
        tail = (1 << bit).to_bytes(4, "little")
        cols.append(crc(b"\0" * len(prefix) + tail) ^ zero)
    want = target ^ crc(base) ^ zero ^ zero  # crc(base ^ e) = crc(base) ^ crc(e) ^ zero
    # Gaussian elimination over GF(2): find bits x with XOR of cols[i] for x_i = 1 equal to `want`.
    rows = [(cols[i], 1 << i) for i in range(32)]
    basis: list[tuple[int, int]] = []
    for v, m in rows:
        for bv, bm in basis:
            if v ^ bv < v:
                v, m = v ^ bv, m ^ bm
        if v:
            basis.append((v, m))
            basis.sort(reverse=True)
    v, m = want, 0
    for bv, bm in basis:
        if v ^ bv < v:
            v, m = v ^ bv, m ^ bm
    assert v == 0, "no solution"
    return prefix + m.to_bytes(4, "little")


def _zip_crcs(data: bytes) -> list[int]:
    """The CRC-32 of every record in the zip central directories of a .distcp file (each tensor is a
    torch.save archive): field at offset 16 of each `PK\\x01\\x02` header."""
    import struct

    out, i = [], data.find(b"PK\x01\x02")
    while i != -1:
        out.append(struct.unpack("<I", data[i + 16 : i + 20])[0])
        i = data.find(b"PK\x01\x02", i + 4)
    return out


def test_saves_skip_torch_saves_zip_crc_and_archives_with_it_still_load(tmp_path):
    from trainer.checkpoint import write

    store = Store(f"file://{tmp_path}/ck", "run", io_threads=2)  # two writer threads: each must skip it
    save(store, 3)
    skip = write.skip_archive_crc32
    write.skip_archive_crc32 = lambda: None  # control: archives written as before this change
    try:
        save(store, 5)
    finally:
        write.skip_archive_crc32 = skip

    def crcs(step: int) -> list[int]:
        files = [n for n in store.fs.ls(store.step_path(step), detail=False) if n.endswith(".distcp")]
        return [c for n in files for c in _zip_crcs(store.fs.cat_file(n))]

    assert crcs(3) and set(crcs(3)) == {0}  # no CRC computed: the manifest's crc32c covers every byte
    assert any(crcs(5))  # the control's archives carry theirs, so the scan above can see one
    assert _load(store) == (5, [])
    store._delete(store.step_path(5))
    assert _load(store) == (3, [])  # the archives without a CRC load, exactly
    flip(store, 3)
    assert _load(store)[0] is None  # and a flipped byte in them is still refused, by the manifest


def test_crc32c_is_the_standard_crc32c_over_any_buffer_in_any_pieces():
    """The check value of CRC-32C (Castagnoli): the digests of checkpoints written through google-crc32c
    before the `crc32c` package still match. Bytes, a memoryview and a numpy array of the same bytes, in
    pieces, give one digest; another byte gives another (the control)."""
    import numpy as np

    from trainer.checkpoint.digest import new

    assert of_bytes("crc32c", b"123456789") == "e3069283"
    data = bytes(range(256)) * 300
    for buf in (data, memoryview(data), np.frombuffer(data, dtype=np.uint8).copy()):
        h = new("crc32c")
        view = memoryview(buf)
        for start in range(0, len(data), 7777):
            h.update(view[start : start + 7777])
        assert h.hexdigest() == of_bytes("crc32c", data)
    assert of_bytes("crc32c", data[:-1] + b"\x01") != of_bytes("crc32c", data)
