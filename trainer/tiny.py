"""A tiny Qwen2 and its tokenizer, built locally so that nothing is downloaded.

The result is written with `save_pretrained` and then loaded like any other model, so the real
`from_pretrained` path is the one under test. Building is deterministic (fixed seed, a BPE trained on
the given corpus) and guarded by a file lock, so ranks and parallel runs that race see one copy.

    python -m trainer.tiny OUT_DIR [--corpus PATH]
    python -m trainer.tiny --write-corpus trainer/assets/tiny_corpus.txt
"""

from __future__ import annotations

import argparse
import fcntl
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path

TINY_ARCH = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
VOCAB_SIZE = 512
EOS = "<|endoftext|>"
BUILD_SEED = 1234


def build_tiny_qwen2(out_dir: str | Path, corpus_docs: list[str], **arch_overrides: int) -> Path:
    """Build (once) a tiny Qwen2 with a BPE tokenizer trained on `corpus_docs`, saved at `out_dir`."""
    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_path = out.parent / f".{out.name}.lock"
    with open(lock_path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "config.json").exists():
            return out
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
        try:
            _build_into(tmp, corpus_docs, **arch_overrides)
            # mkdtemp makes the folder 0700, and safetensors writes its file 0600: a model folder is read by others
            # (the image builds it as root and runs as uid 1000, which could read neither), so each gets what a
            # plain mkdir or open gives under the umask.
            umask = os.umask(0)
            os.umask(umask)
            for path in tmp.rglob("*"):
                path.chmod((0o777 if path.is_dir() else 0o666) & ~umask)
            tmp.chmod(0o777 & ~umask)
            os.rename(tmp, out)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def _build_into(out: Path, corpus_docs: list[str], **arch_overrides: int) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    bpe = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_docs, bpe)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)
    fast.save_pretrained(out)

    arch = {**TINY_ARCH, **arch_overrides}
    config = Qwen2Config(
        vocab_size=VOCAB_SIZE,
        eos_token_id=fast.eos_token_id,
        bos_token_id=fast.eos_token_id,
        attention_dropout=0.0,
        **arch,
    )
    with torch.random.fork_rng():
        torch.manual_seed(BUILD_SEED)
        model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)


# ---- a small synthetic corpus, generated from a fixed seed ------------------------------------------

_SUBJECTS = [
    "the pilot",
    "a farmer",
    "the old clock",
    "my neighbour",
    "the river",
    "a quiet robot",
    "the baker",
    "our teacher",
    "the night train",
    "a small dog",
    "the engineer",
    "the gardener",
]
_VERBS = [
    "watches",
    "repairs",
    "remembers",
    "follows",
    "paints",
    "carries",
    "counts",
    "measures",
    "builds",
    "finds",
    "crosses",
    "describes",
]
_OBJECTS = [
    "the bridge",
    "a red kite",
    "seven stones",
    "the winter field",
    "an empty box",
    "the harbour",
    "a long letter",
    "the bright window",
    "three apples",
    "the tall tower",
    "a paper map",
    "the storm",
]
_TAILS = [
    "before noon",
    "after the rain",
    "every morning",
    "with great care",
    "without a word",
    "near the station",
    "under the stars",
    "in the valley",
    "at the market",
    "for the first time",
]


def synthetic_corpus(n_docs: int = 300, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        sentences = []
        for _ in range(rng.randint(2, 5)):
            s = f"{rng.choice(_SUBJECTS)} {rng.choice(_VERBS)} {rng.choice(_OBJECTS)} {rng.choice(_TAILS)}."
            sentences.append(s[0].upper() + s[1:])
        docs.append(" ".join(sentences))
    return docs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m trainer.tiny",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("out_dir", nargs="?", help="where to save the model and tokenizer")
    ap.add_argument("--corpus", help="corpus used to train the tokenizer (default: the shipped one)")
    ap.add_argument("--write-corpus", metavar="PATH", help="write the synthetic corpus to PATH and exit")
    args = ap.parse_args(argv)
    if args.write_corpus:
        Path(args.write_corpus).write_text("\n\n".join(synthetic_corpus()) + "\n")
        return 0
    if not args.out_dir:
        ap.error("out_dir is required")
    from trainer.data import read_documents

    corpus = args.corpus or str(Path(__file__).parent / "assets" / "tiny_corpus.txt")
    out = build_tiny_qwen2(args.out_dir, read_documents(corpus, "text"))
    print(f"tiny Qwen2 at {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
