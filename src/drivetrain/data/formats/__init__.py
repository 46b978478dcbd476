"""Dataset formats: one package per format, a generic record of what a format is, and the registry of them.

- :mod:`.record` — :class:`~.record.DatasetFormat`, the record every format fills (classes, categories, splits,
  detection rule, submission writer, ground truth, metric, synthetic strategy); :mod:`.synth_format` — the
  :class:`~.synth_format.SynthFormat` protocol the synthetic generator asks; :mod:`.submission` — what every
  predictions file shares (walk, checks, writing). These import no format.
- ``nuscenes/`` and ``lyft/`` — one package per format: ``tables`` (classes, categories, cameras, ...), ``splits``,
  ``submission`` (predictions written from boxes, the ground truth as predictions, checks), ``metric`` (the metric
  of a predictions file, its summary and report), ``synth`` (its :class:`~.synth_format.SynthFormat`), and
  ``format`` (its record and its detection rule).
- :mod:`.registry` — :data:`~.registry.FORMATS` by name, :func:`~.registry.detect_format`,
  :func:`~.registry.format_of`, :func:`~.registry.index_meta`, :func:`~.registry.default_version`.

Imports point one way: the generic modules at the bottom, the format packages on them, the registry on the
packages; the index, the synthetic generator's bookkeeping and the command line on the registry. This file imports
nothing, so that a format's tables load without its metric. docs/data.md lists the files a new format needs.
"""
