"""``model.init_from`` / ``load_weights``: drivetrain runs and checkpoints, a torchvision ResNet-50, and the original
StreamPETR and mmdetection3d (PointPillars, SSN) checkpoints load exactly; what does not fit is reported, or refused
in one line with ``strict``; unreadable sources are named; a resumed run never re-initialises.

The original-format state dicts are built here from the original module definitions (the generators below cite
them), with random values of the right shapes; never from our models. Each loaded model is then checked tensor by
tensor against the file entry its module corresponds to (written against our modules' attributes), and every
parameter and buffer of the model must be among those checked.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from pathlib import Path

import pytest
import torch
from torch import nn

from drivetrain.data.formats.nuscenes.tables import CLASSES
from drivetrain.engine import Checkpointer, ConfigError, Trainer, load_config
from drivetrain.engine.build import build_model
from drivetrain.engine.init_from import InitFrom, InitFromError, load_weights, starts_fresh
from drivetrain.models.pointpillars import SSN, SSN_NUS_CLASSES, PointPillars
from drivetrain.models.streampetr import StreamPETR
from drivetrain.models.streampetr.backbone import ResNet50
from helpers.engine import SMOKE, overrides

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
# configs/_base_/datasets/nus-3d.py of mmdetection3d: the class order of its PointPillars heads
NUS3D_CLASSES = ("car", "truck", "trailer", "bus", "construction_vehicle",
                 "bicycle", "motorcycle", "pedestrian", "traffic_cone", "barrier")  # fmt: skip


class Opaque:
    """A Python object: pickled into a file, it must not be loaded."""


# ------------------------------------------------------------------------------------------------ generators
class Gen:
    """Random tensors of given shapes into a state dict, BatchNorm and LayerNorm entries by their definitions."""

    def __init__(self, seed: int = 0) -> None:
        self.g = torch.Generator().manual_seed(seed)
        self.sd: dict[str, torch.Tensor] = {}

    def t(self, name: str, *shape: int) -> None:
        self.sd[name] = torch.randn(shape, generator=self.g)

    def conv(self, name: str, out: int, cin: int, k: int, bias: bool = False) -> None:
        self.t(f"{name}.weight", out, cin, k, k)
        if bias:
            self.t(f"{name}.bias", out)

    def linear(self, name: str, out: int, cin: int, bias: bool = True) -> None:
        self.t(f"{name}.weight", out, cin)
        if bias:
            self.t(f"{name}.bias", out)

    def affine(self, name: str, c: int) -> None:  # LayerNorm / GroupNorm
        self.t(f"{name}.weight", c)
        self.t(f"{name}.bias", c)

    def bn(self, name: str, c: int, counter: bool = True) -> None:  # torch _BatchNorm: affine + running stats
        self.affine(name, c)
        self.t(f"{name}.running_mean", c)
        self.sd[f"{name}.running_var"] = torch.rand(c, generator=self.g) + 0.5
        if counter:
            self.sd[f"{name}.num_batches_tracked"] = torch.randint(1, 10**6, (), generator=self.g)


def resnet50(gen: Gen, prefix: str = "", fc: bool = True, counter: bool = True) -> None:
    """torchvision/models/resnet.py ``resnet50``: ``ResNet(Bottleneck, [3, 4, 6, 3])`` — stem ``conv1`` 7×7 3→64
    (no bias), ``bn1``; per stage ``planes`` 64/128/256/512, ``Bottleneck``: ``conv1`` 1×1 in→planes, ``conv2`` 3×3,
    ``conv3`` 1×1 →4·planes, ``bn1..3``; block 0 ``downsample`` = (1×1 conv, BN); ``fc`` 2048→1000. mmdet's ResNet
    (``mmdet/models/backbones/resnet.py``, depth 50) has the same names without ``fc``."""
    gen.conv(f"{prefix}conv1", 64, 3, 7)
    gen.bn(f"{prefix}bn1", 64, counter)
    inplanes = 64
    for stage, (planes, blocks) in enumerate(zip((64, 128, 256, 512), (3, 4, 6, 3), strict=True)):
        for b in range(blocks):
            p = f"{prefix}layer{stage + 1}.{b}"
            gen.conv(f"{p}.conv1", planes, inplanes, 1)
            gen.bn(f"{p}.bn1", planes, counter)
            gen.conv(f"{p}.conv2", planes, planes, 3)
            gen.bn(f"{p}.bn2", planes, counter)
            gen.conv(f"{p}.conv3", 4 * planes, planes, 1)
            gen.bn(f"{p}.bn3", 4 * planes, counter)
            if b == 0:  # stride 2 or inplanes != 4·planes (layer1: 64 → 256)
                gen.conv(f"{p}.downsample.0", 4 * planes, inplanes, 1)
                gen.bn(f"{p}.downsample.1", 4 * planes, counter)
            inplanes = 4 * planes
    if fc:
        gen.linear(f"{prefix}fc", 1000, 2048)


def streampetr_original(
    gen: Gen,
    *,
    num_classes: int = 10,
    e: int = 256,
    num_query: int = 644,
    num_propagated: int = 256,
    depth_num: int = 64,
    num_layers: int = 6,
    ffn: int = 2048,
    position_range: tuple[float, ...] = (-61.2, -61.2, -10.0, 61.2, 61.2, 10.0),
    pc_range: tuple[float, ...] = (-51.2, -51.2, -5.0, 51.2, 51.2, 3.0),
    with_backbone: bool = True,
) -> None:
    """``Petr3D.state_dict()`` of StreamPETR's published R50 config (``stream_petr_r50_flash_704_bs2_seq_24e.py``;
    defaults are its values), from the definitions in exiawsh/StreamPETR."""
    if with_backbone:
        resnet50(gen, "img_backbone.", fc=False)  # mmdet ResNet depth 50
        # necks/cp_fpn.py CPFPN(in [1024, 2048], out 256): ConvModule lateral_convs (1×1, bias: no norm) and
        # fpn_convs for level 0 only (3×3)
        gen.conv("img_neck.lateral_convs.0.conv", e, 1024, 1, bias=True)
        gen.conv("img_neck.lateral_convs.1.conv", e, 2048, 1, bias=True)
        gen.conv("img_neck.fpn_convs.0.conv", e, e, 3, bias=True)
    # dense_heads/focal_head.py FocalHead._init_layers (in_channels = embed_dims = 256)
    f = "img_roi_head."
    gen.conv(f"{f}cls", num_classes, e, 1, bias=True)
    for tower in ("shared_reg", "shared_cls"):
        gen.conv(f"{f}{tower}.0", e, e, 3, bias=True)
        gen.affine(f"{f}{tower}.1", e)  # GroupNorm(32, E)
    gen.conv(f"{f}centerness", 1, e, 1, bias=True)
    gen.conv(f"{f}ltrb", 4, e, 1, bias=True)
    gen.conv(f"{f}center2d", 2, e, 1, bias=True)
    # dense_heads/streampetr_head.py StreamPETRHead.__init__: frozen nn.Parameters
    h = "pts_bbox_head."
    code_weights = torch.tensor([2.0, 2.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])  # the config's code_weights
    gen.sd[f"{h}code_weights"], gen.sd[f"{h}match_costs"] = code_weights, code_weights.clone()
    gen.sd[f"{h}pc_range"] = torch.tensor(pc_range)  # bbox_coder.pc_range
    gen.sd[f"{h}position_range"] = torch.tensor(position_range)
    index = torch.arange(start=0, end=depth_num, step=1).float()  # LID=True
    bin_size = (gen.sd[f"{h}position_range"][3] - 1) / (depth_num * (1 + depth_num))
    gen.sd[f"{h}coords_d"] = 1 + bin_size * index * (index + 1)
    # StreamPETRHead._init_layers: the same cls / reg branch object in both lists, num_pred = 6 times
    cls = {}
    for k in (0, 3):
        cls[f"{k}.weight"], cls[f"{k}.bias"] = torch.randn(e, e, generator=gen.g), torch.randn(e, generator=gen.g)
    for k in (1, 4):  # nn.LayerNorm
        cls[f"{k}.weight"], cls[f"{k}.bias"] = torch.randn(e, generator=gen.g), torch.randn(e, generator=gen.g)
    cls["6.weight"], cls["6.bias"] = (
        torch.randn(num_classes, e, generator=gen.g),
        torch.randn(num_classes, generator=gen.g),
    )
    reg = {}
    for k in (0, 2):
        reg[f"{k}.weight"], reg[f"{k}.bias"] = torch.randn(e, e, generator=gen.g), torch.randn(e, generator=gen.g)
    reg["4.weight"], reg["4.bias"] = torch.randn(10, e, generator=gen.g), torch.randn(10, generator=gen.g)  # code_size
    for i in range(6):
        gen.sd.update({f"{h}cls_branches.{i}.{k}": v for k, v in cls.items()})
        gen.sd.update({f"{h}reg_branches.{i}.{k}": v for k, v in reg.items()})
    gen.linear(f"{h}position_encoder.0", 4 * e, 3 * depth_num)
    gen.linear(f"{h}position_encoder.2", e, 4 * e)
    gen.linear(f"{h}memory_embed.0", e, e)
    gen.linear(f"{h}memory_embed.2", e, e)
    gen.linear(f"{h}featurized_pe.conv_reduce", e, e)  # utils/misc.py SELayer_Linear
    gen.linear(f"{h}featurized_pe.conv_expand", e, e)
    gen.t(f"{h}reference_points.weight", num_query, 3)
    gen.t(f"{h}pseudo_reference_points.weight", num_propagated, 3)
    gen.linear(f"{h}query_embedding.0", e, 3 * e // 2)
    gen.linear(f"{h}query_embedding.2", e, e)
    for name, c_dim in (("spatial_alignment", 8), ("ego_pose_pe", 180), ("ego_pose_memory", 180)):  # misc.py MLN
        gen.linear(f"{h}{name}.reduce.0", e, c_dim)
        gen.linear(f"{h}{name}.gamma", e, e)
        gen.linear(f"{h}{name}.beta", e, e)
    gen.linear(f"{h}time_embedding.0", e, e)
    gen.affine(f"{h}time_embedding.1", e)
    # utils/petr_transformer.py: PETRTemporalDecoderLayer (attentions: mmcv MultiheadAttention, then
    # PETRMultiheadFlashAttention → FlashMHA; both .attn.in_proj_weight (3E, E) + out_proj), mmcv FFN, 3 LayerNorms
    d = f"{h}transformer.decoder."
    for i in range(num_layers):
        for a in (0, 1):
            gen.t(f"{d}layers.{i}.attentions.{a}.attn.in_proj_weight", 3 * e, e)
            gen.t(f"{d}layers.{i}.attentions.{a}.attn.in_proj_bias", 3 * e)
            gen.linear(f"{d}layers.{i}.attentions.{a}.attn.out_proj", e, e)
        gen.linear(f"{d}layers.{i}.ffns.0.layers.0.0", ffn, e)
        gen.linear(f"{d}layers.{i}.ffns.0.layers.1", e, ffn)
        for n in range(3):
            gen.affine(f"{d}layers.{i}.norms.{n}", e)
    gen.affine(f"{d}post_norm", e)  # PETRTransformerDecoder post_norm_cfg LN


def mmdet3d_lidar(
    gen: Gen,
    *,
    prefix: str = "pts_",
    point_dims: int = 4,
    vfe: tuple[int, ...] = (64, 64),
    channels: tuple[int, ...] = (64, 128, 256),
    layer_nums: tuple[int, ...] = (3, 5, 5),
    neck: tuple[int, ...] = (128, 128, 128),
    upsample: tuple[int, ...] = (1, 2, 4),
    num_anchors: int = 14,
    num_classes: int = 10,
    tasks: tuple[tuple[int, tuple[int, ...]], ...] | None = None,
    num_rotations: int = 2,
) -> None:
    """``MVXFasterRCNN.state_dict()`` of mmdetection3d's nuScenes PointPillars (defaults: ``pointpillars_hv_secfpn``)
    or, with ``tasks`` ((num_class, shared_conv_channels) per task), SSN, from the v1.4.0 definitions."""
    # voxel_encoders/voxel_encoder.py HardVFE: in = C + 3 (cluster) + 3 (voxel centre); utils.py VFELayer
    # linear (no bias) and norm (BN1d); layers after the first take the concatenated 2·channels
    cin = point_dims + 6
    for i, out in enumerate(vfe):
        gen.linear(f"{prefix}voxel_encoder.vfe_layers.{i}.linear", out, cin if i == 0 else 2 * vfe[i - 1], bias=False)
        gen.bn(f"{prefix}voxel_encoder.vfe_layers.{i}.norm", out)
    # backbones/second.py SECOND: blocks.i = [conv(stride), BN, ReLU] + layer_num × [conv, BN, ReLU]
    for i, (out, num) in enumerate(zip(channels, layer_nums, strict=True)):
        gen.conv(f"{prefix}backbone.blocks.{i}.0", out, vfe[-1] if i == 0 else channels[i - 1], 3)
        gen.bn(f"{prefix}backbone.blocks.{i}.1", out)
        for j in range(num):
            gen.conv(f"{prefix}backbone.blocks.{i}.{3 + 3 * j}", out, out, 3)
            gen.bn(f"{prefix}backbone.blocks.{i}.{4 + 3 * j}", out)
    # necks/second_fpn.py SECONDFPN: deblocks.i = [ConvTranspose2d(in, out, s, s) (weight (in, out, s, s)), BN, ReLU]
    for i, (cin_i, out, s) in enumerate(zip(channels, neck, upsample, strict=True)):
        gen.t(f"{prefix}neck.deblocks.{i}.0.weight", cin_i, out, s, s)
        gen.bn(f"{prefix}neck.deblocks.{i}.1", out)
    width = sum(neck)
    if tasks is None:  # dense_heads/anchor3d_head.py Anchor3DHead._init_layers
        gen.conv(f"{prefix}bbox_head.conv_cls", num_anchors * num_classes, width, 1, bias=True)
        gen.conv(f"{prefix}bbox_head.conv_reg", num_anchors * 9, width, 1, bias=True)
        gen.conv(f"{prefix}bbox_head.conv_dir_cls", num_anchors * 2, width, 1, bias=True)
        return
    # dense_heads/shape_aware_head.py ShapeAwareHead._init_layers → BaseShapeHead: ConvModule(conv no bias, bn)
    for t, (n, shared) in enumerate(tasks):
        head, anchors, cin_t = f"{prefix}bbox_head.heads.{t}", num_rotations * n, width
        for k, out in enumerate(shared):
            gen.conv(f"{head}.shared_conv.{k}.conv", out, cin_t, 3)
            gen.bn(f"{head}.shared_conv.{k}.bn", out)
            cin_t = out
        gen.conv(f"{head}.conv_cls", anchors * num_classes, cin_t, 1, bias=True)
        gen.conv(f"{head}.conv_reg", anchors * 9, cin_t, 1, bias=True)
        gen.conv(f"{head}.conv_dir_cls", anchors * 2, cin_t, 1, bias=True)


# -------------------------------------------------------------------------------------------------- the oracle
def local(module: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    return chain(module.named_parameters(recurse=False), module.named_buffers(recurse=False))


class Expected:
    """Pairs (our tensor, the file tensor it must equal), collected module by module."""

    def __init__(self, sd: dict[str, torch.Tensor]) -> None:
        self.sd, self.pairs = sd, []

    def module(self, ours: nn.Module, key: str) -> None:
        """Every tensor of ``ours`` and its submodules ↔ the file entry ``key.<same local name>``."""
        for name, tensor in chain(ours.named_parameters(), ours.named_buffers()):
            self.pairs.append((name, tensor, self.sd[f"{key}.{name}"]))

    def tensor(self, ours: torch.Tensor, key: str, classes: list[int] | None = None) -> None:
        """``ours`` ↔ ``key``; with ``classes``, the file's class axis taken in that order (``anchor · C + class``)."""
        value = self.sd[key]
        if classes is not None:
            value = value.reshape(-1, len(classes), *value.shape[1:])[:, classes].reshape(value.shape)
        self.pairs.append((key, ours, value))

    def check(self, model: nn.Module) -> None:
        """Every pair equal, and every parameter and buffer of ``model`` among them."""
        for key, ours, theirs in self.pairs:
            assert torch.equal(ours, theirs), f"{key} was not loaded exactly"
        checked = {id(ours) for _, ours, _ in self.pairs}
        unchecked = [
            k for k, t in model.state_dict(keep_vars=True).items() if torch.is_tensor(t) and id(t) not in checked
        ]
        assert not unchecked, f"tensors of the model no file entry was checked against: {unchecked[:5]}"


