"""Storage that outlives the pod: checkpoints on s3:// (a live S3 API: moto on loopback, or the endpoint
in BATON_S3_ENDPOINT), gs:// (a live GCS API: fake-gcs-server on loopback) and file://, through one
code path.

Every test that takes `store_server` runs once per object store (s3 and gs): bit-identical resume;
one listing request to find the newest checkpoint; retention (last K and the best by a metric,
_COMMIT deleted first); SIGKILL during a save and during a deletion; asynchronous saves (overlap,
commit order, bit-identical); a flipped byte refused with a record and a fallback; fencing of an older
attempt; injected 5xx, resets and latency; clear errors for bad storage input. The trainer runs as
real processes; a loopback proxy (tests/s3server.py) between the client and the server counts,
delays, breaks and intercepts requests, and the endpoint's `op` reads what each request does.
GCS's own forms (create-only claims and commits) are in test_storage_gcs.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from types import SimpleNamespace

import pytest
import torch

from tests.helpers import (
    REPO,
    TINY_YAML,
    base_env,
    equal_count,
    records,
    run,
    run_and_sigterm,
    step_dir,
    tensors,
    trainer_cmd,
)
from tests.s3server import free_port
from trainer.checkpoint import FencedOut, load_flat
from trainer.checkpoint.store import Store
from trainer.config import ConfigError, load_config
from trainer.storage import StorageError, redact, storage_error

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
TOTAL = 16
SETS = ("model.dropout=0.1", f"total_steps={TOTAL}", "checkpoint.every_steps=4")


def cmd(model, ckpt, *sets):
    return trainer_cmd(model, ckpt, *SETS, *sets)


def by_event(recs, event):
    return [r for r in recs if r["event"] == event]


def tiny_state(step: int) -> dict[str, torch.Tensor]:
    return {"w": torch.full((8,), float(step)), "progress": torch.tensor([step])}


@pytest.fixture(scope="module")
def reference(tiny_model, tmp_path_factory):
    """An uninterrupted run on file:// that keeps every checkpoint."""
    ckpt = tmp_path_factory.mktemp("reference")
    rc, recs, err = run(cmd(tiny_model, ckpt, "checkpoint.keep_last=8"))
    assert rc == 0, err
    steps = {r["step"]: r for r in by_event(recs, "step")}
    assert sorted(steps) == list(range(1, TOTAL + 1))
    return SimpleNamespace(ckpt=ckpt, steps=steps, final=tensors(ckpt, TOTAL), at8=tensors(ckpt, 8))


@pytest.fixture(scope="module")
def interrupted(store_server, tiny_model):
    """A run on the store stopped by SIGTERM after step 10: committed 4, 8 (periodic) and 10 (preempt)."""
    root = store_server.new_prefix("interrupted")
    rc, recs, err = run_and_sigterm(cmd(tiny_model, root), at_step=10, env=store_server.env())
    assert rc == 75, err
    return root, recs


def via(monkeypatch, srv, proxy) -> None:
    """This process's client for `srv` goes through `proxy` for the rest of the test."""
    for k, v in srv.endpoint_env(proxy.url).items():
        monkeypatch.setenv(k, v)


def is_put(srv, key_suffix: str):
    """A matcher for the proxy: an upload of an object whose key ends with `key_suffix`."""

    def match(method, path, body=b""):
        kind, key = srv.op(method, path, body)
        return kind == "put" and key.endswith(key_suffix)

    return match


def assert_equal_to_reference(reference, got):
    equal, total = equal_count(reference.final, got)
    differing = sorted(k for k in got if not torch.equal(got[k], reference.final[k]))
    assert equal == total and total > 100, f"{total - equal} of {total} tensors differ: {differing[:5]}"


def assert_complete(store: Store) -> list[int]:
    """At least one committed checkpoint, and the newest verifies against its manifest."""
    committed = store.committed_steps()
    assert committed, "no complete checkpoint left"
    store.verify_files(committed[0], store.read_manifest(committed[0]))
    return committed


