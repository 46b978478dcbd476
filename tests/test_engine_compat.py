"""The compatibility policy's data (docs/design.md, "Compatibility policy"): how long old forms are read, and that
every entry of the old-spellings tables still points at something that exists today."""

from __future__ import annotations

import dataclasses
import typing

import pytest

import drivetrain
from drivetrain.engine import registry
from drivetrain.engine.config import TrainConfig
from drivetrain.engine.old_spellings import ALIASES, MOVED_ARGS, READ_UNTIL, moved_args


def _field_path_exists(cls: type, dotted: str) -> bool:
    """Whether ``dotted`` (``a.b.c``) names a field of the dataclass ``cls``, through nested dataclass fields."""
    node: object = cls
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(node):
            return False
        hints = typing.get_type_hints(node)
        if part not in hints:
            return False
        tp = hints[part]
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        node = args[0] if args and dataclasses.is_dataclass(args[0]) else tp
    return True


def test_old_forms_are_not_read_past_the_version_the_policy_names():
    major, minor = (int(part) for part in drivetrain.__version__.split(".")[:2])
    assert (major, minor) <= READ_UNTIL, (
        f"drivetrain {drivetrain.__version__} is past READ_UNTIL {READ_UNTIL}: refuse the old forms in one line and "
        "delete their rules (docs/design.md, 'Compatibility policy')"
    )


@pytest.mark.parametrize("kind", sorted(ALIASES))
def test_every_old_builder_spelling_maps_to_a_built_in_name(kind):
    built_in = registry.MODELS if kind == "model" else registry.DATASETS
    assert set(ALIASES[kind].values()) <= set(built_in)
    assert all(registry.canonical_name(kind, old) == new for old, new in ALIASES[kind].items())


@pytest.mark.parametrize("name", sorted(MOVED_ARGS))
def test_every_moved_argument_names_a_built_in_model_a_gone_key_and_a_field_of_today(name):
    assert name in registry.MODELS
    args = registry.model_spec(name).args
    assert args is not None
    fields = {field.name for field in dataclasses.fields(args)}
    for old, (new, hint) in moved_args(name).items():
        assert old not in fields, f"model.args.{old} of {name} is a field again: remove it from MOVED_ARGS"
        assert new == "" or _field_path_exists(TrainConfig, new), f"{name}: {new} is no config key"
        assert hint and "\n" not in hint
    assert moved_args("no-such-model") == {}