def expected_streampetr(model: StreamPETR, sd: dict[str, torch.Tensor], classes: list[int] | None = None) -> Expected:
    x, h = Expected(sd), "pts_bbox_head."
    x.module(model.backbone.trunk, "img_backbone")
    for i, conv in enumerate(model.backbone.neck.lateral_convs):
        x.module(conv, f"img_neck.lateral_convs.{i}.conv")
    x.module(model.backbone.neck.fpn_conv, "img_neck.fpn_convs.0.conv")
    fh = model.focal_head
    for name in ("shared_cls", "shared_reg", "centerness", "ltrb", "center2d"):
        x.module(getattr(fh, name), f"img_roi_head.{name}")
    x.tensor(fh.cls.weight, "img_roi_head.cls.weight", classes)
    x.tensor(fh.cls.bias, "img_roi_head.cls.bias", classes)
    x.module(model.position.encoder, f"{h}position_encoder")
    x.module(model.featurized_pe.reduce, f"{h}featurized_pe.conv_reduce")
    x.module(model.featurized_pe.expand, f"{h}featurized_pe.conv_expand")
    x.module(model.memory.pseudo_reference, f"{h}pseudo_reference_points")
    for name in ("memory_embed", "reference_points", "query_embedding", "spatial_alignment", "time_embedding",
                 "ego_pose_pe", "ego_pose_memory"):  # fmt: skip
        x.module(getattr(model, name), f"{h}{name}")
    d = f"{h}transformer.decoder.layers"
    for i, layer in enumerate(model.decoder.layers):
        for a, attn in enumerate((layer.self_attn, layer.cross_attn)):
            x.tensor(attn.in_proj.weight, f"{d}.{i}.attentions.{a}.attn.in_proj_weight")
            x.tensor(attn.in_proj.bias, f"{d}.{i}.attentions.{a}.attn.in_proj_bias")
            x.module(attn.out_proj, f"{d}.{i}.attentions.{a}.attn.out_proj")
        x.module(layer.ffn[0], f"{d}.{i}.ffns.0.layers.0.0")
        x.module(layer.ffn[3], f"{d}.{i}.ffns.0.layers.1")
        x.module(layer.norms, f"{d}.{i}.norms")
    x.module(model.decoder.post_norm, f"{h}transformer.decoder.post_norm")
    for k in (0, 1, 3, 4):
        x.module(model.cls_branch[k], f"{h}cls_branches.0.{k}")
    x.tensor(model.cls_branch[6].weight, f"{h}cls_branches.0.6.weight", classes)
    x.tensor(model.cls_branch[6].bias, f"{h}cls_branches.0.6.bias", classes)
    x.module(model.reg_branch, f"{h}reg_branches.0")
    return x


