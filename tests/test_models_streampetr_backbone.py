"""models/streampetr/backbone.py: ResNet-50 trunk, CPFPN neck, the tiny backbone and build_backbone."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from drivetrain.models.streampetr.backbone import CPFPN, ResNet50, ResNetBackbone, TinyBackbone, build_backbone

# torchvision's resnet50 has 25,557,032 parameters, of which fc holds 2048·1000 + 1000.
RESNET50_WITHOUT_FC = 25_557_032 - (2048 * 1000 + 1000)


def randomise_norms(model: nn.Module, generator: torch.Generator) -> None:
    """Give every BN non-trivial affine parameters and running statistics (init leaves bn3 at zero)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                c = m.num_features
                m.weight.copy_(torch.rand(c, generator=generator) + 0.5)
                m.bias.copy_(torch.randn(c, generator=generator) * 0.1)
                m.running_mean.copy_(torch.randn(c, generator=generator) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=generator) + 0.5)


def test_tiny_maps_images_to_stride_16_embeddings() -> None:
    model = build_backbone("tiny", 64, width=16)
    out = model(torch.randn(6, 3, 48, 80))
    assert model.stride == 16 and out.shape == (6, 64, 3, 5)


def test_resnet50_maps_images_to_stride_16_embeddings() -> None:
    model = build_backbone("resnet50", 256)
    out = model(torch.randn(1, 3, 64, 160))
    assert model.stride == 16 and out.shape == (1, 256, 4, 10)


def test_resnet50_trunk_returns_c4_and_c5() -> None:
    c4, c5 = ResNet50()(torch.randn(1, 3, 64, 96))
    assert c4.shape == (1, 1024, 4, 6) and c5.shape == (1, 2048, 2, 3)


def test_resnet50_trunk_has_torchvision_parameter_count() -> None:
    trunk = ResNet50()
    assert RESNET50_WITHOUT_FC == 23_508_032
    assert sum(p.numel() for p in trunk.parameters()) == RESNET50_WITHOUT_FC


def test_resnet50_trunk_uses_torchvision_parameter_names() -> None:
    state = ResNet50().state_dict()
    expected = {
        "conv1.weight": (64, 3, 7, 7),
        "bn1.running_var": (64,),
        "layer1.0.downsample.0.weight": (256, 64, 1, 1),
        "layer2.0.conv2.weight": (128, 128, 3, 3),  # the stride-2 conv of style="pytorch"
        "layer3.5.bn3.weight": (1024,),
        "layer4.0.downsample.1.num_batches_tracked": (),
        "layer4.2.conv3.weight": (2048, 512, 1, 1),
    }
    for name, shape in expected.items():
        assert state[name].shape == shape, name
    assert "layer1.1.downsample.0.weight" not in state
    assert ResNet50().layer2[0].conv2.stride == (2, 2) and ResNet50().layer2[0].conv1.stride == (1, 1)


def test_every_resnet_backbone_parameter_gets_a_gradient() -> None:
    # CPFPN builds no 3×3 conv for level 1 so that nothing is unused (DDP with checkpointing needs that).
    model = build_backbone("resnet50", 32)
    model(torch.randn(1, 3, 64, 64)).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_frozen_stages_one_freezes_stem_and_stage_one_in_eval_mode() -> None:
    trunk = ResNet50(frozen_stages=1).train()
    frozen = [trunk.conv1, trunk.bn1, trunk.layer1]
    assert all(not p.requires_grad for m in frozen for p in m.parameters())
    assert all(p.requires_grad for m in (trunk.layer2, trunk.layer3, trunk.layer4) for p in m.parameters())
    norms = [m for m in trunk.modules() if isinstance(m, nn.BatchNorm2d)]
    frozen_norms = {id(m) for f in frozen for m in f.modules() if isinstance(m, nn.BatchNorm2d)}
    assert len(frozen_norms) == 1 + 3 * 3 + 1  # stem, three blocks of three, one downsample
    assert all(m.training == (id(m) not in frozen_norms) for m in norms)
    before = trunk.bn1.running_mean.clone()
    trunk(torch.randn(2, 3, 64, 64))
    assert torch.equal(trunk.bn1.running_mean, before)


