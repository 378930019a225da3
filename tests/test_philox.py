"""The eager Philox stream equals triton.language.philox bit for bit, and its uniforms exclude 0."""

import pytest
import torch

from specdec_ext import _philox

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _philox_words(out_ptr, seed, c1, c2, c3, N: tl.constexpr):
    idx = tl.arange(0, N)
    word, _, _, _ = tl.philox(seed, idx, c1 + idx * 0, c2 + idx * 0, c3 + idx * 0)
    tl.store(out_ptr + idx, word.to(tl.int64) & 0xFFFFFFFF)


@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1, 2**32, 2**62 - 1, 1234567890123456789])
def test_eager_philox_matches_triton(seed):
    out = torch.zeros(256, dtype=torch.int64)
    _philox_words[(1,)](out, seed, 5, 77, 1, N=256)
    expected = _philox.philox(torch.tensor([seed]), torch.arange(256), 5, 77, 1)
    assert torch.equal(out, expected)


def test_known_answer():
    # Philox4x32-10 with zero key and counter (Random123 known-answer test, word 0).
    assert int(_philox.philox(torch.tensor([0]), 0, 0, 0, 0)) == 0x6627E8D5


def test_uniforms_are_in_the_open_interval():
    extremes = torch.tensor([0, 1, 511, 512, 2**32 - 1], dtype=torch.int64)
    u = _philox.uint32_to_open_uniform(extremes)
    assert (u > 0).all() and (u < 1).all()
    assert float(u[0]) == 2.0**-24 and float(u[-1]) == 1 - 2.0**-24


def test_streams_are_disjoint_and_uniform():
    seed = torch.tensor([42])
    a = _philox.uniforms(seed, torch.arange(100_000), 0, 0, _philox.ACCEPT_STREAM)
    b = _philox.uniforms(seed, torch.arange(100_000), 0, 0, _philox.SAMPLE_STREAM)
    assert not torch.equal(a, b)
    assert abs(float(torch.corrcoef(torch.stack([a, b]))[0, 1])) < 0.02
    counts = torch.histc(a, bins=20, min=0, max=1)
    expected = 100_000 / 20
    assert float(((counts - expected) ** 2 / expected).sum()) < 60  # chi2(19) isf(1e-6) ~ 59.7


def test_seed_comes_from_the_generator():
    g1 = torch.Generator().manual_seed(7)
    g2 = torch.Generator().manual_seed(7)
    assert torch.equal(_philox.draw_seed(g1, torch.device("cpu")), _philox.draw_seed(g2, torch.device("cpu")))
    torch.manual_seed(3)
    s1 = _philox.draw_seed(None, torch.device("cpu"))
    torch.manual_seed(3)
    assert torch.equal(s1, _philox.draw_seed(None, torch.device("cpu")))