def expected_lidar(model: PointPillars, sd: dict[str, torch.Tensor], p: str, classes: list[int] | None) -> Expected:
    x = Expected(sd)
    for i, layer in enumerate(model.vfe.layers):
        x.module(layer, f"{p}voxel_encoder.vfe_layers.{i}")  # .linear, .norm
    for i, block in enumerate(model.backbone.blocks):
        x.module(block, f"{p}backbone.blocks.{i}")  # [conv, BN, ReLU, ...] at the original's indices
    for i, block in enumerate(model.neck.blocks):
        x.module(block, f"{p}neck.deblocks.{i}")
    heads = [(model.head, f"{p}bbox_head")] if model.tasks is None else []
    if model.tasks is not None:
        for t, branch in enumerate(model.head.heads):
            heads.append((branch, f"{p}bbox_head.heads.{t}"))
            for k in range(len(branch.shared_conv) // 3):  # ConvModule k: .conv / .bn
                x.module(branch.shared_conv[3 * k], f"{p}bbox_head.heads.{t}.shared_conv.{k}.conv")
                x.module(branch.shared_conv[3 * k + 1], f"{p}bbox_head.heads.{t}.shared_conv.{k}.bn")
    for branch, key in heads:
        x.tensor(branch.conv_cls.weight, f"{key}.conv_cls.weight", classes)
        x.tensor(branch.conv_cls.bias, f"{key}.conv_cls.bias", classes)
        x.module(branch.conv_reg, f"{key}.conv_reg")
        x.module(branch.conv_dir_cls, f"{key}.conv_dir_cls")
    return x


def order(file_classes, model_classes) -> list[int] | None:
    return None if tuple(file_classes) == tuple(model_classes) else [list(file_classes).index(c) for c in model_classes]


# ----------------------------------------------------------------------------------------------- helpers
def randomise(model: nn.Module, seed: int) -> dict[str, torch.Tensor]:
    """Fill every tensor of ``model`` with random values; return its state dict (a copy)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.state_dict(keep_vars=True).values():
            if torch.is_tensor(tensor):
                fresh = (
                    torch.randn
                    if tensor.is_floating_point()
                    else lambda s, generator: torch.randint(1, 999, s, generator=generator)
                )
                tensor.copy_(fresh(tensor.shape, generator=g))
    return {k: v.clone() if torch.is_tensor(v) else v for k, v in model.state_dict().items()}


def tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in model.state_dict().items() if torch.is_tensor(v)}


def save_run(run: Path, state: dict[str, torch.Tensor]) -> Path:
    """A run directory with one committed checkpoint of ``state``, written by the trainer's checkpointer."""
    return Checkpointer(run / "checkpoints").save(7, {"format": 1, "model": state, "config": {}})


# --------------------------------------------------------------------------------------------- (a) drivetrain
@pytest.mark.parametrize(
    "config", ["streampetr_tiny", "pointpillars_tiny", "ssn_tiny", "voxelnet_tiny", "synth_tiny", "smoke"]
)
def test_drivetrain_run_checkpoint_and_state_file_load_exactly(tmp_path: Path, config: str) -> None:
    cfg = load_config(CONFIGS / f"{config}.yaml").model
    source = build_model(cfg)
    saved = randomise(source, seed=1)
    checkpoint = save_run(tmp_path / "run", saved)
    for where in (tmp_path / "run", checkpoint, checkpoint / "state.pt"):
        torch.manual_seed(2)
        model = build_model(cfg)
        before = tensors(model)
        assert any(not torch.equal(before[k], saved[k]) for k in before), "the test needs weights that differ"
        report = load_weights(model, where, strict=True)
        assert report.format == "drivetrain" and report.exact, report.table()
        assert tensors(model).keys() == {k for k in saved if torch.is_tensor(saved[k])}
        for key, value in tensors(model).items():
            assert torch.equal(value, saved[key]), f"{where}: {key}"
        extra = [k for k in saved if k.endswith("_extra_state")]
        assert sorted(entry.split(" ")[0] for entry in report.ignored) == sorted(extra)


def test_bare_state_dict_saved_from_ddp_loads_in_our_names(tmp_path: Path) -> None:
    source = build_model(load_config(CONFIGS / "pointpillars_tiny.yaml").model)
    saved = randomise(source, seed=3)
    torch.save({f"module.{k}": v for k, v in saved.items()}, tmp_path / "ddp.pt")
    model = build_model(load_config(CONFIGS / "pointpillars_tiny.yaml").model)
    report = load_weights(model, tmp_path / "ddp.pt", strict=True)
    assert report.format == "drivetrain" and len(report.loaded) == len(saved)
    assert all(torch.equal(v, saved[k]) for k, v in tensors(model).items())


# ------------------------------------------------------------------------------------- (b) torchvision ResNet-50
def published_streampetr() -> StreamPETR:
    cfg = load_config(CONFIGS / "streampetr_full.yaml").model
    assert cfg.args.backbone == "resnet50"  # the published img_backbone: ResNet depth 50
    return build_model(cfg)


def test_torchvision_resnet50_loads_into_the_published_streampetr_backbone(tmp_path: Path) -> None:
    gen = Gen(4)
    resnet50(gen)
    torch.save(gen.sd, tmp_path / "resnet50.pth")
    model = published_streampetr()
    assert isinstance(model.backbone.trunk, ResNet50)
    others = {k: v for k, v in tensors(model).items() if not k.startswith("backbone.trunk.")}
    report = load_weights(model, tmp_path / "resnet50.pth", strict=True)
    assert report.format == "torchvision-resnet50" and report.scope == "backbone.trunk." and report.exact
    assert sorted(report.ignored) == ["fc.bias (the ImageNet classifier; the trunk has none)",
                                      "fc.weight (the ImageNet classifier; the trunk has none)"]  # fmt: skip
    for name, ours in chain(model.backbone.trunk.named_parameters(), model.backbone.trunk.named_buffers()):
        assert torch.equal(ours, gen.sd[name]), name  # every trunk tensor: torchvision's entry of the same name
    assert len(report.loaded) == len(gen.sd) - 2 == len(model.backbone.trunk.state_dict())  # all but fc
    assert all(torch.equal(v, others[k]) for k, v in tensors(model).items() if k in others)  # the rest untouched


def test_resnet50_file_without_batch_counters_keeps_them(tmp_path: Path) -> None:
    gen = Gen(5)
    resnet50(gen, counter=False)  # the ImageNet files predate num_batches_tracked
    torch.save(gen.sd, tmp_path / "old.pth")
    trunk = ResNet50()
    counters = {k: v.clone() for k, v in trunk.state_dict().items() if k.endswith("num_batches_tracked")}
    report = load_weights(trunk, tmp_path / "old.pth", strict=True)
    assert report.exact and report.scope == "" and len(report.loaded) == len(gen.sd) - 2
    assert any("53 BatchNorm num_batches_tracked" in note for note in report.notes)
    sd = trunk.state_dict()
    assert all(torch.equal(sd[k], v) for k, v in counters.items())
    assert all(torch.equal(sd[k], v) for k, v in gen.sd.items() if not k.startswith("fc."))


def test_resnet50_into_the_tiny_backbone_is_refused_with_strict_and_reported_without(tmp_path: Path) -> None:
    gen = Gen(6)
    resnet50(gen)
    torch.save(gen.sd, tmp_path / "resnet50.pth")
    model = build_model(load_config(CONFIGS / "streampetr_tiny.yaml").model)
    before = tensors(model)
    with pytest.raises(InitFromError) as err:
        load_weights(model, tmp_path / "resnet50.pth", format="torchvision-resnet50", strict=True)
    message = str(err.value)
    assert "\n" not in message and str(tmp_path / "resnet50.pth") in message
    assert "320 unexpected (conv1.weight; bn1.weight; bn1.bias; bn1.running_mean, … 316 more)" in message
    assert "has no ResNet-50 trunk" in message
    report = load_weights(model, tmp_path / "resnet50.pth")
    assert report.scope is None and not report.loaded and len(report.unexpected) == 320
    assert all(torch.equal(v, before[k]) for k, v in tensors(model).items())  # nothing changed


# ------------------------------------------------------------------------------ (c) original-format checkpoints
def test_streampetr_checkpoint_loads_exactly_at_the_published_config(tmp_path: Path) -> None:
    gen = Gen(7)
    streampetr_original(gen)
    torch.save(
        {"meta": {"CLASSES": list(CLASSES), "mmdet_version": "2.28.2"}, "state_dict": gen.sd}, tmp_path / "sp.pth"
    )
    model = published_streampetr()
    report = load_weights(model, tmp_path / "sp.pth", strict=True)
    assert report.format == "streampetr" and report.exact, report.table()
    expected_streampetr(model, gen.sd).check(model)
    ignored = {entry.split(" ")[0] for entry in report.ignored}
    copies = {
        key.replace("branches.0.", f"branches.{i}.") for key in gen.sd if "_branches.0." in key for i in range(1, 6)
    }
    constants = {
        f"pts_bbox_head.{k}" for k in ("code_weights", "match_costs", "pc_range", "position_range", "coords_d")
    }
    assert ignored == copies | constants


def test_streampetr_classes_named_in_another_order_are_reordered(tmp_path: Path) -> None:
    gen = Gen(8)
    streampetr_original(gen, e=64, num_query=20, num_propagated=8, depth_num=32, num_layers=2, ffn=128,
                        with_backbone=False)  # fmt: skip
    file_classes = list(reversed(CLASSES))
    torch.save({"meta": {"dataset_meta": {"classes": file_classes}}, "state_dict": gen.sd}, tmp_path / "sp.pth")
    model = StreamPETR(backbone="tiny", embed_dims=64, num_heads=4, ffn_dims=128, num_layers=2, num_query=20,
                       memory_len=32, topk=8, num_propagated=8, depth_num=32)  # fmt: skip
    report = load_weights(model, tmp_path / "sp.pth")
    assert not report.unexpected and not report.mismatched
    assert all(k.startswith("backbone.") for k in report.missing)  # the tiny backbone has no original
    classes = order(file_classes, CLASSES)
    fh, last = model.focal_head, model.cls_branch[6]
    for ours, key in ((fh.cls.weight, "img_roi_head.cls.weight"), (fh.cls.bias, "img_roi_head.cls.bias"),
                      (last.weight, "pts_bbox_head.cls_branches.0.6.weight"),
                      (last.bias, "pts_bbox_head.cls_branches.0.6.bias")):  # fmt: skip
        assert torch.equal(ours, gen.sd[key][classes]), key
    assert any("class channels reordered" in note for note in report.notes)


def test_streampetr_constants_and_shared_branches_are_checked(tmp_path: Path) -> None:
    gen = Gen(9)
    streampetr_original(gen, e=64, num_query=20, num_propagated=8, depth_num=32, num_layers=2, ffn=128,
                        pc_range=(-40.0, -40.0, -5.0, 40.0, 40.0, 3.0), with_backbone=False)  # fmt: skip
    gen.sd["pts_bbox_head.reg_branches.3.4.bias"] = gen.sd["pts_bbox_head.reg_branches.0.4.bias"] + 1
    torch.save({"state_dict": gen.sd}, tmp_path / "sp.pth")
    model = StreamPETR(backbone="tiny", embed_dims=64, num_heads=4, ffn_dims=128, num_layers=2, num_query=20,
                       memory_len=32, topk=8, num_propagated=8, depth_num=32)  # fmt: skip
    with pytest.raises(InitFromError) as err:
        load_weights(model, tmp_path / "sp.pth", strict=True)
    message = str(err.value)
    assert "\n" not in message
    assert "pts_bbox_head.pc_range: [-40.0, -40.0, -5.0, 40.0, 40.0, 3.0] in the file, [-51.2" in message
    assert "pts_bbox_head.reg_branches.3.4.bias: differs from pts_bbox_head.reg_branches.0.4.bias" in message


@pytest.mark.parametrize("prefix", ["pts_", ""])
def test_mmdet3d_pointpillars_loads_exactly_with_classes_reordered(tmp_path: Path, prefix: str) -> None:
    gen = Gen(10)
    mmdet3d_lidar(gen, prefix=prefix)  # the published nuScenes SECFPN model
    sd = {f"module.{k}": v for k, v in gen.sd.items()} if prefix == "" else gen.sd  # (and a DDP prefix)
    torch.save({"meta": {"epoch": 24}, "state_dict": sd}, tmp_path / "pp.pth")
    model = build_model(load_config(CONFIGS / "pointpillars_nus.yaml").model)
    assert model.class_names == CLASSES and CLASSES != NUS3D_CLASSES  # so the class channels must move
    report = load_weights(model, tmp_path / "pp.pth", strict=True)
    assert report.format == "mmdet3d" and report.exact, report.table()
    expected_lidar(model, gen.sd, prefix, order(NUS3D_CLASSES, CLASSES)).check(model)


def test_mmdet3d_pointpillars_classes_from_meta(tmp_path: Path) -> None:
    gen = Gen(11)
    mmdet3d_lidar(gen)
    torch.save({"meta": {"dataset_meta": {"classes": list(CLASSES)}}, "state_dict": gen.sd}, tmp_path / "pp.pth")
    model = PointPillars()
    assert load_weights(model, tmp_path / "pp.pth", strict=True).exact
    expected_lidar(model, gen.sd, "pts_", None).check(model)  # the file's order is the model's: no reordering


def test_mmdet3d_ssn_loads_exactly_at_the_published_config(tmp_path: Path) -> None:
    gen = Gen(12)
    # configs/ssn/ssn_hv_secfpn_sbn-all_16xb2-2x_nus-3d.py: tasks and their shared convs
    tasks = ((2, (64, 64)), (1, (64, 64)), (2, (64, 64)), (1, (64, 64, 64)), (4, (64, 64, 64)))
    mmdet3d_lidar(gen, tasks=tasks)
    torch.save({"meta": {"CLASSES": list(SSN_NUS_CLASSES)}, "state_dict": gen.sd}, tmp_path / "ssn.pth")
    model = build_model(load_config(CONFIGS / "ssn_nus.yaml").model)
    assert isinstance(model, SSN)
    report = load_weights(model, tmp_path / "ssn.pth", strict=True)
    assert report.format == "mmdet3d" and report.exact, report.table()
    expected_lidar(model, gen.sd, "pts_", None).check(model)


# ------------------------------------------------------------------------------------------- (d) refusals
def test_wrong_architecture_is_refused_in_one_line_listing_the_mismatches(tmp_path: Path) -> None:
    gen = Gen(13)
    mmdet3d_lidar(gen, tasks=((2, (64, 64)), (1, (64, 64)), (2, (64, 64)), (1, (64, 64, 64)), (4, (64, 64, 64))))
    torch.save({"state_dict": gen.sd}, tmp_path / "ssn.pth")  # an SSN checkpoint
    model = PointPillars(vfe_channels=(32, 64))  # another VFE width, and Anchor3DHead instead of SSN's heads
    before = tensors(model)
    with pytest.raises(InitFromError) as err:
        load_weights(model, tmp_path / "ssn.pth", strict=True)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'ssn.pth'}: does not fit the PointPillars")
    assert (
        "6 mismatched (vfe.layers.0.linear.weight ← pts_voxel_encoder.vfe_layers.0.linear.weight: file (64, 10), "
        "model (32, 10); vfe.layers.0.norm.weight ← " in message
    )
    assert (
        "6 missing (head.conv_cls.weight; head.conv_cls.bias; head.conv_reg.weight; head.conv_reg.bias, … 2 more)"
        in message
    )
    assert (
        "102 unexpected (pts_bbox_head.heads.0.shared_conv.0.conv.weight (→ head.heads.0.shared_conv.0.weight);"
        in message
    )
    assert "reordered" not in message  # no class channels of the file land in this model
    assert all(torch.equal(v, before[k]) for k, v in tensors(model).items())  # strict loads nothing
    report = load_weights(model, tmp_path / "ssn.pth")  # without strict: what fits, and a report
    assert (len(report.mismatched), len(report.missing), len(report.unexpected)) == (6, 6, 102)
    assert len(report.loaded) == len(before) - 12
    sd = model.state_dict()
    for key in report.loaded:  # what fits, from the file entry of the same module
        theirs = key.replace("vfe.layers", "voxel_encoder.vfe_layers").replace("neck.blocks", "neck.deblocks")
        assert torch.equal(sd[key], gen.sd[f"pts_{theirs}"]), key
    with pytest.raises(InitFromError, match="the mmdet3d format maps PointPillars and SSN checkpoints; the model is a"):
        load_weights(build_model(load_config(CONFIGS / "streampetr_tiny.yaml").model), tmp_path / "ssn.pth")


