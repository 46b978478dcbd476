"""The Lyft Level 5 format: ``tables`` (the nine classes, attributes, table folder, category check and the detection
rule), ``splits`` (mmdetection3d's train/val), ``submission`` (the SDK's box records), ``average_precision`` (IoU and
AP of the Lyft metric), ``metric`` (the metric of a predictions file over a split), ``synth`` (the synthetic
generator's v1.01-train layout) and ``format`` (the ``LYFT`` record).

How Lyft differs from nuScenes is told in :mod:`.tables`. Nothing is imported here: a module that needs the tables
alone does not load the metric."""
