"""The reference detectors, one folder each (``streampetr``, ``pointpillars`` — PointPillars and SSN —, ``focal2d``;
``smoke``, the engine tests' small conv net and its generated-tensor dataset).

A folder owns everything specific to its detector and exports one spec (``models/<name>/spec.py``); the registry
imports a folder only when a config names its model, so this package imports none of them (import a detector from
its folder: ``from drivetrain.models.streampetr import StreamPETR``). docs/design.md, "A new detector".
"""