def test_shape_mismatch_between_drivetrain_models_is_listed(tmp_path: Path) -> None:
    saved = randomise(build_model(load_config(CONFIGS / "pointpillars_tiny.yaml").model), seed=14)
    save_run(tmp_path / "run", saved)
    model = PointPillars(point_cloud_range=(-32.0, -32.0, -5.0, 32.0, 32.0, 3.0), voxel_size=(0.5, 0.5, 8.0),
                         vfe_channels=(32,), backbone_channels=(32, 64, 128), layer_nums=(1, 2, 2),
                         neck_channels=(32, 32, 32))  # the tiny one with the 7 published anchor sizes  # fmt: skip
    with pytest.raises(InitFromError) as err:
        load_weights(model, tmp_path / "run", strict=True)
    message = str(err.value)
    assert "\n" not in message
    assert "6 mismatched (head.conv_cls.weight: file (60, 96, 1, 1), model (140, 96, 1, 1)" in message


def test_unreadable_sources_are_named(tmp_path: Path) -> None:
    model = build_model(load_config(SMOKE).model)
    torch.save({"w": torch.zeros(1), "o": Opaque()}, tmp_path / "pickled.pt")
    torch.save([torch.zeros(1)], tmp_path / "list.pt")
    torch.save({"w": torch.zeros(1), "step": 3}, tmp_path / "mixed.pt")
    torch.save({"foo.weight": torch.zeros(1)}, tmp_path / "unknown.pt")
    (tmp_path / "text.pt").write_text("not weights")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    cases = {
        "pickled.pt": "holds pickled Python objects (it needs test_engine_init_from.Opaque), which are never loaded",
        "list.pt": "not a state dict (a list, expected a mapping of names to tensors)",
        "mixed.pt": "not a state dict (step holds a int, expected a tensor)",
        "unknown.pt": "cannot tell the format from its names (foo.weight); pass one of drivetrain, torchvision",
        "text.pt": "not a PyTorch weights file",
        "absent.pt": "no such file or directory",
        "run": "the run has no committed checkpoint that loads",
    }
    for name, reason in cases.items():
        with pytest.raises(InitFromError) as err:
            load_weights(model, tmp_path / name)
        assert str(err.value).startswith(f"{tmp_path / name}: ") and reason in str(err.value), str(err.value)
        assert "\n" not in str(err.value)