# ---- an object store end to end -------------------------------------------------------------------------


def test_resume_from_the_store_is_bit_identical(store_server, tiny_model, reference, interrupted):
    srv = store_server
    root, recs = interrupted
    ck = by_event(recs, "checkpoint")
    assert [(r["step"], r["reason"]) for r in ck] == [(4, "periodic"), (8, "periodic"), (10, "preempt")]
    assert all(r["path"].startswith(root) and r["blocking_ms"] > 0 and not r["asynchronous"] for r in ck)
    folders = srv.steps(root)
    assert sorted(folders) == [4, 8, 10]
    assert all(
        {"_COMMIT", "manifest.json", ".metadata", "__0_0.distcp"} <= names for names in folders.values()
    )

    trial = srv.new_prefix("resumed")
    srv.copy(root, trial)
    rc, recs, err = run(cmd(tiny_model, trial), env=srv.env())
    assert rc == 0, err
    resume = by_event(recs, "resume")[0]
    assert resume["from_step"] == 10 and resume["checkpoint"] == srv.step_uri(trial, 10)
    steps = {r["step"]: r for r in by_event(recs, "step")}
    assert sorted(steps) == list(range(11, TOTAL + 1))
    assert all(steps[s]["batch_sha"] == reference.steps[s]["batch_sha"] for s in steps)
    assert_equal_to_reference(reference, load_flat(srv.step_uri(trial, TOTAL)))


def test_the_manifest_records_the_metric_of_its_step(reference):
    for step in (4, 8, 12, TOTAL):
        manifest = json.loads((step_dir(reference.ckpt, step) / "manifest.json").read_text())
        assert manifest["metrics"]["loss"] == reference.steps[step]["loss"], step


# ---- one listing ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [3, 12])
def test_finding_the_newest_checkpoint_costs_one_listing(store_server, store_proxy, monkeypatch, n):
    srv, proxy = store_server, store_proxy
    via(monkeypatch, srv, proxy)
    root = srv.new_prefix(f"listing{n}")
    writer = Store(root, "run")
    attempt = writer.claim_attempt({})
    for i in range(1, n + 1):
        writer.save(10 * i, tiny_state(i), {}, attempt)
    srv.write(f"{root}/runs/run/step-99999999/manifest.json", b"{}")  # torn: no _COMMIT, never counted
    reader = Store(root, "run")
    proxy.clear()
    assert reader.committed_steps() == [10 * i for i in range(n, 0, -1)]
    reqs = proxy.requests()
    assert len(reqs) == 1, reqs
    kind, prefix = srv.op(*reqs[0])
    assert kind == "list" and prefix.endswith("runs/run/step-"), reqs
    # Another process commits: the same reader sees it at its next call (no stale listing), in one request.
    writer.save(10 * (n + 1), tiny_state(n + 1), {}, attempt)
    proxy.clear()
    assert reader.committed_steps()[0] == 10 * (n + 1)
    assert len(proxy.requests()) == 1


def test_a_preemption_save_hashes_while_writing_and_downloads_nothing(store_server, store_proxy, monkeypatch):
    """read_back=False (the preemption save): no GET of the step's files, and the manifest's checksum of
    every file (crc32c; .metadata's sha256) is the checksum of the stored object. The default save reads
    every file back (the same count sees those GETs), and both verify."""
    from trainer.checkpoint.digest import expected, of_bytes

    srv, proxy = store_server, store_proxy
    via(monkeypatch, srv, proxy)
    root = srv.new_prefix("hash-writing")
    store = Store(root, "run", io_threads=2)
    attempt = store.claim_attempt({})
    for step, read_back in ((1, False), (2, True)):
        proxy.clear()
        store.save(step, tiny_state(step), {}, attempt, read_back=read_back)
        gets = [
            key
            for kind, key in (srv.op(*r) for r in proxy.requests())
            if kind == "get" and f"/step-0000000{step}/" in key
        ]
        files = store.read_manifest(step)["files"]
        assert len(files) >= 3, files  # .metadata and a file per writer thread
        for name, entry in files.items():
            stored = srv.read(f"{srv.step_uri(root, step)}/{name}")
            algorithm, hexdigest = expected(entry, name)
            assert algorithm == ("sha256" if name == ".metadata" else "crc32c"), entry
            assert entry["size"] == len(stored) and hexdigest == of_bytes(algorithm, stored), name
            assert entry.get("hashed") == (None if read_back else "writing"), entry
        if read_back:
            assert len(gets) >= len(files), f"the read-back should GET every file: {gets}"
        else:
            assert gets == [], f"a preemption save read files back: {gets}"
        store.verify_files(step, store.read_manifest(step))


