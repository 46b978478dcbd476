"""The nuScenes format: ``tables`` (table names, cameras, the ten classes, categories, attributes), ``splits`` (the
devkit's), ``submission`` (the submission format), ``metric`` (the devkit's detection metric), ``synth`` (the
synthetic generator's v1.0-mini layout) and ``format`` (the ``NUSCENES`` record and its detection rule).

Nothing is imported here: a module that needs the tables alone does not load the metric."""
