"""Ports of the original implementations' op sequences, one module per original (``benchmarks/originals.py`` counts
their kernels beside our reference paths; its docstring says why and how).

- :mod:`.streampetr`: StreamPETR's 3D head and 2D focal head losses (exiawsh/StreamPETR);
- :mod:`.mmdet`: mmdet 2.28.2's box transforms, IoU, losses, match costs and sampler;
- :mod:`.mmdet3d`: mmdetection3d v1.0.0rc6's anchor heads (targets, losses, max-IoU assignment) and decoding;
- :mod:`.mmcv`: mmcv 1.6.0's ops (the sigmoid focal loss, rotated NMS), one custom operator per C++ kernel.

Each port's docstring names the original's file and function it mirrors. ``benchmarks/originals.py`` loads this
folder as a package (the benchmarks are loaded by path, not as a package of their own).
"""

from . import mmcv, mmdet, mmdet3d, streampetr

__all__ = ["mmcv", "mmdet", "mmdet3d", "streampetr"]
