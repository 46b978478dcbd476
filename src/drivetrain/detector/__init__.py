"""What a detector declares to the engine, defined below every model folder so that a model (built-in or a plugin)
can declare itself without importing the engine, and the engine can read it without importing a model:

- :mod:`.spec` — :class:`~.spec.ModelSpec` (builder, typed ``model.args``, inputs, weight formats) and
  :class:`~.spec.WeightFormat`;
- :mod:`.keymap` — :class:`~.keymap.KeyMap`, a weights file's state dict renamed into a model's names, the
  model-neutral part of every weight format's map.
"""