def test_published_frozen_stages_freezes_nothing() -> None:
    trunk = ResNet50(frozen_stages=-1).train()
    assert all(p.requires_grad for p in trunk.parameters())
    assert all(m.training for m in trunk.modules())


def test_norm_eval_keeps_every_bn_in_eval_mode_and_statistics_fixed() -> None:
    trunk = ResNet50(norm_eval=True).train()
    assert trunk.training and trunk.layer4[2].conv3.training
    assert not any(m.training for m in trunk.modules() if isinstance(m, nn.BatchNorm2d))
    before = {k: v.clone() for k, v in trunk.state_dict().items()}
    trunk(torch.randn(2, 3, 64, 64))
    assert all(torch.equal(v, trunk.state_dict()[k]) for k, v in before.items())


def test_frozen_norm_affine_needs_no_zero_init() -> None:
    trunk = ResNet50(norm_requires_grad=False, zero_init_residual=False)
    assert not any(p.requires_grad for m in trunk.modules() if isinstance(m, nn.BatchNorm2d) for p in m.parameters())
    assert trunk.conv1.weight.requires_grad
    with pytest.raises(ValueError, match="zero_init_residual"):
        ResNet50(norm_requires_grad=False)


def test_checkpointed_blocks_match_plain_blocks() -> None:
    generator = torch.Generator().manual_seed(0)
    plain = ResNetBackbone(embed_dims=16).double()
    randomise_norms(plain, generator)
    checkpointed = ResNetBackbone(embed_dims=16, with_cp=True).double()
    checkpointed.load_state_dict(plain.state_dict())
    images = torch.randn(2, 3, 64, 64, dtype=torch.float64, generator=generator)
    outputs, grads = [], []
    for model in (plain, checkpointed):
        x = images.clone().requires_grad_(True)
        out = model(x)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        outputs.append(out.detach())
        grads.append([x.grad] + [p.grad for p in model.parameters()])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-12, atol=1e-12)
    for g_cp, g in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(g_cp, g, rtol=1e-10, atol=1e-12)
    # The recomputation in backward leaves the BN running statistics as one forward left them.
    for (name, b_cp), b in zip(checkpointed.named_buffers(), plain.buffers(), strict=True):
        assert torch.equal(b_cp, b), name
    assert int(checkpointed.trunk.layer3[0].bn2.num_batches_tracked) == 1


def test_a_checkpointed_block_compiles_in_one_graph() -> None:
    """The compiled step traces the published backbone's checkpointed blocks (``with_cp``) with ``fullgraph=True``
    (run book part 6): the same output, gradients and BN statistics (advanced once) as the eager block."""
    from drivetrain.models.streampetr.backbone import Bottleneck

    generator = torch.Generator().manual_seed(0)
    eager = Bottleneck(16, 4, stride=2, with_cp=True).double()
    randomise_norms(eager, generator)
    compiled = Bottleneck(16, 4, stride=2, with_cp=True).double()
    compiled.load_state_dict(eager.state_dict())
    images = torch.randn(2, 16, 8, 8, dtype=torch.float64, generator=generator)
    step = torch.compile(compiled, fullgraph=True, dynamic=False, backend="aot_eager")
    outputs, grads = [], []
    for run, model in ((eager, eager), (step, compiled)):
        x = images.clone().requires_grad_(True)
        out = run(x)
        (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        outputs.append(out.detach())
        grads.append([x.grad] + [p.grad for p in model.parameters()])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-12, atol=1e-12)  # float64, the same ops
    for g_compiled, g in zip(grads[1], grads[0], strict=True):
        torch.testing.assert_close(g_compiled, g, rtol=1e-10, atol=1e-12)
    for (name, b_compiled), b in zip(compiled.named_buffers(), eager.buffers(), strict=True):
        assert torch.equal(b_compiled, b), name
    assert int(compiled.bn2.num_batches_tracked) == 1


