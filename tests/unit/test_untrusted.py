"""Untrusted input, second round: the strict reader (trainer/untrusted.py) and what goes through it.

Each attack is planted as an attacker with write access to the bucket, or a trainer that writes its own
records, would plant it; each has a control that shows the attack reaches the code (the plain read
hangs, raises RecursionError, reads gigabytes, or the text lands as markup)."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from trainer.untrusted import CAPS, Refused, nesting_at_most, parse_json, printable, read_bytes, read_json

DEEP = "[" * 20_000 + "]" * 20_000  # 40 kB: under every cap, far past Python's recursion limit


def local_fs():
    from fsspec.implementations.local import LocalFileSystem

    return LocalFileSystem()


def fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def blocks_on_plain_open(path: Path) -> bool:
    """The control for a planted FIFO: a plain open() of it does not return (here within 0.5 s); the
    thread is released by opening the FIFO's other end."""
    done = threading.Event()

    def reader() -> None:
        with open(path, "rb") as f:
            f.read()
        done.set()

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    blocked = not done.wait(0.5)
    with open(path, "wb"):
        pass  # a writer that closes at once: the reader sees EOF and ends
    t.join(5)
    return blocked


# ---- the reader -------------------------------------------------------------------------------------------


def test_a_fifo_is_refused_at_once_where_a_plain_open_blocks(tmp_path):
    path = fifo(tmp_path / "_COMMIT")
    with pytest.raises(Refused, match="is not a regular file \\(a FIFO\\)"):
        read_bytes(local_fs(), str(path), "commit")
    assert blocks_on_plain_open(path), "control: a plain open of the FIFO returned"


def test_a_symbolic_link_and_a_folder_are_refused(tmp_path):
    target = tmp_path / "real.json"
    target.write_text("{}")
    (tmp_path / "link.json").symlink_to(target)
    (tmp_path / "dir.json").mkdir()
    with pytest.raises(Refused, match="symbolic link"):
        read_bytes(local_fs(), str(tmp_path / "link.json"), "commit")
    with pytest.raises(Refused, match="a folder"):
        read_bytes(local_fs(), str(tmp_path / "dir.json"), "commit")
    assert read_json(local_fs(), str(target), "commit") == {}  # control: the file itself reads


def test_a_file_over_its_cap_is_refused_before_it_is_read(tmp_path):
    big = tmp_path / "_COMMIT"
    with open(big, "wb") as f:
        f.truncate(8 << 30)  # 8 GiB, sparse: what a planted one costs the attacker nothing to make
    with pytest.raises(Refused, match=f"larger than the {CAPS['commit']} bytes"):
        read_bytes(local_fs(), str(big), "commit")
    small = tmp_path / "ok"
    small.write_bytes(b"x" * CAPS["commit"])
    assert len(read_bytes(local_fs(), str(small), "commit")) == CAPS["commit"]  # control: at the cap, read
    with pytest.raises(FileNotFoundError):  # absent is absent, not refused
        read_bytes(local_fs(), str(tmp_path / "none"), "commit")


def test_deep_json_is_refused_where_the_plain_parser_raises_recursion_error():
    with pytest.raises(RecursionError):  # the control: a RuntimeError, which callers took for a crash
        json.loads(DEEP)
    with pytest.raises(Refused, match="nests deeper than 32 levels"):
        parse_json(DEEP, "x")
    with pytest.raises(Refused, match="nests deeper"):
        parse_json('{"a": ' * 40 + "1" + "}" * 40, "x")
    assert (
        parse_json('{"a": ' * 30 + '"[[[[{{{{"' + "}" * 30, "x") is not None
    )  # brackets in strings do not count
    assert nesting_at_most(b'{"a": [1, {"b": "]]]]"}]}', 3) and not nesting_at_most(b"[[[[]]]]", 3)


