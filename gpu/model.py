"""The Qwen2.5-0.5B-shaped model of the GPU check: its config, its parameter count, and the build.

The numbers are Qwen/Qwen2.5-0.5B's public config.json. The weights are random (a fixed seed), the
tokenizer is the tiny trainer's byte-level BPE trained on the shipped corpus (about 500 ids, all below
the 151,936 embedding rows the model keeps), and everything is saved with save_pretrained, so the
trainer loads it through the real from_pretrained path. Nothing is downloaded.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

# Qwen/Qwen2.5-0.5B's config.json (Hugging Face Hub), the fields that shape the network.
QWEN25_05B: dict[str, Any] = dict(
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    hidden_act="silu",
    use_sliding_window=False,
    sliding_window=32768,
    max_window_layers=24,
)
QWEN25_05B_PARAMETERS = 494_032_768  # tied: the LM head is the embedding


def tiny_shape() -> dict[str, Any]:
    """`--tiny`: the same code path at a size a CPU runs in seconds (a dry run of the plumbing, not a measurement):
    the tiny trainer's network (trainer/tiny.py, its one home), with the 0.5B's tied head kept."""
    from trainer.tiny import TINY_ARCH, VOCAB_SIZE

    arch = {k: v for k, v in TINY_ARCH.items() if k != "tie_word_embeddings"}
    return {
        **arch,
        "vocab_size": VOCAB_SIZE,
        "sliding_window": arch["max_position_embeddings"],
        "max_window_layers": arch["num_hidden_layers"],
    }


# ---- the model ---------------------------------------------------------------------------------------


def qwen_config(eos_token_id: int = 0, tiny: bool = False, **overrides: Any):
    """A Qwen2Config of the Qwen2.5-0.5B shape (or `tiny_shape()`), with `overrides` on top."""
    from transformers import Qwen2Config

    arch = {**QWEN25_05B, **(tiny_shape() if tiny else {}), **overrides}
    return Qwen2Config(bos_token_id=eos_token_id, eos_token_id=eos_token_id, attention_dropout=0.0, **arch)


def parameter_count(config) -> int:
    """Parameters of the causal LM that `config` describes, counted on the meta device (no memory)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())  # parameters() yields a tied tensor once


def train_tokenizer(docs: list[str]):
    """The tiny trainer's tokenizer recipe (trainer/tiny.py): byte-level BPE on `docs`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from trainer.tiny import EOS, VOCAB_SIZE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        docs,
        trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=[EOS],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=EOS)


def build_model(
    out_dir: Path | str, docs: list[str], dtype: str = "bfloat16", tiny: bool = False, **overrides: Any
) -> Path:
    """Build (once) the Qwen2.5-0.5B-shaped model with random weights and its tokenizer at `out_dir`."""
    import torch
    from transformers import Qwen2ForCausalLM

    from trainer.tiny import BUILD_SEED  # the tiny model's seed: one home for how baton builds a model

    out = Path(out_dir)
    if (out / "config.json").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tokenizer = train_tokenizer(docs)
        tokenizer.save_pretrained(tmp)
        config = qwen_config(eos_token_id=tokenizer.eos_token_id, tiny=tiny, **overrides)
        assert len(tokenizer) <= config.vocab_size, "the tokenizer has more ids than the embedding has rows"
        device = "cuda" if torch.cuda.is_available() else "cpu"  # initialising 0.5B on a GPU takes a second
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(BUILD_SEED)
            if device == "cuda":
                torch.cuda.manual_seed(BUILD_SEED)
            model = Qwen2ForCausalLM(config)
        model.to(getattr(torch, dtype)).save_pretrained(tmp)
        del model
        os.rename(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_corpus(path: Path, n_docs: int = 3000) -> Path:
    """The shipped synthetic corpus's generator, ten times longer: ~200 samples of 512 tokens."""
    from trainer.tiny import synthetic_corpus

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n\n".join(synthetic_corpus(n_docs=n_docs)) + "\n")
    return path
