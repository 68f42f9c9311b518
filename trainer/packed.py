"""The corpus packed once per run: tokenized and cut into samples at the first start, kept beside the
run's checkpoints, and read back at every restart instead of loading the tokenizer and tokenizing again.

    <root>/runs/<run_id>/corpus/<key>.json   the header (strict JSON, written last)
    <root>/runs/<run_id>/corpus/<key>.bin    the samples: int32, little-endian, [samples, seq_len]

The key is a sha256 over what the samples are a function of: the corpus's bytes, the tokenizer's
files, `data.seq_len`, `data.text_field`, the corpus's format (JSONL or text) and this layout's version.
A restart still reads the corpus (to hash it; a read runs at the disk's speed, tokenizing does not) and
the tokenizer's files, but neither imports nor runs the tokenizer.

What the bucket holds is untrusted, like a checkpoint: the header must have exactly the known fields
with the expected key and shape, the samples file exactly the size it says and its checksum, and every
token id must lie in [0, vocab_size) of the model's config. A cache that fails any of it, or that cannot
be read or written, is passed over with a log line and the corpus is packed as before: a cache is never
the reason a run fails.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.checkpoint import corpus_path, digest
from trainer.data import documents, pack
from trainer.model import load_tokenizer  # transformers is imported only when it is called
from trainer.records import log
from trainer.storage import is_local, url_to_fs
from trainer.untrusted import Refused, parse_json, read_bytes

LAYOUT = 1
DTYPE = "int32"
ALGORITHM = "crc32c"  # corruption, not forgery: a forger who can write the bucket can write the corpus too
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "added_tokens.json",
    "chat_template.jinja",
)
HEADER_FIELDS = {"layout", "key", "samples", "seq_len", "dtype", "size", ALGORITHM}


def tokenizer_identity(model_path: str | Path) -> str:
    """sha256 over the tokenizer's files in the model folder (names, sizes and bytes)."""
    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        p = Path(model_path) / name
        if p.is_file():
            data = p.read_bytes()
            h.update(f"{name}\0{len(data)}\0".encode())
            h.update(data)
    return h.hexdigest()


def corpus_key(raw: bytes, uri: str, tokenizer_id: str, seq_len: int, text_field: str) -> str:
    """The key of a packing: what the samples depend on, hashed."""
    what = {
        "layout": LAYOUT,
        "corpus_sha256": hashlib.sha256(raw).hexdigest(),
        "jsonl": uri.endswith(".jsonl"),
        "tokenizer": tokenizer_id,
        "seq_len": seq_len,
        "text_field": text_field,
    }
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()


class PackedCorpus:
    """The packings of one run, under `<run_path>/corpus` of the checkpoint store."""

    def __init__(self, root_uri: str, run_id: str) -> None:
        self.fs, root = url_to_fs(root_uri)
        self.folder = corpus_path(root, run_id)

    def load(self, key: str, seq_len: int, vocab_size: int | None) -> torch.Tensor | None:
        """The samples of `key`, checked; None when there is no usable packing (logged when one was refused)."""
        head, body = f"{self.folder}/{key}.json", f"{self.folder}/{key}.bin"
        try:
            if not self.fs.exists(head):
                return None
            header = _header(read_bytes(self.fs, head, "corpus_header", "its header"), key, seq_len)
            # Never more than the header declares: a planted samples file of many GB is refused unread.
            data = read_bytes(self.fs, body, "corpus_samples", "its samples file", cap=header["size"])
            return _checked(header, data, vocab_size)
        except (Refused, ValueError) as e:
            log(f"the packed corpus {key[:12]} is refused ({e}); packing again")
            return None
        except Exception as e:  # noqa: BLE001 - a cache that cannot be read is packed again
            log(
                f"the packed corpus {key[:12]} could not be read ({type(e).__name__}: {str(e)[:200]}); packing again"
            )
            return None

    def save(self, key: str, samples: torch.Tensor) -> None:
        """Write the samples, then the header (a reader that sees a header sees the samples whole)."""
        data = samples.to(torch.int32).numpy().astype("<i4").tobytes()
        header = {
            "layout": LAYOUT,
            "key": key,
            "samples": int(samples.shape[0]),
            "seq_len": int(samples.shape[1]),
            "dtype": DTYPE,
            "size": len(data),
            ALGORITHM: digest.of_bytes(ALGORITHM, data),
        }
        try:
            if is_local(self.fs):
                self.fs.makedirs(self.folder, exist_ok=True)
            with self.fs.open(f"{self.folder}/{key}.bin", "wb") as f:
                f.write(data)
            with self.fs.open(f"{self.folder}/{key}.json", "wb") as f:
                f.write(json.dumps(header, sort_keys=True).encode())
        except Exception as e:  # noqa: BLE001 - the run goes on without it; the next start packs again
            log(f"warning: the packed corpus could not be written ({type(e).__name__}: {str(e)[:200]})")