# ---- retention ------------------------------------------------------------------------------------------


def test_retention_keeps_the_last_k_and_the_best_and_deletes_commit_first(
    store_server, store_proxy, monkeypatch
):
    srv, proxy = store_server, store_proxy
    via(monkeypatch, srv, proxy)
    root = srv.new_prefix("retention")
    store = Store(root, "run")
    attempt = store.claim_attempt({})
    deletes: list[tuple[str, str]] = []  # (method, what was deleted as the server saw it) in order

    def hook(phase, method, path, body):
        kind, what = srv.op(method, path, body)
        if phase == "after" and kind == "delete":
            deletes.append((method, what))

    proxy.hook = hook
    losses = {1: 5.0, 2: 1.0, 3: 4.0, 4: 3.0, 5: 6.0, 6: 7.0}
    all_deleted = []
    for step, loss in losses.items():
        store.save(step, tiny_state(step), {"metrics": {"loss": loss}}, attempt)
        deletes.clear()
        deleted = store.retain(2, step, "loss")
        all_deleted += deleted
        for d in deleted:
            touching = [text for _, text in deletes if f"step-{d:08d}/" in text]
            assert touching and "_COMMIT" in touching[0], f"step {d}: the first deletion must be its _COMMIT"
            assert "__0_0.distcp" not in touching[0] and "manifest.json" not in touching[0]
            assert all("_COMMIT" not in t for t in touching[1:])
    assert sorted(all_deleted) == [1, 3, 4]
    assert store.committed_steps() == [6, 5, 2], "the newest two and the best (step 2, loss 1.0)"
    assert sorted(srv.steps(root)) == [2, 5, 6]
    assert store.retain(2, 6, "") == [2] and store.committed_steps() == [6, 5]


# ---- SIGKILL during a save and during a deletion --------------------------------------------------------