def test_checkpointing_is_off_without_grad() -> None:
    model = ResNetBackbone(embed_dims=16, with_cp=True).eval()
    with torch.no_grad():
        assert model(torch.randn(1, 3, 64, 64)).shape == (1, 16, 4, 4)


def test_cpfpn_level_0_adds_upsampled_c5_to_c4() -> None:
    neck = CPFPN([3, 4], 2)
    with torch.no_grad():
        for conv in neck.modules():
            if isinstance(conv, nn.Conv2d):
                conv.weight.zero_()
                conv.bias.zero_()
        neck.lateral_convs[1].weight[:, :2, 0, 0] = torch.eye(2)  # C5 lateral keeps channels 0, 1
        neck.fpn_conv.weight[:, :, 1, 1] = torch.eye(2)  # the 3×3 conv passes its centre through
    c4 = torch.randn(1, 3, 4, 6)
    c5 = torch.arange(1.0, 1 + 4 * 2 * 3).view(1, 4, 2, 3)
    level0, level1 = neck([c4, c5])
    # C4's lateral is zero: level 0 is C5's channels 0, 1 with each value spread over a 2×2 block.
    expected = torch.tensor([[1.0, 1, 2, 2, 3, 3], [1, 1, 2, 2, 3, 3], [4, 4, 5, 5, 6, 6], [4, 4, 5, 5, 6, 6]])
    assert torch.equal(level0[0, 0], expected) and torch.equal(level0[0, 1], expected + 6)
    assert torch.equal(level1, c5[:, :2])  # level 1 is the bare lateral: the original has no 3×3 conv there
    with torch.no_grad():
        neck.lateral_convs[0].weight[:, :2, 0, 0] = torch.eye(2)
    level0, _ = neck([c4, c5])
    upsampled = c5[:, :2].repeat_interleave(2, dim=2).repeat_interleave(2, dim=3)
    torch.testing.assert_close(level0, c4[:, :2] + upsampled)


def test_cpfpn_upsamples_to_odd_c4_sizes_as_nearest() -> None:
    neck = CPFPN([2, 2], 2)
    c4, c5 = torch.randn(1, 2, 5, 7), torch.randn(1, 2, 3, 4)
    level0, level1 = neck([c4, c5])
    lateral = neck.lateral_convs[0](c4) + F.interpolate(neck.lateral_convs[1](c5), size=(5, 7), mode="nearest")
    torch.testing.assert_close(level0, neck.fpn_conv(lateral))
    assert level1.shape == (1, 2, 3, 4)


def test_cpfpn_builds_one_3x3_conv() -> None:
    neck = CPFPN([1024, 2048], 256)
    sizes = sorted(p.numel() for p in neck.parameters())
    assert sum(sizes) == (1024 + 2048) * 256 + 2 * 256 + 256 * 256 * 9 + 256


@pytest.mark.parametrize(("kind", "size"), [("resnet50", (64, 80)), ("resnet50", (48, 64)), ("tiny", (40, 48))])
def test_image_size_not_divisible_raises_naming_it(kind: str, size: tuple[int, int]) -> None:
    model = build_backbone(kind, 16)
    with pytest.raises(ValueError, match=f"{size[0]}×{size[1]}"):
        model(torch.zeros(1, 3, *size))


def test_tiny_accepts_multiples_of_16_that_resnet50_refuses() -> None:
    assert TinyBackbone(16, width=8)(torch.zeros(1, 3, 48, 80)).shape == (1, 16, 3, 5)


def test_bad_arguments_raise() -> None:
    with pytest.raises(ValueError, match="unknown kind 'resnet18'"):
        build_backbone("resnet18", 256)
    with pytest.raises(ValueError, match="width"):
        TinyBackbone(16, width=12)
    with pytest.raises(ValueError, match="out_indices"):
        ResNet50(out_indices=(4,))
    with pytest.raises(ValueError, match="frozen_stages"):
        ResNet50(frozen_stages=5)
    with pytest.raises(TypeError):
        build_backbone("tiny", 16, depth=50)