# ---------------------------------------------------------------------------- config, command line and resume
def test_init_from_config_values_are_checked() -> None:
    ok = load_config(SMOKE, ["model.init_from=runs/a"])
    assert ok.model.init_from == InitFrom("runs/a")  # a bare path means {path}
    spec = load_config(SMOKE, ["model.init_from={path: r.pth, format: torchvision-resnet50, strict: true}"])
    assert spec.model.init_from == InitFrom("r.pth", format="torchvision-resnet50", strict=True)
    bad = {
        "model.init_from=3": "model.init_from: expected a path or a mapping {path, format, strict}, got int",
        "model.init_from=''": "model.init_from: must not be empty",
        "model.init_from={path: a, fmt: x}": "model.init_from.fmt: unknown key; known keys: path, format, strict",
        "model.init_from={format: mmdet3d}": "model.init_from.path: expected a path",
        "model.init_from={path: a, format: onnx}": "model.init_from.format: expected one of auto, drivetrain",
        "model.init_from={path: a, strict: 1}": "model.init_from.strict: expected true or false, got 1",
    }
    for override, message in bad.items():
        with pytest.raises(ConfigError, match=message.replace("{", r"\{").replace("}", r"\}")):
            load_config(SMOKE, [override])


def train(out: Path, *extra: str, resume: str | None = None) -> Trainer:
    return Trainer(load_config(SMOKE, overrides(out, "train.steps=4", "checkpoint.every=2", *extra)), resume=resume)


