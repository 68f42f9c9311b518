"""In this process, on the device: placement, deterministic kernels, and the CUDA RNG.

- the model (eager attention, float32 and bfloat16) lands on the GPU with every parameter and buffer;
- deterministic mode raises on an op that has no deterministic CUDA kernel (torch.histc: listed in
  `torch.use_deterministic_algorithms`' docs among the ops that throw on CUDA), while the ops a training
  step uses (eager attention, dropout, the 2-D cross entropy that Hugging Face's loss calls) run and give
  bit-identical losses and gradients twice from the same seed;
- dropout on CUDA draws from the CUDA generator, and `trainer.rng` captures and restores it exactly.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.gpu.gpu_helpers import GPU_MARKS, measure
from tests.helpers import TINY_YAML

pytestmark = GPU_MARKS


@pytest.fixture
def deterministic():
    enabled = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(enabled, warn_only=warn_only)


def _load(model_dir, dtype: str, dropout: float = 0.1) -> torch.nn.Module:
    from trainer.config import load_config
    from trainer.model import load_model

    cfg = load_config(
        TINY_YAML,
        [
            f"model.path={model_dir}",
            "data.uri=unused",
            "checkpoint.uri=unused",
            f"model.dtype={dtype}",
            f"model.dropout={dropout}",
        ],
    )
    model = load_model(cfg, model_dir, torch.device("cuda", 0))
    model.train()
    return model


def test_an_op_without_a_deterministic_cuda_kernel_raises(deterministic):
    x = torch.rand(4096, device="cuda")
    with pytest.raises(RuntimeError, match="deterministic"):
        torch.histc(x, bins=16)
    torch.use_deterministic_algorithms(False)
    assert torch.histc(x, bins=16).sum().item() == 4096  # the raise came from the mode, not the op


def test_the_loss_path_is_allowed_and_reproducible(deterministic):
    """Hugging Face's causal-LM loss flattens to 2-D logits: nll_loss, not nll_loss2d (which throws)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    logits = torch.randn(512, 1000, device="cuda", generator=g, requires_grad=True)
    target = torch.randint(0, 1000, (512,), device="cuda", generator=g)
    out = []
    for _ in range(2):
        logits.grad = None
        loss = F.cross_entropy(logits, target, ignore_index=-100)
        loss.backward()
        out.append((loss.detach().clone(), logits.grad.clone()))
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_model_is_on_the_device_and_a_step_is_deterministic(deterministic, tiny_model, dtype):
    model = _load(tiny_model, dtype)
    assert model.config._attn_implementation == "eager"
    placed = {t.device.type for t in [*model.parameters(), *model.buffers()]}
    assert placed == {"cuda"}, f"tensors off the device: {placed}"
    want = getattr(torch, dtype)
    assert {p.dtype for p in model.parameters()} == {want}
    batch = torch.randint(0, model.config.vocab_size, (4, 64), generator=torch.Generator().manual_seed(1))
    batch = batch.to("cuda")

    def step(seed: int):
        torch.manual_seed(seed)  # seeds the CUDA generator too: dropout's masks
        model.zero_grad(set_to_none=True)
        before = torch.cuda.get_rng_state()
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        moved = not torch.equal(before, torch.cuda.get_rng_state())
        return loss.detach().clone(), {n: p.grad.clone() for n, p in model.named_parameters()}, moved

    l1, g1, moved = step(0)
    l2, g2, _ = step(0)
    l3, _, _ = step(1)
    assert moved, "dropout on CUDA did not draw from the CUDA generator"
    assert torch.equal(l1, l2), f"same seed, different loss: {l1.item()} vs {l2.item()}"
    differing = [n for n in g1 if not torch.equal(g1[n], g2[n])]
    assert not differing, f"same seed, different gradients: {differing[:5]}"
    assert not torch.equal(l1, l3), "another seed gave the same loss: dropout is not drawing at all"
    measure("deterministic_step", dtype=dtype, loss=l1.item(), tensors=len(g1))


def test_the_cuda_generator_is_captured_and_restored():
    from trainer import rng

    rng.seed_everything(0, 0)
    state = rng.capture()
    # Philox: 16 bytes (seed, offset) per device captured; today every visible device, one row each.
    assert "cuda" in state and state["cuda"].dtype == torch.uint8 and state["cuda"].numel() % 16 == 0
    first = (torch.rand(64, device="cuda"), F.dropout(torch.ones(4096, device="cuda"), 0.5))
    rng.restore(state)
    again = (torch.rand(64, device="cuda"), F.dropout(torch.ones(4096, device="cuda"), 0.5))
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    rng.seed_everything(0, 1)  # another rank: another stream
    assert not torch.equal(first[0], torch.rand(64, device="cuda"))
