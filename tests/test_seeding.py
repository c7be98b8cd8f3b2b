"""Keyed random streams: a step's draws depend on (seed, step, rank) alone, a sample's on (seed, epoch, sample)."""

import random

import numpy as np
import torch

from trainrun.core.seeding import keyed_seed, seed_everything, seed_step


def test_keyed_seeds_are_numpys_seed_sequence_of_the_keys_and_tell_nearby_keys_apart():
    assert keyed_seed(0, 1, 2) == 3071860871404845570  # SeedSequence([0, 1, 2]).generate_state(1, uint64)
    assert keyed_seed(-1) == keyed_seed(2**64 - 1)  # negative keys wrap as uint64
    seeds = {keyed_seed(0, 1, step, rank) for step in range(100) for rank in range(8)}
    assert len(seeds) == 800


def test_a_steps_draws_depend_on_seed_step_and_rank_alone_and_leave_python_and_numpy_alone():
    """What came before (another history, a resume) does not change a step's draws."""
    seed_step(7, 30, 1, torch.device("cpu"))
    expected = torch.rand(4)
    torch.rand(1000)  # another history
    random.seed(5), np.random.seed(5)
    seed_step(7, 30, 1, torch.device("cpu"))
    assert torch.equal(torch.rand(4), expected)
    assert (random.random(), np.random.rand()) == (random.Random(5).random(), np.random.RandomState(5).rand())
    assert torch.initial_seed() == keyed_seed(7, 1, 30, 1)
    for other in ((8, 30, 1), (7, 31, 1), (7, 30, 0)):
        seed_step(*other, torch.device("cpu"))
        assert not torch.equal(torch.rand(4), expected), other


def test_a_step_seeds_its_own_gpus_generator_only(monkeypatch):
    """Rank 3 of 8 GPUs seeds cuda:3's generator (a host-side set); the other GPUs' are untouched."""
    generators = [torch.Generator().manual_seed(100 + index) for index in range(8)]
    monkeypatch.setattr(torch.cuda, "default_generators", generators)
    seed_step(7, 30, 3, torch.device("cuda", 3))
    assert [g.initial_seed() for g in generators] == [100, 101, 102, keyed_seed(7, 1, 30, 3), 104, 105, 106, 107]


def test_seed_everything_seeds_python_numpy_and_torch():
    seed_everything(2**32 + 5)  # NumPy takes 32 bits: the seed modulo 2**32
    drawn = (random.random(), np.random.rand(), torch.rand(1))
    assert drawn[0] == random.Random(2**32 + 5).random() and drawn[1] == np.random.RandomState(5).rand()
    assert torch.equal(drawn[2], torch.rand(1, generator=torch.Generator().manual_seed(2**32 + 5)))