def test_fresh_run_starts_from_the_source_and_the_cli_prints_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from drivetrain.cli.main import main

    source = train(tmp_path / "a")
    source.fit()
    source.close()
    trained = {k: v for k, v in Checkpointer(tmp_path / "a" / "checkpoints").load_latest()[1]["model"].items()
               if torch.is_tensor(v)}  # fmt: skip
    run = train(tmp_path / "b", f"model.init_from={tmp_path / 'a'}")
    try:
        assert all(torch.equal(v, trained[k]) for k, v in tensors(run.model).items())
    finally:
        run.close()
    assert "init_from" in capsys.readouterr().err
    args = [
        "train",
        "--config",
        str(SMOKE),
        *overrides(tmp_path / "c", "train.steps=2"),
        f"model.init_from={tmp_path / 'a'}",
    ]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert (
        f"init_from {tmp_path / 'a' / 'checkpoints' / 'step-00000004'} (drivetrain) into the whole model: 17 loaded"
        in err
    )
    assert (
        main(["train", "--config", str(SMOKE), *overrides(tmp_path / "d"), "model.init_from=/nonexistent/w.pth"]) == 2
    )
    assert "config error: model.init_from: /nonexistent/w.pth: no such file or directory" in capsys.readouterr().err


def test_a_resumed_run_restores_its_own_checkpoint_and_never_reads_the_source(tmp_path: Path) -> None:
    checkpointer = Checkpointer(tmp_path / "b" / "checkpoints")
    assert starts_fresh(None, checkpointer) and starts_fresh("auto", checkpointer)
    first = train(tmp_path / "b")
    first.fit()
    first.close()
    assert not starts_fresh("auto", checkpointer) and not starts_fresh(str(tmp_path / "b"), checkpointer)
    own = {k: v for k, v in checkpointer.load_latest()[1]["model"].items() if torch.is_tensor(v)}
    resumed = train(tmp_path / "b", "train.steps=6", "model.init_from=/nonexistent/w.pth", resume="auto")
    try:
        assert resumed.resumed_from is not None
        assert all(torch.equal(v, own[k]) for k, v in tensors(resumed.model).items())
    finally:
        resumed.close()
