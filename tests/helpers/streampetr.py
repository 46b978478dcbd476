"""A StreamPETR small enough for the tests' synthetic frames (160×90, up to 41 boxes), seconds per step."""

from __future__ import annotations

SMALL = dict(
    backbone="tiny",
    backbone_args={"width": 8},
    embed_dims=32,
    num_heads=2,
    ffn_dims=64,
    num_layers=2,
    num_query=48,  # ≥ the most ground-truth boxes of a test frame (41): every box gets a query
    memory_len=32,
    topk=8,
    num_propagated=8,
    depth_num=32,  # the cone reads bin depth_num − 30
    dn_groups=2,
)