@pytest.mark.slow
def test_sigkill_during_save_and_deletion_always_leaves_a_complete_checkpoint(
    store_server, store_proxy, tiny_model, reference
):
    """Killed (by the proxy, at an exact request) while uploading a shard, right after deleting an old
    checkpoint's _COMMIT, and just before a _COMMIT: each time a complete checkpoint remains, the
    restart resumes from it, and the run ends bit-identical with the torn folders cleaned up."""
    srv, proxy = store_server, store_proxy
    root = srv.new_prefix("killed")
    sets = ("checkpoint.keep_last=1", "checkpoint.keep_best_metric=")
    env = srv.env(proxy.url)

    def run_until(trigger):
        box: dict = {}

        def hook(phase, method, path, body):
            if "pid" in box and "killed" not in box and trigger(phase, method, path, body):
                os.kill(box["pid"], signal.SIGKILL)
                box["killed"] = (method, path)
                return "drop"
            return None

        proxy.hook = hook
        p = subprocess.Popen(
            cmd(tiny_model, root, *sets),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        box["pid"] = p.pid
        out, err = p.communicate(timeout=240)
        proxy.hook = None
        return p.returncode, records(out), err, box.get("killed")

    def put(step, name):
        uploads = is_put(srv, f"/step-{step:08d}/{name}")
        return lambda phase, method, path, body: phase == "before" and uploads(method, path, body)

    def deleted_commit_of(step):
        key = f"step-{step:08d}/_COMMIT"

        def match(phase, method, path, body):
            kind, what = srv.op(method, path, body)
            return phase == "after" and kind == "delete" and key in what

        return match

    # 1. during the upload of step 8's shard
    rc, recs, err, killed = run_until(put(8, "__0_0.distcp"))
    assert rc == -signal.SIGKILL and killed, err
    run_id = recs[0]["run_id"]
    store = Store(root, run_id)
    assert assert_complete(store) == [4]
    # 2. after deleting step 4's _COMMIT (retention, once step 8 committed), before the rest of it
    rc, recs, err, killed = run_until(deleted_commit_of(4))
    assert rc == -signal.SIGKILL and killed, err
    assert by_event(recs, "resume")[0]["from_step"] == 4
    assert assert_complete(store) == [8]
    assert "_COMMIT" not in srv.steps(root)[4] and "__0_0.distcp" in srv.steps(root)[4], (
        "deletion was cut short"
    )
    # 3. just before step 12's _COMMIT: everything else of it is written
    rc, recs, err, killed = run_until(put(12, "_COMMIT"))
    assert rc == -signal.SIGKILL and killed, err
    assert by_event(recs, "resume")[0]["from_step"] == 8
    assert assert_complete(store) == [8]
    assert {"manifest.json", "__0_0.distcp"} <= srv.steps(root)[12] and "_COMMIT" not in srv.steps(root)[12]
    # 4. no more kills: resumes from 8, ends bit-identical, and only the final checkpoint is left
    rc, recs, err, killed = run_until(lambda *a: False)
    assert rc == 0, err
    assert by_event(recs, "resume")[0]["from_step"] == 8
    assert_equal_to_reference(reference, load_flat(srv.step_uri(root, TOTAL)))
    assert sorted(srv.steps(root)) == [TOTAL]


# ---- asynchronous checkpoints ----------------------------------------------------------------------------


def test_async_saves_overlap_training_and_resume_bit_identically(
    store_server, store_proxy, tiny_model, reference
):
    # Every checkpoint request is slow, so each async save is still planning and writing (after its
    # staging copy) while the next steps train and change the live tensors.
    srv, proxy = store_server, store_proxy
    proxy.set_faults(delay_s=0.1, match=lambda method, path, body: "step-" in srv.op(method, path, body)[1])
    root = srv.new_prefix("async")
    env = srv.env(proxy.url)
    rc, recs, err = run_and_sigterm(cmd(tiny_model, root, "checkpoint.async_save=true"), at_step=9, env=env)
    assert rc == 75, err
    order = [(r["event"], r["step"]) for r in recs if r["event"] in ("step", "checkpoint", "preempt")]
    ck = {r["step"]: r for r in by_event(recs, "checkpoint")}
    assert sorted(ck) == [4, 8, 9]
    assert ck[4]["asynchronous"] and ck[8]["asynchronous"] and not ck[9]["asynchronous"]
    assert ck[9]["reason"] == "preempt" and by_event(recs, "preempt")[0]["outcome"] == "saved"
    for s in (4, 8):
        assert 0 < ck[s]["blocking_ms"] < ck[s]["save_ms"]
    # Committed only after later steps had trained; the save in flight at SIGTERM commits before the stop's own.
    assert order.index(("checkpoint", 4)) > order.index(("step", 5))
    assert order.index(("step", 9)) < order.index(("checkpoint", 8)) < order.index(("checkpoint", 9))
    # What was written is the staged copy of step 8, not tensors that steps 9.. went on to change.
    equal, total = equal_count(reference.at8, load_flat(srv.step_uri(root, 8)))
    assert equal == total
    proxy.set_faults()
    rc, recs, err = run(cmd(tiny_model, root, "checkpoint.async_save=true"), env=env)
    assert rc == 0, err
    assert by_event(recs, "resume")[0]["from_step"] == 9
    ck = {r["step"]: r for r in by_event(recs, "checkpoint")}
    assert ck[12]["asynchronous"] and ck[TOTAL]["reason"] == "final" and not ck[TOTAL]["asynchronous"]
    assert_equal_to_reference(reference, load_flat(srv.step_uri(root, TOTAL)))


# ---- integrity -----------------------------------------------------------------------------------------


def _assert_refused_and_fell_back(recs, refused_step: int, from_step: int) -> None:
    refused = by_event(recs, "checkpoint_refused")
    assert [r["step"] for r in refused] == [refused_step]
    assert "__0_0.distcp" in refused[0]["reason"] and "crc32c checksum" in refused[0]["reason"]
    assert by_event(recs, "resume")[0]["from_step"] == from_step


def test_a_flipped_byte_is_refused_and_the_run_falls_back(store_server, tiny_model, reference, interrupted):
    srv = store_server
    src, _ = interrupted
    root = srv.new_prefix("flipped")
    srv.copy(src, root)
    shard = srv.step_uri(root, 10) + "/__0_0.distcp"
    data = bytearray(srv.read(shard))
    data[len(data) // 2] ^= 0x01
    srv.write(shard, bytes(data))
    rc, recs, err = run(cmd(tiny_model, root), env=srv.env())
    assert rc == 0, err
    _assert_refused_and_fell_back(recs, 10, 8)
    assert_equal_to_reference(reference, load_flat(srv.step_uri(root, TOTAL)))


def test_a_flipped_byte_on_file_is_refused_and_the_run_falls_back(tiny_model, reference, tmp_path):
    import shutil

    local = tmp_path / "ckpt"
    shutil.copytree(reference.ckpt, local)
    for step in (4, 8):  # fall back to 12 (refusing 16): the run trains 13..16 again
        shutil.rmtree(step_dir(local, step))
    shard = step_dir(local, TOTAL) / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    rc, recs, err = run(cmd(tiny_model, f"file://{local}"), env=base_env())
    assert rc == 0, err
    _assert_refused_and_fell_back(recs, TOTAL, 12)
    assert_equal_to_reference(reference, tensors(local, TOTAL))


# ---- fencing --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_an_older_attempt_is_fenced_out_and_the_run_stays_consistent(store_server, tiny_model, reference):
    srv = store_server
    root = srv.new_prefix("fenced")
    old = subprocess.Popen(
        cmd(tiny_model, root),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=srv.env(BATON_PAUSE_AFTER_STEP="6"),
        cwd=REPO,
    )
    lines = []
    assert old.stdout is not None
    for line in old.stdout:
        lines.append(line)
        if line.startswith("{") and json.loads(line)["event"] == "step" and json.loads(line)["step"] == 6:
            break
    # The older process is paused after step 6 (step 4 committed). A newer attempt takes over and finishes.
    rc, new_recs, err = run(cmd(tiny_model, root), env=srv.env())
    assert rc == 0, err
    assert new_recs[0]["attempt"] == 2 and by_event(new_recs, "resume")[0]["from_step"] == 4
    # The older one is told to stop: it tries to save step 6, and is refused.
    old.send_signal(signal.SIGTERM)
    out, old_err = old.communicate(timeout=120)
    old_recs = records("".join(lines) + out)
    assert old.returncode == 1, old_err
    assert "attempt 1 may not commit step 6: attempt 2" in old_err and "Traceback" not in old_err
    assert [r["step"] for r in by_event(old_recs, "checkpoint")] == [4]
    folders = srv.steps(root)
    assert 6 not in folders, "the fenced attempt wrote nothing"
    for step, names in folders.items():
        if "_COMMIT" in names:
            commit = json.loads(srv.read(f"{srv.step_uri(root, step)}/_COMMIT"))
            assert commit["attempt"] == 2 or step <= 4, (step, commit)
    assert_equal_to_reference(reference, load_flat(srv.step_uri(root, TOTAL)))


def test_a_commit_is_fenced_when_a_newer_attempt_starts_during_the_upload(store_server, monkeypatch):
    _fenced_during_the_upload(store_server.new_prefix("fence-commit"), monkeypatch)


def test_a_commit_on_file_is_fenced_when_a_newer_attempt_starts_during_the_upload(tmp_path, monkeypatch):
    _fenced_during_the_upload(f"file://{tmp_path}/ckpt", monkeypatch)


def _fenced_during_the_upload(root: str, monkeypatch) -> None:
    old = Store(root, "run")
    attempt = old.claim_attempt({"who": "old"})
    old.save(1, tiny_state(1), {}, attempt)
    real = old._hash_own

    def upload_then_a_newer_attempt_starts(path, md, written=None):
        files = real(path, md, written)
        assert Store(root, "run").claim_attempt({"who": "new"}) == attempt + 1
        return files

    monkeypatch.setattr(old, "_hash_own", upload_then_a_newer_attempt_starts)
    with pytest.raises(FencedOut, match=f"attempt {attempt} may not commit step 2: attempt {attempt + 1}"):
        old.save(2, tiny_state(2), {}, attempt)
    assert old.committed_steps() == [1]
    names = {p.rstrip("/").split("/")[-1] for p in old.fs.ls(old.step_path(2), detail=False)}
    assert "_COMMIT" not in names and "manifest.json" not in names


# ---- faults ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_run_under_injected_faults_ends_bit_identical(store_server, store_proxy, tiny_model, reference):
    srv, proxy = store_server, store_proxy
    faults = proxy.set_faults(every=3, kinds=("503", "reset", "500"), max_faults=30, delay_s=0.02)
    root = srv.new_prefix("faulty")
    rc, recs, err = run(cmd(tiny_model, root), env=srv.env(proxy.url, **{srv.max_attempts_var: "8"}))
    assert rc == 0, err
    assert len(faults.injected) == 30 and {k for k, *_ in faults.injected} == {"503", "reset", "500"}
    assert any(
        is_put(srv, "")(m, p, b) and "/step-" in srv.op(m, p, b)[1] for _, m, p, b in faults.injected
    ), "faults hit checkpoint uploads"
    store = Store(root, recs[0]["run_id"])
    for step in store.committed_steps():  # nothing committed is broken
        store.verify_files(step, store.read_manifest(step))
    assert_equal_to_reference(reference, load_flat(srv.step_uri(root, TOTAL)))


def test_a_store_that_keeps_failing_stops_the_run_cleanly(store_server, store_proxy, tiny_model):
    srv, proxy = store_server, store_proxy
    proxy.set_faults(
        every=1,
        kinds=("503",),
        max_faults=10_000,
        match=lambda m, p, b: is_put(srv, "")(m, p, b) and "/step-" in srv.op(m, p, b)[1],
    )
    root = srv.new_prefix("failing")
    rc, recs, err = run(cmd(tiny_model, root), env=srv.env(proxy.url, **{srv.max_attempts_var: "2"}))
    # Each periodic save fails after its retries and training goes on; the third in a row ends the run
    # with 75 (faults.max_failed_saves), which the drill's retry expression retries.
    assert rc == 75, err
    assert [r["step"] for r in by_event(recs, "checkpoint_failed")] == [4, 8, 12]
    assert [r["reason"] for r in by_event(recs, "retry_later")] == ["saves_failing"]
    assert f"saving step 4 to {root}/runs/" in err and "Traceback" not in err, err
    assert not by_event(recs, "checkpoint")
    assert not any("_COMMIT" in names for names in srv.steps(root).values())


def test_a_failed_writer_thread_fails_the_save(store_server, store_proxy, tiny_model):
    """checkpoint.io_threads=4 writes each rank's checkpoint as several files, on DCP's writer threads.
    One file's upload failing for good must fail the save (clean error, nothing committed), whichever
    thread wrote it: a failure on an extra thread reaches only threading.excepthook."""
    srv, proxy = store_server, store_proxy
    proxy.set_faults(
        every=1, kinds=("503",), max_faults=10_000, match=is_put(srv, "/step-00000004/__0_1.distcp")
    )
    root = srv.new_prefix("thread-fails")
    rc, recs, err = run(
        cmd(tiny_model, root, "checkpoint.io_threads=4"),
        env=srv.env(proxy.url, **{srv.max_attempts_var: "2"}),
    )
    # The save of step 4 fails (nothing of it committed); training goes on and the later saves commit.
    assert rc == 0, err
    assert [r["step"] for r in by_event(recs, "checkpoint_failed")] == [4]
    assert f"saving step 4 to {root}/runs/" in err and "Traceback" not in err, err
    assert 4 not in [r["step"] for r in by_event(recs, "checkpoint")]
    assert "_COMMIT" not in srv.steps(root).get(4, ())


def test_a_save_whose_items_were_not_all_written_is_refused(tmp_path):
    """What DCP returns when an extra writer thread failed: .metadata lists items that storage_data
    lacks. _require_written refuses it; the complete metadata passes."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    from trainer.checkpoint.write import require_written as _require_written

    state = {f"w{i}": torch.full((64,), float(i)) for i in range(8)}
    md = dcp.save(state, storage_writer=FsspecWriter(f"file://{tmp_path}/ck", thread_count=4))
    assert len({si.relative_path for si in md.storage_data.values()}) == 4, "a file per writer thread"
    _require_written(md)
    lost = next(k for k in md.storage_data if k.fqn == "w3")
    del md.storage_data[lost]  # a writer thread's results never reached the result queue
    with pytest.raises(OSError, match="1 saved item.s. were not written, such as 'w3'"):
        _require_written(md)


# ---- bad input -------------------------------------------------------------------------------------------


def test_bad_storage_input_is_a_clear_error_at_startup(store_server, monkeypatch, tmp_path):
    srv = store_server
    missing = f"{srv.scheme}://baton-no-such-bucket/x"
    with pytest.raises(StorageError, match=f"{missing}/runs/run .*not found"):
        Store(missing, "run")
    with monkeypatch.context() as m:
        for k, v in srv.endpoint_env(f"http://127.0.0.1:{free_port()}").items():
            m.setenv(k, v)
        m.setenv(srv.max_attempts_var, "1")
        with pytest.raises(StorageError, match="endpoint unreachable"):
            Store(srv.new_prefix("x"), "run")
    with monkeypatch.context() as m:
        for k, v in srv.without_credentials(dict(os.environ), tmp_path).items():
            m.setenv(k, v)
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
            m.delenv(k, raising=False)
        with pytest.raises(StorageError, match="no usable credentials") as caught:
            Store(srv.new_prefix("x"), "run")
        assert srv.secret not in str(caught.value)


def test_gs_without_gcsfs_is_a_clear_error(monkeypatch):
    """What a gs:// run says where gcsfs is not installed (it is, here: its import is made to fail)."""
    import sys

    import trainer.storage

    monkeypatch.setattr(trainer.storage, "_gcs_class", None)
    for name in ("gcsfs", "gcsfs.core", "gcsfs.retry"):
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(StorageError, match=r"gs://some-bucket/x.*gcsfs"):
        Store("gs://some-bucket/x", "run")


def test_the_cli_exits_1_naming_the_uri_for_bad_storage(store_server, tiny_model, tmp_path):
    srv = store_server
    secret = srv.secret
    cases = {
        "missing bucket": (f"{srv.scheme}://baton-no-such-bucket/x", srv.env(), "not found"),
        "unreachable endpoint": (
            srv.new_prefix("x"),
            srv.env(f"http://127.0.0.1:{free_port()}", **{srv.max_attempts_var: "1"}),
            "endpoint unreachable",
        ),
        "no credentials": (
            srv.new_prefix("x"),
            srv.without_credentials(srv.env(), tmp_path),
            "no usable credentials",
        ),
    }
    procs = {
        name: subprocess.Popen(
            cmd(tiny_model, uri), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO
        )
        for name, (uri, env, _) in cases.items()
    }
    for name, p in procs.items():
        uri, _, why = cases[name]
        out, err = p.communicate(timeout=120)
        assert p.returncode == 1, (name, err)
        # gcsfs resolves its credentials when the client is built, s3fs at the first request.
        assert (
            f"error: listing checkpoints under {uri}/runs/" in err
            or f"error: connecting to {uri} failed" in err
        ) and why in err, (name, err)
        assert "Traceback" not in err and not by_event(records(out), "step"), name
        if secret:
            assert secret not in err and secret not in out, name


def test_error_messages_hold_no_credentials(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s3cr3t-value-123")
    e = storage_error(
        "s3://someone:pa55word@bucket/x",
        "listing",
        RuntimeError("denied s3cr3t-value-123 at ?X-Amz-Signature=abcdef&X-Amz-Credential=AKIAXYZ"),
    )
    text = str(e)
    assert "s3cr3t-value-123" not in text and "pa55word" not in text and "abcdef" not in text
    assert "AKIAXYZ" not in text and "s3://***@bucket/x" in text
    assert redact("plain s3://bucket/key") == "plain s3://bucket/key"


def test_the_new_checkpoint_keys_are_validated():
    with pytest.raises(ConfigError, match="checkpoint.keep_best_metric"):
        load_config(TINY_YAML, ["checkpoint.keep_best_metric=not a name"])
    with pytest.raises(ConfigError, match="checkpoint.async_save"):
        load_config(TINY_YAML, ["checkpoint.async_save=maybe"])
    cfg = load_config(TINY_YAML, ["checkpoint.async_save=true", "checkpoint.keep_best_metric="])
    assert cfg.checkpoint.async_save is True and cfg.checkpoint.keep_best_metric == ""
    assert load_config(TINY_YAML).checkpoint.keep_best_metric == "loss"


def test_storage_retries_do_not_draw_from_the_training_rng():
    """botocore's backoff jitter drew from Python's global `random`: every retried request moved the
    training's Python RNG (the faults test caught it). The storage libraries now have their own."""
    import random

    from botocore.retries.standard import ExponentialBackoff

    from trainer.storage import isolate_library_randomness

    isolate_library_randomness()
    before = random.getstate()
    backoff = ExponentialBackoff()
    context = SimpleNamespace(attempt_number=3, http_response=None, operation_model=None)
    for _ in range(5):
        try:
            backoff.delay_amount(context)
        except AttributeError:  # other botocore versions read more of the context
            backoff._random()
    assert random.getstate() == before


def test_a_stager_is_reused_only_while_it_can_stage_again():
    """torch 2.13's DefaultStager stages again and again (one staging copy for the run); 2.11's closes
    itself after one stage, and reusing it fails with KeyError: such a stager must be replaced."""
    from types import SimpleNamespace

    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    from trainer.checkpoint.async_save import _reusable

    stager = DefaultStager(
        StagingOptions(
            use_pinned_memory=False,
            use_shared_memory=False,
            use_async_staging=False,
            use_non_blocking_copy=False,
        )
    )
    w = torch.ones(3)
    first = stager.stage({"w": w})
    assert _reusable(stager), "this torch closes its stager after a stage: the reuse in Store would fail"
    w.fill_(2.0)  # the next step's values in the same parameter
    assert torch.equal(stager.stage({"w": w})["w"], torch.full((3,), 2.0))
    assert torch.equal(first["w"], torch.full((3,), 2.0)), "the staging copy is refilled, not reallocated"
    closed = SimpleNamespace(_state_dict_stager=SimpleNamespace(_deepcopy_dispatch={}))  # as 2.11 leaves it
    assert not _reusable(closed)
