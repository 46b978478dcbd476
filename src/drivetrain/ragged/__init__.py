"""Ragged batches and batched, sync-free ops on them.

``RaggedBatch`` holds a padded tensor plus per-sample sizes with any number of leading batch dims
(e.g. decoder layer × sample). The ops process every sample of every batch dim at once:

=====================  =====================================================  ==========
op                     what                                                   host sync
=====================  =====================================================  ==========
``gather``             ``out[b, j] = data[b, index[b, j]]``                     no
``scatter``            ``out[b, index[b, j]] = values[b, j]`` into a new tensor  no
``write``              the same, into a copy of an existing tensor              no
``map_pairs``          ``dst[b, dst_i[b, j]] = src[b, src_i[b, j]]``           no
``mask_from_indices``  bool mask that is True at the indices                    no
``combine``            per-sample concatenation of several batches              no
``sum`` / ``mean``     over the ragged dim; empty samples give 0                no
``fill_padding``       set the padding to a value                              no
``select``             per-sample boolean selection, compacted                  once (``trim=False``: no)
``indices_from_mask``  positions of True entries, compacted                     once (``trim=False``: no)
=====================  =====================================================  ==========
"""

from drivetrain.ragged._checks import set_device_checks
from drivetrain.ragged.ops import as_index, combine, gather, map_pairs, mask_from_indices, scatter, write
from drivetrain.ragged.padded import RaggedBatch
from drivetrain.ragged.reduce import fill_padding, mean, sum
from drivetrain.ragged.select import indices_from_mask, select

__all__ = [
    "RaggedBatch",
    "as_index",
    "combine",
    "fill_padding",
    "gather",
    "indices_from_mask",
    "map_pairs",
    "mask_from_indices",
    "mean",
    "scatter",
    "select",
    "set_device_checks",
    "sum",
    "write",
]
