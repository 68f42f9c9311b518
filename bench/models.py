"""Models and corpora for the bench, all built locally from a config (nothing is downloaded).

- `tiny`: trainer/tiny.py's Qwen2 (about 140 k parameters) and its BPE tokenizer (512 tokens).
- `small`: the same tokenizer, hidden 256 and 4 layers (a few M parameters): a step that costs
  something, for the loop-overhead figure.
- `big`: hidden 768, 12 layers, 12 heads (4 KV heads), MLP 2048, vocab 32000, untied head: about
  125 M parameters, so model + AdamW state is about 1.5 GB in float32. The tiny tokenizer's ids are
  all below 32000, so it drives this model as well.
"""

from __future__ import annotations

import fcntl
import shutil
from pathlib import Path

from bench.common import TINY_CORPUS, WORK, log

BIG_ARCH = dict(
    hidden_size=768,
    intermediate_size=2048,
    num_hidden_layers=12,
    num_attention_heads=12,
    num_key_value_heads=4,
    vocab_size=32000,
    max_position_embeddings=512,
    tie_word_embeddings=False,
)
QUICK_ARCH = dict(
    BIG_ARCH,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
)
SMALL_ARCH = dict(
    hidden_size=256, intermediate_size=768, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2
)


def tiny_model() -> Path:
    from trainer.data import read_documents
    from trainer.tiny import build_tiny_qwen2

    return build_tiny_qwen2(WORK / "models" / "tiny-qwen2", read_documents(str(TINY_CORPUS)))


def small_model() -> Path:
    from trainer.data import read_documents
    from trainer.tiny import build_tiny_qwen2

    return build_tiny_qwen2(WORK / "models" / "small-qwen2", read_documents(str(TINY_CORPUS)), **SMALL_ARCH)


def big_model(quick: bool = False) -> Path:
    """The ~125 M Qwen2 (or a small stand-in with `quick`), random weights from a fixed seed."""
    arch = QUICK_ARCH if quick else BIG_ARCH
    out = WORK / "models" / ("quick-qwen2" if quick else "big-qwen2")
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / "config.json").exists():
            return out
        import torch
        from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

        tok = AutoTokenizer.from_pretrained(tiny_model())
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        config = Qwen2Config(
            eos_token_id=tok.eos_token_id, bos_token_id=tok.eos_token_id, attention_dropout=0.0, **arch
        )
        with torch.random.fork_rng():
            torch.manual_seed(1234)
            model = Qwen2ForCausalLM(config)
        log(f"built {out.name}: {n_params(model) / 1e6:.1f} M parameters")
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        tmp.rename(out)
    return out


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def resume_corpus(n_docs: int = 11000) -> Path:
    """A synthetic corpus large enough for more than 2 x 10^4 batches of 16 tokens in one epoch."""
    from trainer.tiny import synthetic_corpus

    path = WORK / f"resume-corpus-{n_docs}.txt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n\n".join(synthetic_corpus(n_docs=n_docs, seed=11)) + "\n")
        tmp.rename(path)
    return path
