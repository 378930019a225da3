"""The shared random stream (stream v2): Philox4x32-10 equal to triton.language.philox in all four
words, Random123's known answers, open-interval uniforms, and the counter layout's disjointness."""

import itertools

import pytest
import torch

from specdec_ext import _philox

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")


@triton.jit
def _philox_words(out_ptr, seed, c1, c2, c3, N: tl.constexpr):
    idx = tl.arange(0, N)
    w0, w1, w2, w3 = tl.philox(seed, idx, c1 + idx * 0, c2 + idx * 0, c3 + idx * 0)
    tl.store(out_ptr + idx, w0.to(tl.int64) & 0xFFFFFFFF)
    tl.store(out_ptr + N + idx, w1.to(tl.int64) & 0xFFFFFFFF)
    tl.store(out_ptr + 2 * N + idx, w2.to(tl.int64) & 0xFFFFFFFF)
    tl.store(out_ptr + 3 * N + idx, w3.to(tl.int64) & 0xFFFFFFFF)


@pytest.mark.parametrize("seed", [0, 1, 2**32 - 1, 2**32, 2**62 - 1, 1234567890123456789])
def test_eager_philox_matches_triton_in_every_word(seed):
    out = torch.zeros(4 * 256, dtype=torch.int64)
    _philox_words[(1,)](out, seed, 5, 77, 1, N=256)
    expected = torch.cat(_philox.philox4(torch.tensor(seed), torch.arange(256), 5, 77, 1))
    assert torch.equal(out, expected)


@pytest.mark.parametrize(
    "counter, key, words",
    [
        # Random123's known-answer vectors for Philox4x32-10 (kat_vectors): counter, key, output.
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF, 0xFFFFFFFF), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0), (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ],
)
def test_known_answers(counter, key, words):
    key_int = key[0] | (key[1] << 32)
    key_tensor = torch.tensor(key_int - 2**64 if key_int >= 2**63 else key_int)  # the same 64 bits as an int64
    assert tuple(int(w) for w in _philox.philox4(key_tensor, *counter)) == words


def test_uniforms_are_in_the_open_interval():
    extremes = torch.tensor([0, 1, 511, 512, 2**32 - 1], dtype=torch.int64)
    u = _philox.uint32_to_open_uniform(extremes)
    assert (u > 0).all() and (u < 1).all()
    assert float(u[0]) == 2.0**-24 and float(u[-1]) == 1 - 2.0**-24


def test_race_uniforms_take_word_v_mod_4_of_counter_v_div_4():
    keys = torch.tensor([7, 2**40 + 3])
    positions = torch.tensor([5, 2**33 + 9])  # the second crosses into the high position word
    u = _philox.race_uniforms(keys, positions, 10, _philox.SAMPLE_STREAM)
    for row in range(2):
        p = int(positions[row])
        for v in range(10):
            words = _philox.philox4(keys[row], v >> 2, p & 0xFFFFFFFF, p >> 32, _philox.SAMPLE_STREAM)
            assert float(u[row, v]) == float(_philox.uint32_to_open_uniform(words[v & 3]))


def test_counter_layout_is_one_to_one():
    """Every draw of a call (coins, tree coins, verify and sample races, several positions
    including ones past 2**32) owns a distinct (counter, word): no two share a random number."""
    vocab, ranks = 37, 3
    positions = [0, 1, 2, 2**32 - 1, 2**32, 2**32 + 1]
    seen = set()
    draws = 0
    for position in positions:
        words = (position & 0xFFFFFFFF, position >> 32)
        for rank in range(ranks):  # acceptance coins (rank 0 = a chain's coin)
            seen.add(((rank, *words, _philox.ACCEPT_STREAM), 0))
            draws += 1
        for stream, v in itertools.product((_philox.VERIFY_STREAM, _philox.SAMPLE_STREAM), range(vocab)):
            seen.add(((v >> 2, *words, stream), v & 3))
            draws += 1
    assert len(seen) == draws
    assert len({_philox.ACCEPT_STREAM, _philox.VERIFY_STREAM, _philox.SAMPLE_STREAM}) == 3


def test_streams_are_independent_and_uniform():
    keys = torch.tensor([42])
    positions = torch.tensor([3])
    a = _philox.race_uniforms(keys, positions, 100_000, _philox.VERIFY_STREAM)[0]
    b = _philox.race_uniforms(keys, positions, 100_000, _philox.SAMPLE_STREAM)[0]
    coins = _philox.coin_uniforms(keys, torch.arange(100_000)[None, :])[0]
    for x, y in ((a, b), (a, coins), (b, coins)):
        assert abs(float(torch.corrcoef(torch.stack([x, y]))[0, 1])) < 0.02
    for u in (a, b, coins):
        counts = torch.histc(u, bins=20, min=0, max=1)
        expected = u.numel() / 20
        assert float(((counts - expected) ** 2 / expected).sum()) < 60  # chi2(19).isf(1e-6) ~ 59.7
    # Neighbouring ids share a Philox call but no word: consecutive uniforms are uncorrelated.
    assert abs(float(torch.corrcoef(torch.stack([a[:-1], a[1:]]))[0, 1])) < 0.02


def test_keys_come_from_the_generator():
    g1 = torch.Generator().manual_seed(7)
    g2 = torch.Generator().manual_seed(7)
    assert _philox.draw_base_key(g1) == _philox.draw_base_key(g2)
    torch.manual_seed(3)
    k1 = _philox.draw_base_key(None)
    torch.manual_seed(3)
    assert k1 == _philox.draw_base_key(None)
    assert 0 <= k1 < _philox.KEY_BOUND
    keys = _philox.key_per_row(None, k1, 4, torch.device("cpu"))
    assert keys.tolist() == [k1, k1 + 1, k1 + 2, k1 + 3]


@pytest.mark.parametrize("seed", [0, 3, 2**40 + 5])
def test_keys_drawn_in_cpp_are_torch_randint(seed):
    """The C++ extension's draw (no tensor) is torch.randint(0, 2**62, (1,)) of the same generator
    state, from a given generator and from torch's default one, and leaves the same state behind."""
    from specdec_ext import _cpp_backend

    if _cpp_backend._C is None:
        pytest.skip("the C++ extension is not built")
    draw = _cpp_backend._C.draw_base_key
    g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
    for _ in range(5):
        assert draw(g1) == torch.randint(0, _philox.KEY_BOUND, (1,), generator=g2).item()
    assert torch.equal(g1.get_state(), g2.get_state())
    torch.manual_seed(seed)
    drawn = [draw(None) for _ in range(3)]
    torch.manual_seed(seed)
    assert drawn == [torch.randint(0, _philox.KEY_BOUND, (1,)).item() for _ in range(3)]
    assert draw(object()) is None  # not a CPU generator: the Python path decides
