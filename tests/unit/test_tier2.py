"""Tier 2 on a CPU: bounded nondeterminism injected into every run (BATON_NOISE, a seeded relative
perturbation of each gradient that models a reduction in another order), and the judgment of
steps/judge.py against it. A correct resume passes against the measured floor; the negative control
that skips the RNG restore, under the same noise, fails by a wide margin that the verdict states.
"""

from __future__ import annotations

import pytest

from steps.compare import compared_keys
from steps.judge import FLOOR_SLACK, judge
from tests.helpers import base_env, run, run_and_sigterm, tensors, trainer_cmd

DROPOUT = "model.dropout=0.1"
TOTAL = 40
NOISE = "1e-6"  # relative: about ten fp32 roundings
STOP_AT = 17


def _full(tiny_model, ckpt, seed: int) -> dict:
    rc, _, err = run(trainer_cmd(tiny_model, ckpt, DROPOUT), env=base_env(BATON_NOISE=f"{NOISE},{seed}"))
    assert rc == 0, err
    return tensors(ckpt, TOTAL)


def _resumed(tiny_model, ckpt, seed: int, **env: str) -> dict:
    noisy = base_env(BATON_NOISE=f"{NOISE},{seed}")
    rc, _, err = run_and_sigterm(trainer_cmd(tiny_model, ckpt, DROPOUT), at_step=STOP_AT, env=noisy)
    assert rc == 75, err
    rc, recs, err = run(trainer_cmd(tiny_model, ckpt, DROPOUT), env={**noisy, **env})
    assert rc == 0, err
    assert [r["from_step"] for r in recs if r["event"] == "resume"] == [STOP_AT]
    return tensors(ckpt, TOTAL)


@pytest.fixture(scope="module")
def noisy_runs(tiny_model, tmp_path_factory):
    """reference and replay (two uninterrupted runs that differ only in their noise), a correct
    resumed trial, and the RNG-skip control: four runs under the same noise scale."""
    mk = tmp_path_factory.mktemp
    return {
        "reference": _full(tiny_model, mk("ref"), seed=1),
        "replay": _full(tiny_model, mk("rep"), seed=2),
        "trial": _resumed(tiny_model, mk("trial"), seed=3),
        "control": _resumed(tiny_model, mk("control"), seed=3, BATON_SKIP_RESTORE="rng"),
    }


def test_the_noise_is_real_so_tier_1_cannot_pass(noisy_runs):
    ref, rep = noisy_runs["reference"], noisy_runs["replay"]
    verdict = judge(ref, rep, noisy_runs["trial"], compared_keys(ref), tier=1)
    assert verdict["floor"] > 0 and verdict["floor_l2"] > 0 and verdict["floor_differing"] > 0
    assert not verdict["equivalent"]


def test_a_correct_resume_passes_within_the_floor(noisy_runs):
    ref = noisy_runs["reference"]
    verdict = judge(ref, noisy_runs["replay"], noisy_runs["trial"], compared_keys(ref), tier=2)
    print(f"floor L2 {verdict['floor_l2']:.3g}, trial L2 {verdict['l2_diff']:.3g}, "
          f"ratio {verdict['diff_over_floor']:.2f} (slack {FLOOR_SLACK})")
    assert verdict["equivalent"], verdict
    assert verdict["max_abs_diff"] > 0  # the trial is noisy too: this is a Tier 2 pass, not Tier 1


def test_the_rng_skip_control_fails_by_a_wide_margin_under_the_same_noise(noisy_runs):
    ref = noisy_runs["reference"]
    verdict = judge(ref, noisy_runs["replay"], noisy_runs["control"], compared_keys(ref), tier=2)
    print(f"floor L2 {verdict['floor_l2']:.3g}, control L2 {verdict['l2_diff']:.3g}, "
          f"ratio {verdict['diff_over_floor']:.1f}")
    assert not verdict["equivalent"]
    assert verdict["diff_over_floor"] > 10 * FLOOR_SLACK, verdict  # far from the line, not near it


def test_a_floor_of_zero_makes_tier_2_exact(noisy_runs):
    ref, tri = noisy_runs["reference"], noisy_runs["trial"]
    keys = compared_keys(ref)
    assert not judge(ref, ref, tri, keys, tier=2)["equivalent"]
    assert judge(ref, ref, ref, keys, tier=2)["equivalent"]
