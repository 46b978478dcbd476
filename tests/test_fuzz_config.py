"""Fuzzed configs: mutated YAML files (their structure and their bytes) and random ``key=value`` overrides
either load into a valid config that round-trips through ``config.yaml``, or fail with a ConfigError naming
the file or key — never another exception."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from drivetrain.engine import ConfigError, load_config
from drivetrain.engine.config import TrainConfig, config_to_dict
from helpers.engine import SMOKE
from helpers.fuzz import BUDGETS, JSON_SCALARS, Tally, fuzz_settings, mutated_bytes, mutated_document


def dotted_keys(cls: type, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(cls):
        key = f"{prefix}{f.name}"
        keys.append(key)
        if dataclasses.is_dataclass(f.type) or isinstance(f.default_factory, type):
            sub = f.default_factory if isinstance(f.default_factory, type) else f.type
            if dataclasses.is_dataclass(sub):
                keys += dotted_keys(sub, key + ".")
    return keys


KEYS = [*dotted_keys(TrainConfig), "model.args.width", "data.args.num_samples", "optim.groups.0.lr_mult"]
ORIGINAL = yaml.safe_load(SMOKE.read_text())


def check(path: Path, overrides: list[str], tally: Tally) -> None:
    try:
        cfg = load_config(path, overrides)
    except ConfigError as err:
        assert str(err).strip() and "\n" not in str(err).split(":", 1)[0], err
        tally("ConfigError")
        return
    # Loaded: the config must be valid as a whole, i.e. its dump (what a run directory keeps) loads back equal.
    dumped = path.with_name("roundtrip.yaml")
    dumped.write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))
    assert load_config(dumped) == cfg
    tally("loaded")


@pytest.mark.parametrize("examples", BUDGETS)
def test_mutated_config_structure(tmp_path: Path, examples: int) -> None:
    tally = Tally("config (structure)")

    @fuzz_settings(examples)
    @given(mutated_document(ORIGINAL))
    def case(document):
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(document, sort_keys=False))
        check(path, [], tally)

    case()
    tally.report()


@pytest.mark.parametrize("examples", BUDGETS)
def test_mutated_config_bytes(tmp_path: Path, examples: int) -> None:
    tally = Tally("config (bytes)")

    @fuzz_settings(examples)
    @given(mutated_bytes(SMOKE.read_bytes()))
    def case(data):
        path = tmp_path / "config.yaml"
        path.write_bytes(data)
        check(path, [], tally)

    case()
    tally.report()


OVERRIDE = st.tuples(
    st.one_of(st.sampled_from(KEYS), st.text(max_size=12)),
    st.one_of(JSON_SCALARS.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip()), st.text(max_size=12)),
).map(lambda kv: f"{kv[0]}={kv[1]}")


@pytest.mark.parametrize("examples", BUDGETS)
def test_random_overrides(tmp_path: Path, examples: int) -> None:
    tally = Tally("overrides")
    path = tmp_path / "config.yaml"
    path.write_bytes(SMOKE.read_bytes())

    @fuzz_settings(examples)
    @given(st.lists(st.one_of(OVERRIDE, st.text(max_size=16)), min_size=1, max_size=3))
    def case(overrides):
        check(path, overrides, tally)

    case()
    tally.report()
