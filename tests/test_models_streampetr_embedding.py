"""models/streampetr/embedding.py: the sine and NeRF encodings against their formulas, MLN and the SE gate."""

from __future__ import annotations

import math

import torch

from drivetrain.models.streampetr import MLN, SEGate, nerf_encoding, sine_embedding_1d, sine_embedding_3d


def sine_by_formula(value: float, num_feats: int, temperature: float = 10000.0) -> torch.Tensor:
    """Entry ``k``: sin (even k) or cos (odd k) of ``2π·value / T^(2⌊k/2⌋/F)``, one by one in float64."""
    out = []
    for k in range(num_feats):
        angle = 2 * math.pi * value / temperature ** (2 * (k // 2) / num_feats)
        out.append(math.sin(angle) if k % 2 == 0 else math.cos(angle))
    return torch.tensor(out, dtype=torch.float64)


def test_sine_3d_is_per_axis_sin_cos_pairs_in_y_x_z_order() -> None:
    point = torch.tensor([0.3, 0.7, 0.1])
    emb = sine_embedding_3d(point, num_feats=16).double()
    assert emb.shape == (48,)
    # float32 angles up to 2π·0.7 ≈ 4.4 carry ~2^-24·4.4 ≈ 3e-7 error, and so do sin/cos of them: 2e-6 bounds it.
    torch.testing.assert_close(emb[:16], sine_by_formula(0.7, 16), rtol=0, atol=2e-6)  # y first
    torch.testing.assert_close(emb[16:32], sine_by_formula(0.3, 16), rtol=0, atol=2e-6)
    torch.testing.assert_close(emb[32:], sine_by_formula(0.1, 16), rtol=0, atol=2e-6)
    assert sine_embedding_3d(torch.rand(2, 5, 3)).shape == (2, 5, 384)


def test_sine_1d_of_an_age() -> None:
    ages = torch.tensor([[0.0], [0.5]])
    emb = sine_embedding_1d(ages, num_feats=8).double()
    torch.testing.assert_close(emb[0], sine_by_formula(0.0, 8), rtol=0, atol=0)  # sin 0 = 0, cos 0 = 1
    torch.testing.assert_close(emb[1], sine_by_formula(0.5, 8), rtol=0, atol=2e-6)
    assert sine_embedding_1d(torch.rand(3, 7, 1)).shape == (3, 7, 256)


def test_nerf_encoding_orders_sines_then_cosines_per_frequency() -> None:
    values = torch.tensor([0.2, -1.0, 3.0], dtype=torch.float64)
    enc = nerf_encoding(values, num_freqs=3)
    expected = torch.cat([f(values * 2.0**k) for k in range(3) for f in (torch.sin, torch.cos)])
    torch.testing.assert_close(enc, expected, rtol=0, atol=0)
    assert nerf_encoding(torch.rand(2, 4, 15)).shape == (2, 4, 180)  # StreamPETR's ego-motion code


def test_mln_starts_as_a_plain_layer_norm_whatever_the_condition() -> None:
    torch.manual_seed(0)
    mln = MLN(c_dim=5, f_dim=12)
    x, c = torch.randn(4, 12), torch.randn(4, 5) * 10
    torch.testing.assert_close(mln(x, c), torch.nn.functional.layer_norm(x, (12,)))
    torch.nn.init.normal_(mln.gamma.weight)  # once trained, the condition modulates the features
    assert not torch.allclose(mln(x, c), mln(x, torch.zeros_like(c)))


def test_se_gate_scales_each_channel_by_a_sigmoid_of_the_signal() -> None:
    torch.manual_seed(0)
    gate = SEGate(6)
    x, s = torch.randn(3, 6), torch.randn(3, 6)
    expected = x * torch.sigmoid(gate.expand(torch.relu(gate.reduce(s))))
    torch.testing.assert_close(gate(x, s), expected, rtol=0, atol=0)
    assert ((gate(x.abs(), s) <= x.abs()) & (gate(x.abs(), s) >= 0)).all()
