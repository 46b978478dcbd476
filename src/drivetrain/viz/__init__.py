"""Pictures of runs (matplotlib, headless): :mod:`drivetrain.viz.curves` draws a run's loss and metric curves."""
