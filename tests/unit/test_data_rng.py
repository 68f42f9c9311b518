"""Data order, the loader's position, and the RNG capture: the pieces that resume relies on."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from trainer import rng
from trainer.config import DataConfig
from trainer.data import EpochData, EpochSampler, Geometry, epoch_permutation


def test_epoch_order_is_a_pure_function_of_seed_and_epoch():
    a = epoch_permutation(100, seed=1, epoch=3)
    assert torch.equal(a, epoch_permutation(100, seed=1, epoch=3))
    assert not torch.equal(a, epoch_permutation(100, seed=1, epoch=4))
    assert not torch.equal(a, epoch_permutation(100, seed=2, epoch=3))
    assert sorted(a.tolist()) == list(range(100))


def test_ranks_partition_the_epoch_and_world_sizes_agree_on_the_global_order():
    geo2 = Geometry(n_samples=50, batch_size=2, grad_accum=2, world=2)
    r0 = list(EpochSampler(geo2, seed=0, epoch=0, rank=0))
    r1 = list(EpochSampler(geo2, seed=0, epoch=0, rank=1))
    assert len(r0) == len(r1) == geo2.steps_in_epoch() * 4
    assert not set(r0) & set(r1)
    # The global sample stream is the same with one rank: interleave 2-rank micro-batches.
    geo1 = Geometry(n_samples=50, batch_size=2, grad_accum=2, world=1)
    one = list(EpochSampler(geo1, seed=0, epoch=0, rank=0))
    inter = [i for t in range(len(r0) // 2) for i in r0[2 * t : 2 * t + 2] + r1[2 * t : 2 * t + 2]]
    assert one[: len(inter)] == inter
    # Starting mid-epoch continues the same stream.
    later = list(EpochSampler(geo1, seed=0, epoch=0, rank=0, start=8))
    assert later == one[8 : 8 + len(later)]


@pytest.mark.parametrize("workers", [0, 2])
def test_loader_state_resumes_the_remaining_batches(workers):
    cfg = DataConfig(uri="x", batch_size=3, grad_accum=2, num_workers=workers)
    samples = torch.arange(60 * 4).view(60, 4)
    a = EpochData(cfg, samples, seed=5, rank=0, world=1)
    for _ in range(4):
        a.next_batch()
    state, yielded = a.loader.state_dict(), a.yielded
    rest = [a.next_batch() for _ in range(6)]
    b = EpochData(cfg, samples, seed=5, rank=0, world=1)
    b.seek(0, 0, state, yielded)
    assert all(torch.equal(x, b.next_batch()) for x in rest)
    assert b.position == a.position


def test_a_new_loader_iterator_leaves_the_global_rng_alone():
    cfg = DataConfig(uri="x", batch_size=2)
    d = EpochData(cfg, torch.zeros(20, 4, dtype=torch.long), seed=0, rank=0, world=1)
    before = torch.get_rng_state()
    d.next_batch()
    assert torch.equal(before, torch.get_rng_state())


def test_rng_capture_restores_every_generator_exactly():
    rng.seed_everything(11, rank=0)
    random.random(), np.random.rand(), torch.rand(1), random.gauss(0, 1)
    state = rng.capture()
    expect = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), torch.rand(3))
    rng.seed_everything(99, rank=0)
    rng.restore(state)
    got = (random.random(), random.gauss(0, 1), np.random.rand(3).tolist(), torch.rand(3))
    assert expect[:3] == got[:3] and torch.equal(expect[3], got[3])
    assert all(isinstance(v, torch.Tensor) for v in state.values())


def test_ranks_get_different_rng_streams():
    rng.seed_everything(0, rank=0)
    a = rng.capture()["torch"]
    rng.seed_everything(0, rank=1)
    assert not torch.equal(a, rng.capture()["torch"])


@pytest.mark.parametrize("dropout, advances", [(0.1, True), (0.0, False)])
def test_the_forward_pass_draws_from_the_rng_exactly_when_dropout_is_on(tiny_model, dropout, advances):
    # The negative controls use dropout > 0: without draws, a skipped RNG restore could not show.
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        tiny_model, attn_implementation="eager", attention_dropout=dropout
    ).train()
    before = torch.get_rng_state()
    model(input_ids=torch.arange(16).view(2, 8), labels=torch.arange(16).view(2, 8)).loss.backward()
    assert (not torch.equal(before, torch.get_rng_state())) == advances