def _header(raw_header: bytes, key: str, seq_len: int) -> dict[str, Any]:
    """A packing's header read from the store (untrusted.parse_json: strict, depth-capped); ValueError for
    anything that does not hold."""
    header = parse_json(raw_header, "its header")
    if not isinstance(header, dict) or set(header) != HEADER_FIELDS:
        raise ValueError(f"its header must have exactly the fields {sorted(HEADER_FIELDS)}")
    if header["layout"] != LAYOUT or header["dtype"] != DTYPE or header["key"] != key:
        raise ValueError("its header is of another layout, type or key")
    n, length, size = header["samples"], header["seq_len"], header["size"]
    if not all(type(v) is int for v in (n, length, size)) or length != seq_len or n < 1:
        raise ValueError(f"its shape is not [samples >= 1, {seq_len}]")
    if size != n * length * 4:
        raise ValueError(f"its header says {size} bytes of {n} x {length} int32")
    return header


def _checked(header: dict[str, Any], data: bytes, vocab_size: int | None) -> torch.Tensor:
    """The samples of a packing whose header `_header` accepted; ValueError for anything that does not hold."""
    n, length, size = header["samples"], header["seq_len"], header["size"]
    if len(data) != size:
        raise ValueError(
            f"its samples file has {len(data)} bytes, its header says {size} of {n} x {length} int32"
        )
    if not isinstance(header[ALGORITHM], str) or digest.of_bytes(ALGORITHM, data) != header[ALGORITHM]:
        raise ValueError(f"its samples do not match their {ALGORITHM}")
    ids = np.frombuffer(data, dtype="<i4").reshape(n, length)
    low, high = int(ids.min()), int(ids.max())
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        raise ValueError(
            f"its token ids span [{low}, {high}], outside the model's vocabulary of {vocab_size}"
        )
    return torch.from_numpy(ids.astype(np.int64))


def vocab_size(model_path: str | Path) -> int | None:
    """`vocab_size` from the model folder's config.json (None when it has none)."""
    try:
        value = json.loads((Path(model_path) / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        return None
    return value if type(value) is int and value > 0 else None


def packed_samples(
    raw: bytes,
    uri: str,
    text_field: str,
    seq_len: int,
    model_path: str | Path,
    cache: PackedCorpus | None,
    write: bool,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The samples of the corpus `raw` (read from `uri`): from `cache` when it holds them, else tokenized
    and packed (and written to `cache` when `write`: one rank writes). Returns them and what happened, for
    the `resume` record: {"packed": "cache" | "tokenized", "key": ...}."""
    key = corpus_key(raw, uri, tokenizer_identity(model_path), seq_len, text_field)
    if cache is not None and (samples := cache.load(key, seq_len, vocab_size(model_path))) is not None:
        return samples, {"packed": "cache", "key": key[:16]}
    samples = pack(documents(raw, uri, text_field), load_tokenizer(Path(model_path)), seq_len)
    if cache is not None and write:
        cache.save(key, samples)
    return samples, {"packed": "tokenized", "key": key[:16]}
