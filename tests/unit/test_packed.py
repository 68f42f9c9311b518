"""The packed corpus kept beside the run's checkpoints (trainer/packed.py): a restart reads back exactly
the samples that tokenizing gives, and a packing that is corrupt, forged or of another key is refused
and the corpus tokenized again. Each refusal has its control: the same cache untouched is used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers import CORPUS
from trainer.data import read_corpus
from trainer.packed import PackedCorpus, corpus_key, packed_samples, tokenizer_identity

SEQ = 64


def samples(model, cache, seq_len=SEQ, write=True):
    raw = read_corpus(str(CORPUS))
    return packed_samples(raw, str(CORPUS), "text", seq_len, model, cache, write)


@pytest.fixture
def primed(tiny_model, tmp_path):
    """A cache with one packing in it, the samples tokenizing gave, and the packing's two files."""
    cache = PackedCorpus(str(tmp_path / "ck"), "run-1")
    fresh, how = samples(tiny_model, cache)
    assert how["packed"] == "tokenized"
    key = corpus_key(read_corpus(str(CORPUS)), str(CORPUS), tokenizer_identity(tiny_model), SEQ, "text")
    folder = Path(cache.folder)
    return cache, fresh, folder / f"{key}.json", folder / f"{key}.bin"


def test_a_restart_reads_back_exactly_what_tokenizing_gave(tiny_model, primed):
    cache, fresh, header, body = primed
    again, how = samples(tiny_model, cache)
    assert how["packed"] == "cache" and again.dtype == fresh.dtype == torch.int64
    assert torch.equal(again, fresh)
    # Without the cache, the same samples again: the cache changes nothing that is computed.
    plain, how = samples(tiny_model, None)
    assert how["packed"] == "tokenized" and torch.equal(plain, fresh)


def test_another_seq_len_or_corpus_is_another_key(tiny_model, primed, tmp_path):
    cache, fresh, header, body = primed
    other, how = samples(tiny_model, cache, seq_len=32)
    assert how["packed"] == "tokenized" and other.shape[1] == 32
    corpus = tmp_path / "other.txt"
    corpus.write_bytes(read_corpus(str(CORPUS)) + b"\n\none more document\n")
    _, how = packed_samples(corpus.read_bytes(), str(corpus), "text", SEQ, tiny_model, cache, True)
    assert how["packed"] == "tokenized"


def test_only_one_rank_writes(tiny_model, tmp_path):
    cache = PackedCorpus(str(tmp_path / "ck"), "run-1")
    samples(tiny_model, cache, write=False)
    assert not Path(cache.folder).exists()


def _flip(body: Path) -> None:
    data = bytearray(body.read_bytes())
    data[len(data) // 2] ^= 0x01
    body.write_bytes(bytes(data))


def _forge(body: Path, header: Path, token: int) -> None:
    """Rewrite one token id and the header's checksum with it: what a writer of the bucket can do."""
    import numpy as np

    from trainer.checkpoint import digest

    ids = np.frombuffer(body.read_bytes(), dtype="<i4").copy()
    ids[3] = token
    body.write_bytes(ids.tobytes())
    h = json.loads(header.read_text())
    h["crc32c"] = digest.of_bytes("crc32c", ids.tobytes())
    header.write_text(json.dumps(h))


def _edit_header(header: Path, **changes) -> None:
    h = json.loads(header.read_text())
    h.update(changes)
    header.write_text(json.dumps(h))


ATTACKS = {
    "a flipped byte": (lambda header, body: _flip(body), "do not match their crc32c"),
    "a truncated samples file": (lambda header, body: body.write_bytes(body.read_bytes()[:-4]), "bytes"),
    "a token id beyond the vocabulary": (
        lambda header, body: _forge(body, header, 10**6),
        "outside the model's vocabulary",
    ),
    "a negative token id": (lambda header, body: _forge(body, header, -1), "outside the model's vocabulary"),
    "an extra header field": (lambda header, body: _edit_header(header, extra=1), "exactly the fields"),
    "another key": (lambda header, body: _edit_header(header, key="0" * 64), "another layout, type or key"),
    "a NaN in the header": (
        lambda header, body: header.write_text(
            header.read_text().replace('"samples": ', '"samples": NaN, "x": ')
        ),
        "not JSON",
    ),
    "a header that is a list": (lambda header, body: header.write_text("[1, 2]"), "exactly the fields"),
    "a shape that is a float": (lambda header, body: _edit_header(header, samples=1.5), "shape"),
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_a_bad_packing_is_refused_and_the_corpus_tokenized_again(tiny_model, primed, attack, capsys):
    cache, fresh, header, body = primed
    plant, why = ATTACKS[attack]
    # Control: untouched, the cache is used.
    assert samples(tiny_model, cache, write=False)[1]["packed"] == "cache"
    plant(header, body)
    got, how = samples(tiny_model, cache, write=False)
    assert how["packed"] == "tokenized" and torch.equal(got, fresh)
    err = capsys.readouterr().err
    assert "is refused" in err and why in err, err


def test_a_cache_that_cannot_be_written_is_not_a_failure(tiny_model, tmp_path, capsys):
    blocked = tmp_path / "ck"
    blocked.write_text("a file where the store's folder would be")
    got, how = samples(tiny_model, PackedCorpus(str(blocked), "run-1"))
    assert how["packed"] == "tokenized" and got.shape[1] == SEQ
    assert "could not be written" in capsys.readouterr().err


def test_pack_cache_is_not_in_the_fingerprint():
    from tests.helpers import TINY_YAML
    from trainer.config import load_config

    on = load_config(str(TINY_YAML), ["model.path=/m", "data.uri=/c"])
    off = load_config(str(TINY_YAML), ["model.path=/m", "data.uri=/c", "data.pack_cache=false"])
    assert not off.data.pack_cache and on.fingerprint == off.fingerprint
