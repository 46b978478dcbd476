"""Reading and writing files someone else made: every reader of an untrusted file and every writer into a folder
someone else may control goes through this package.

- :mod:`.files` — writes that never follow a link (atomic replace, no-follow opens, real folders only);
- :mod:`.reads` — reads of regular files only (no FIFO, device or link), bounded in size;
- :mod:`.json_files` — JSON with bounded nesting and numbers;
- :mod:`.yaml_files` — bounded YAML (``yaml.safe_load`` under an alias and size budget);
- :mod:`.torch_files` — torch files loaded tensors-only (``weights_only=True``) and bounded.

``files`` and ``reads`` import nothing of drivetrain; the three readers build on ``reads``.
"""
