"""models/streampetr/decoder.py and heads.py: the SDPA attention is nn.MultiheadAttention's arithmetic (the
original's self-attention module) with its mask convention inverted; a decoder layer is the original's post-norm
order; the masked keys take no part; activation checkpointing recomputes the same function; the 3D box codes
and the focal head's boxes follow the original's formulas."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from drivetrain.models.streampetr.decoder import Attention, Decoder, DecoderLayer
from drivetrain.models.streampetr.heads import FocalHead, apply_ltrb, box_codes, class_branch, token_locations

E, H = 32, 4
# float64 attention through two kernels (SDPA vs MHA's bmm/softmax): reductions over E and K ≤ 64 terms differ by
# a few ulp of the result; 1e-12 is far above that (≈ 64·eps64 ≈ 1.4e-14) and far below any real difference.
F64 = dict(rtol=1e-12, atol=1e-12)


def mha_twin(attention: Attention) -> nn.MultiheadAttention:
    """An nn.MultiheadAttention holding the same parameters."""
    twin = nn.MultiheadAttention(E, H, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        twin.in_proj_weight.copy_(attention.in_proj.weight)
        twin.in_proj_bias.copy_(attention.in_proj.bias)
        twin.out_proj.weight.copy_(attention.out_proj.weight)
        twin.out_proj.bias.copy_(attention.out_proj.bias)
    return twin


def test_attention_is_multihead_attention_with_the_mask_inverted(gen) -> None:
    attention = Attention(E, H).double().eval()
    with torch.no_grad():
        attention.in_proj.bias.normal_(generator=gen)
        attention.out_proj.bias.normal_(generator=gen)
    q, k = torch.randn(2, 7, E, generator=gen, dtype=torch.float64), torch.randn(2, 11, E, generator=gen).double()
    v = torch.randn(2, 11, E, generator=gen, dtype=torch.float64)
    blocked = torch.rand(7, 11, generator=gen) < 0.4
    blocked[:, 0] = False  # every query sees at least one key (a fully blocked row is NaN in both)
    ours = attention(q, k, v, ~blocked)
    expected = mha_twin(attention)(q, k, v, attn_mask=blocked, need_weights=False)[0]
    torch.testing.assert_close(ours, expected, **F64)
    torch.testing.assert_close(attention(q, k, v), mha_twin(attention)(q, k, v, need_weights=False)[0], **F64)


def test_a_masked_key_has_no_influence(gen) -> None:
    attention = Attention(E, H).double().eval()
    q, k = torch.randn(1, 3, E, generator=gen, dtype=torch.float64), torch.randn(1, 5, E, generator=gen).double()
    visible = torch.ones(3, 5, dtype=torch.bool)
    visible[:, 4] = False
    changed = k.clone()
    changed[:, 4] += 100.0
    torch.testing.assert_close(attention(q, k, k, visible), attention(q, changed, changed, visible), **F64)
    assert not torch.allclose(attention(q, k, k), attention(q, changed, changed))


def test_decoder_layer_follows_the_post_norm_order(gen) -> None:
    layer = DecoderLayer(E, H, ffn_dims=64, dropout=0.0).double().eval()
    query, query_pos = (torch.randn(2, 5, E, generator=gen, dtype=torch.float64) for _ in range(2))
    tokens, token_pos = (torch.randn(2, 9, E, generator=gen, dtype=torch.float64) for _ in range(2))
    memory, memory_pos = (torch.randn(2, 4, E, generator=gen, dtype=torch.float64) for _ in range(2))
    visible = torch.rand(5, 9, generator=gen) > 0.3
    visible[:, 0] = True
    keys, keys_pos = torch.cat([query, memory], 1), torch.cat([query_pos, memory_pos], 1)
    self_attn, cross_attn = mha_twin(layer.self_attn), mha_twin(layer.cross_attn)
    x = query + self_attn(query + query_pos, keys + keys_pos, keys, attn_mask=~visible, need_weights=False)[0]
    x = layer.norms[0](x)
    x = layer.norms[1](x + cross_attn(x + query_pos, tokens + token_pos, tokens, need_weights=False)[0])
    ffn = layer.ffn[3](torch.relu(layer.ffn[0](x)))
    expected = layer.norms[2](x + ffn)
    torch.testing.assert_close(layer(query, query_pos, tokens, token_pos, memory, memory_pos, visible), expected, **F64)


def test_decoder_returns_every_layer_through_the_final_norm_and_checkpointing_recomputes_it(gen) -> None:
    torch.manual_seed(0)
    decoder = Decoder(num_layers=3, embed_dims=E, num_heads=H, ffn_dims=64, dropout=0.0).double()
    args = [torch.randn(2, n, E, generator=gen, dtype=torch.float64, requires_grad=True) for n in (5, 5, 9, 9, 4, 4)]
    out = decoder(*args)
    assert out.shape == (3, 2, 5, E)
    # the last entry is the last layer's output through post_norm: LayerNorm statistics hold per query
    torch.testing.assert_close(out.mean(-1), torch.zeros(3, 2, 5, dtype=torch.float64), rtol=0, atol=1e-12)
    grads = torch.autograd.grad(out.square().sum(), [*args, *decoder.parameters()])
    decoder.with_cp = True
    out_cp = decoder(*args)
    grads_cp = torch.autograd.grad(out_cp.square().sum(), [*args, *decoder.parameters()])
    torch.testing.assert_close(out_cp, out, rtol=0, atol=0)  # the same kernels in the same order
    for g, g_cp in zip(grads, grads_cp, strict=True):
        torch.testing.assert_close(g_cp, g, rtol=0, atol=0)


def test_box_codes_decode_the_reference_point_in_metres(gen) -> None:
    reference = torch.rand(2, 6, 3, generator=gen).clamp(0.01, 0.99)
    regression = torch.randn(3, 2, 6, 10, generator=gen)
    regression[..., :3] = 0.0  # no offset: the centre is the reference point itself
    pc_min, pc_size = torch.tensor([-51.2, -51.2, -5.0]), torch.tensor([102.4, 102.4, 8.0])
    codes = box_codes(regression, reference, pc_min, pc_size)
    torch.testing.assert_close(codes[..., :3], (reference * pc_size + pc_min).expand(3, -1, -1, -1))
    assert torch.equal(codes[..., 3:], regression[..., 3:])


def test_class_branch_starts_at_prior_one_percent() -> None:
    branch = class_branch(E, 10)
    assert torch.allclose(torch.sigmoid(branch[-1].bias), torch.full((10,), 0.01))


def test_token_locations_and_ltrb_boxes() -> None:
    loc = token_locations(2, 3, 16, (48, 32))
    expected = torch.tensor([[8 / 48, 8 / 32], [24 / 48, 8 / 32], [40 / 48, 8 / 32], [8 / 48, 24 / 32]])
    torch.testing.assert_close(loc[:4], expected)
    boxes = apply_ltrb(
        torch.tensor([[0.5, 0.5], [0.1, 0.9]]), torch.tensor([[0.1, 0.2, 0.3, 0.1], [0.5, 0.1, 0.1, 0.5]])
    )
    torch.testing.assert_close(boxes[0], torch.tensor([0.6, 0.45, 0.4, 0.3]))  # x 0.4…0.8, y 0.3…0.6
    torch.testing.assert_close(boxes[1], torch.tensor([0.1, 0.9, 0.2, 0.2]))  # clamped at 0 and 1


def test_focal_head_outputs_the_focal_loss_inputs(gen) -> None:
    head = FocalHead(32, num_classes=10, stride=16)
    out = head(torch.randn(2 * 3, 32, 4, 6, generator=gen), (96, 64), batch_size=2)
    assert out["cls_logits"].shape == (2, 3, 24, 10) and out["boxes"].shape == (2, 3, 24, 4)
    assert out["centres"].shape == (2, 3, 24, 2) and out["centerness"].shape == (2, 3, 4, 6)
    assert ((out["boxes"] >= 0) & (out["boxes"] <= 1)).all()
    assert math.isclose(torch.sigmoid(head.centerness.bias).item(), 0.01, rel_tol=1e-6)
    with pytest.raises(ValueError, match="multiple of 32"):
        FocalHead(48)