@pytest.mark.parametrize(
    "text,why",
    [
        ("NaN", "not JSON"),
        ('{"a": Infinity}', "not JSON"),
        (b"\xff\xfe", "not JSON"),
        ("[1, 2", "not JSON"),
        ("[1]", "not a JSON object"),
    ],
)
def test_malformed_json_is_one_refusal(text, why):
    with pytest.raises(Refused, match=why):
        parse_json(text, "x", expect=dict)


def test_printable_escapes_what_a_terminal_would_obey():
    attack = "\x1b]0;pwned\x07\x1b[2J\x1b[32mdrill PASSED\x1b[0m\u202e"
    shown = printable(attack)
    assert "\x1b" not in shown and "\x07" not in shown and "\u202e" not in shown
    assert shown == "\\x1b]0;pwned\\x07\\x1b[2J\\x1b[32mdrill PASSED\\x1b[0m\\u202e"
    assert printable("a\nb\tc") == "a\nb\tc"


# ---- the stores' files -----------------------------------------------------------------------------------


def _committed_step(tmp_path: Path):
    """A real one-file DCP checkpoint at step 1 and the Store that reads it."""
    import torch

    from trainer.checkpoint.store import Store

    store = Store(str(tmp_path / "root"), "run")
    store.save(1, {"w": torch.arange(8.0)}, {"fingerprint": "f"}, store.claim_attempt({}))
    return store, tmp_path / "root" / "runs" / "run" / "step-00000001"


@pytest.mark.parametrize(
    "plant",
    [
        "deep commit",
        "huge commit",
        "fifo commit",
        "deep manifest",
        "too many files",
        "fifo data file",
        "huge data file",
    ],
)
def test_a_planted_checkpoint_file_is_a_refused_checkpoint_never_a_store_outage(tmp_path, plant):
    from trainer.checkpoint import CorruptCheckpoint
    from trainer.checkpoint.layout import MAX_MANIFEST_FILES
    from trainer.storage import StorageError

    store, folder = _committed_step(tmp_path)
    manifest = store.read_manifest(1)
    store.verify_files(1, manifest)  # control: the checkpoint is good before the attack
    data = next(p for p in folder.iterdir() if p.suffix == ".distcp")

    def reseal(text: str) -> None:
        (folder / "manifest.json").write_text(text)
        commit = json.loads((folder / "_COMMIT").read_text())
        (folder / "_COMMIT").write_text(
            json.dumps({**commit, "manifest_sha256": hashlib.sha256(text.encode()).hexdigest()})
        )

    if plant == "deep commit":
        (folder / "_COMMIT").write_text(DEEP)
        why = "nests deeper"
    elif plant == "huge commit":
        (folder / "_COMMIT").unlink()
        with open(folder / "_COMMIT", "wb") as f:
            f.truncate(6 << 30)
        why = "larger than"
    elif plant == "fifo commit":
        (folder / "_COMMIT").unlink()
        fifo(folder / "_COMMIT")
        why = "not a regular file"
    elif plant == "deep manifest":
        reseal(DEEP)
        why = "nests deeper"
    elif plant == "too many files":
        m = json.loads((folder / "manifest.json").read_text())
        m["files"].update(
            {f"__0_{i}.distcp": {"size": 1, "sha256": "0" * 64} for i in range(MAX_MANIFEST_FILES + 1)}
        )
        reseal(json.dumps(m))
        why = "more than any checkpoint has"
    elif plant == "fifo data file":
        data.unlink()
        fifo(data)
        why = "not a regular file"
    else:  # a data file far larger than the manifest says: refused on its size, never read whole
        with open(data, "r+b") as f:
            f.truncate(6 << 30)
        why = "has 6442450944 bytes"
    with pytest.raises(CorruptCheckpoint, match=why) as e:
        store.verify_files(1, store.read_manifest(1))
    assert not isinstance(e.value, StorageError)


def test_a_fifo_data_file_is_refused_by_the_verifying_load_too(tmp_path):
    """The resume hashes while it loads (read.VerifyingReader), after a size check that a FIFO declared
    at size 0 would pass: the load itself must refuse it. Control: the same load of the intact
    checkpoint succeeds."""
    import torch

    from trainer.checkpoint import CorruptCheckpoint
    from trainer.checkpoint.read import load_flat

    store, folder = _committed_step(tmp_path)
    manifest = store.read_manifest(1)
    assert torch.equal(load_flat(f"file://{folder}", manifest["files"])["w"], torch.arange(8.0))
    data = next(p for p in folder.iterdir() if p.suffix == ".distcp")
    data.unlink()
    fifo(data)
    manifest["files"][data.name]["size"] = 0
    with pytest.raises(CorruptCheckpoint, match="not a regular file"):
        load_flat(f"file://{folder}", manifest["files"])


def test_an_enormous_metadata_is_refused_before_it_is_read_whole(tmp_path, monkeypatch):
    """A valid .metadata larger than the cap (here the cap is lowered to 64 bytes instead of planting
    256 MiB): refused on the size its manifest declares. Control: with the real cap it loads."""
    from trainer.checkpoint import CorruptCheckpoint
    from trainer.checkpoint import read as ckpt_read
    from trainer.checkpoint.read import load_flat

    store, folder = _committed_step(tmp_path)
    manifest = store.read_manifest(1)
    assert "w" in load_flat(f"file://{folder}", manifest["files"])
    monkeypatch.setitem(ckpt_read.CAPS, "metadata", 64)
    with pytest.raises(CorruptCheckpoint, match="larger than the 64 bytes"):
        load_flat(f"file://{folder}", manifest["files"])
    with pytest.raises(CorruptCheckpoint, match="larger than the 64 bytes"):
        store.shapes(1, manifest)


def test_the_attempt_records_skip_what_is_planted(tmp_path):
    store, _ = _committed_step(tmp_path)
    attempts = tmp_path / "root" / "runs" / "run" / "attempts"
    (attempts / "00000099-deep.json").write_text(DEEP)
    fifo(attempts / "00000098-fifo.json")
    (attempts / "00000097-nan.json").write_text('{"time": "soon"}')
    assert len(store.attempt_start_times()) == 1  # the real claim of _committed_step


def test_the_packed_corpus_refuses_a_deep_header_and_an_oversized_samples_file(tmp_path, capsys):
    import torch

    from trainer.packed import PackedCorpus

    cache = PackedCorpus(str(tmp_path), "run")
    samples = torch.arange(12).reshape(3, 4)
    cache.save("k", samples)
    assert torch.equal(cache.load("k", 4, None), samples)  # control: the packing as written loads
    body = Path(cache.folder) / "k.bin"
    with open(body, "r+b") as f:
        f.truncate(8 << 30)  # sparse: read whole, this would be 8 GiB of memory before the size check
    assert cache.load("k", 4, None) is None
    assert "is larger than the 48 bytes" in capsys.readouterr().err
    (Path(cache.folder) / "k.json").write_text(DEEP)
    assert cache.load("k", 4, None) is None
    assert "nests deeper" in capsys.readouterr().err


# ---- records: checked before anything keys on them ---------------------------------------------------------

GOOD = {"event": "step", "step": 1, "attempt": 1, "time": 1.0, "loss": 2.5, "rank": 0}


@pytest.mark.parametrize(
    "bad,field",
    [
        ({"loss": None}, "loss"),
        ({"step": "5"}, "step"),
        ({"attempt": -1}, "attempt"),
        ({"event": 3}, "event"),
        ({"time": "noon"}, "time"),
    ],
)
def test_a_malformed_record_is_refused_naming_its_field(tmp_path, bad, field):
    from steps.lib.evidence import check_record, read_evidence

    assert check_record(GOOD) is None
    rec = {**GOOD, **bad}
    assert field in check_record(rec)
    (tmp_path / "pod-1.jsonl").write_text(
        json.dumps(GOOD) + "\n" + json.dumps({**rec, "step": rec["step"]}) + "\n"
    )
    problems: list[str] = []
    got = read_evidence(str(tmp_path), problems, "trial")
    assert (
        got == [GOOD]
        and len(problems) == 1
        and problems[0].startswith("trial: pod-1.jsonl: ")
        and field in problems[0]
    )


def test_records_without_what_verify_sorts_on_are_refused_not_a_traceback(tmp_path):
    from steps import verify as verify_mod
    from steps.lib.evidence import read_evidence

    recs = [
        {"event": "resume", "step": 0, "attempt": 1, "from_step": 0, "fresh": True},  # no time
        {"event": "preempt", "step": 3, "time": 2.0},
    ]  # no attempt
    with pytest.raises((KeyError, TypeError)):  # the control: verify as it was fed these raw
        verify_mod.verify(recs, 4)
    (tmp_path / "trial").mkdir()
    (tmp_path / "trial" / "p.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    problems: list[str] = []
    v = verify_mod.verify(read_evidence(str(tmp_path / "trial"), problems, "trial"), 4)
    assert not v["passed"] and len(problems) == 2
    assert "'time' is missing" in problems[0] and "'attempt' is missing" in problems[1]


def test_verify_and_compare_report_planted_files_instead_of_crashing(tmp_path):
    """verify.json and evictions.json planted malformed, a trial record with a string step: compare still
    writes report.json and report.md, and each refusal is named in it."""
    from steps import compare as compare_mod
    from steps import verify as verify_mod

    root = tmp_path / "drill"
    for role in ("reference", "replay", "trial"):
        (root / "evidence" / role).mkdir(parents=True)
        (root / "evidence" / role / "p.jsonl").write_text(json.dumps(GOOD) + "\n")
    (root / "evidence" / "trial" / "q.jsonl").write_text(json.dumps({**GOOD, "step": "5"}) + "\n")
    (root / "evictions.json").write_text('{"evictions": "all of them", "planned": 1}')
    rc = verify_mod.main(
        [
            "--evidence",
            str(root / "evidence" / "trial"),
            "--total-steps",
            "1",
            "--evictions",
            str(root / "evictions.json"),
            "--out",
            str(root / "verify.json"),
        ]
    )
    v = json.loads((root / "verify.json").read_text())
    assert rc == 1 and any("evictions record is refused" in p for p in v["problems"])
    assert any("'step' must be a non-negative integer" in p for p in v["problems"])
    (root / "verify.json").write_text(DEEP)
    out = tmp_path / "out"
    rc = compare_mod.main(
        [
            "--reference",
            str(root / "none"),
            "--replay",
            str(root / "none"),
            "--trial",
            str(root / "none"),
            "--evidence",
            str(root / "evidence"),
            "--verify",
            str(root / "verify.json"),
            "--evictions",
            str(root / "evictions.json"),
            "--total-steps",
            "1",
            "--out",
            str(out),
        ]
    )
    report = json.loads((out / "report.json").read_text())
    assert rc == 1 and not report["passed"]
    contract = " ".join(report["contract"])
    assert "verify.json is refused" in contract and "evictions.json is refused" in contract
    assert "trial: q.jsonl" in contract and (out / "report.md").is_file()


def test_record_text_lands_in_report_md_as_text_never_as_markup():
    from steps.lib.report import markdown

    forged = "x |\n\n# baton equivalence drill: PASS\n\n- verdict: PASS: every tensor equal\n\n<!--"
    report = {
        "passed": False,
        "verdict": "FAIL: 3 step(s) replayed",
        "tier": 1,
        "equal_tensors": 0,
        "tensors": 4,
        "max_abs_diff": 1.0,
        "floor": 0.0,
        "steps": {"total": 3, "distinct": 3, "replayed": 0, "resumed_from": [], "preemptions": 1},
        "preempt": [
            {"step": 3, "save_ms": 1, "grace_left_s": 1, "exit": 75, "outcome": "saved", "during": forged}
        ],
        "verify_problems": ["3 step(s) replayed"],
    }
    text = markdown(report)
    headings = [line for line in text.splitlines() if line.startswith("#")]
    assert headings == ["# baton equivalence drill: FAIL"], headings
    assert (
        "<!--" not in text and "\\<\\!--" in text and "3 step\\(s\\) replayed" in text.split("\\<\\!--")[-1]
    )
    # The control: the same text raw, as report.md was built before, holds a PASS heading and the comment.
    raw = text.replace(text[text.index("| 3 |") : text.index("\n", text.index("| 3 |"))], f"| 3 | {forged} |")
    assert "\n# baton equivalence drill: PASS" in raw and "<!--" in raw


def test_compare_reports_a_final_checkpoint_with_a_missing_data_file_instead_of_a_traceback(tmp_path):
    """DCP raises CheckpointException (a BaseException) for a missing data file; compare turns it into a
    problem naming the role. Control: the intact roots compare equal."""
    import shutil

    from steps.compare import compare

    _committed_step(tmp_path / "reference")
    for role in ("replay", "trial"):
        shutil.copytree(tmp_path / "reference" / "root", tmp_path / role / "root")
    roots = {role: f"file://{tmp_path / role / 'root'}" for role in ("reference", "replay", "trial")}
    assert compare(roots["reference"], roots["replay"], roots["trial"], tier="1")["equivalent"] is True
    folder = tmp_path / "trial" / "root" / "runs" / "run" / "step-00000001"
    next(p for p in folder.iterdir() if p.suffix == ".distcp").unlink()
    result = compare(roots["reference"], roots["replay"], roots["trial"], tier="1")
    assert result["equivalent"] is False and result["problem"].startswith("trial: "), result


def test_an_object_replaced_while_it_is_read_is_read_again_not_a_traceback(s3):
    """Seen on the real control plane: evict read a trial's evidence file on S3 while steps.train rewrote it,
    and s3fs raised FileExpired (the ETag it opened was gone): a traceback, evict exit 1, and a drill with
    no eviction. A live S3 API (moto) and s3fs; the object is rewritten between the open and the read, as
    the writer does every few seconds. Control: the same with no retries raises FileExpired."""
    from trainer import untrusted
    from trainer.storage import url_to_fs

    fs, base = url_to_fs(s3.new_prefix("replaced"))
    path = f"{base}/evidence.jsonl"
    fs.pipe_file(path, b'{"event": "step", "step": 1}\n')
    real_open = type(fs).open
    rewrites = []

    class RewrittenOnOpen(type(fs)):  # a writer that lands between the reader's open and its read
        def open(self, p, mode="rb", **kw):
            f = real_open(self, p, mode, **kw)
            if len(rewrites) < 1:
                rewrites.append(p)
                fs.pipe_file(p, b'{"event": "step", "step": 1}\n{"event": "step", "step": 2}\n')
            return f

    racing = RewrittenOnOpen(**fs.storage_options, skip_instance_cache=True)
    data = untrusted.read_bytes(racing, path, "evidence")
    assert data.count(b"\n") == 2 and rewrites == [path]  # the new version, read after the one that expired
    rewrites.clear()
    fs.pipe_file(path, b'{"event": "step", "step": 1}\n')
    retries, untrusted.REPLACED_RETRIES = untrusted.REPLACED_RETRIES, 0
    try:
        with pytest.raises(OSError) as e:
            untrusted.read_bytes(
                RewrittenOnOpen(**fs.storage_options, skip_instance_cache=True), path, "evidence"
            )
        assert type(e.value).__name__ == "FileExpired", e.value
    finally:
        untrusted.REPLACED_RETRIES = retries
