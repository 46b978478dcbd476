"""The built-in models' specs: each declares a typed ``model.args`` dataclass, each spec's modalities are what its
built model says it reads, and ``model.args`` values of either member of a union (``compile_loss: true`` or a
mapping of ``torch.compile`` arguments) load."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys

import pytest

from drivetrain.engine import ConfigError
from drivetrain.engine.protocol import Sensors
from drivetrain.engine.registry import MODELS, check_args, model_spec

WITH_ARGS = [name for name in MODELS if model_spec(name).args is not None]


def _takes_its_args(name: str) -> bool:
    """Whether the builder takes one instance of its spec's args (``build(args)``, the protocol), not their fields."""
    spec = model_spec(name)
    params = [p for p in inspect.signature(spec.build).parameters.values() if p.kind is not p.VAR_KEYWORD]
    return len(params) == 1 and isinstance(params[0].default, spec.args)


def test_the_shipped_detectors_declare_typed_args():
    assert {"streampetr", "focal2d", "pointpillars", "ssn"} <= set(WITH_ARGS)
    assert set(WITH_ARGS) == {name for name in WITH_ARGS if _takes_its_args(name)}  # build(args), the protocol


@pytest.mark.parametrize("name", list(MODELS))
def test_spec_modalities_are_what_the_built_model_reads(name):
    spec = model_spec(name)
    model = spec.build_model(spec.args() if spec.args is not None else None)
    if spec.modalities == {"tensor"}:  # the engine's smoke model: plain tensors, no sensor to declare
        assert not isinstance(model, Sensors)
    else:
        assert frozenset(model.input_modalities) == spec.modalities


def test_compile_loss_takes_true_or_a_mapping_of_compile_arguments():
    assert check_args("model", "streampetr", {"compile_loss": True}).compile_loss is True
    mapping = check_args("model", "streampetr", {"compile_loss": {"mode": "reduce-overhead"}})
    assert mapping.compile_loss == {"mode": "reduce-overhead"}
    assert check_args("model", "streampetr", {}).compile_loss is False


def test_a_value_of_no_union_member_is_refused_by_the_first():
    with pytest.raises(ConfigError, match=r"^model\.args\.compile_loss: expected true or false, got str 'yes'$"):
        check_args("model", "streampetr", {"compile_loss": "yes"})
    with pytest.raises(ConfigError, match=r"^model\.args\.backbone_args: expected a mapping, got int 3$"):
        check_args("model", "streampetr", {"backbone_args": 3})


def test_a_key_the_builder_does_not_take_is_one_line():
    with pytest.raises(ConfigError, match=r"^model\.args\.num_queries: unknown key; known keys: .*num_query"):
        check_args("model", "streampetr", {"num_queries": 100})
    with pytest.raises(ConfigError, match=r"^model\.args\.width: expected an integer, got float 1\.5$"):
        check_args("model", "focal2d", {"width": 1.5})


# A detector's folder stands alone: looking up one model imports no other detector's folder (the 2D focal detector
# shares StreamPETR's focal-head loss through drivetrain.losses.focal_head, not through StreamPETR's folder).
IMPORTS_OF = {"streampetr": set(), "pointpillars": set(), "ssn": set(), "focal2d": set()}


# One interpreter each (~2.7 s): the default set looks up focal2d, the one that shares a loss with another detector
# (the slow set the other three).
@pytest.mark.parametrize(
    "name", [name if name == "focal2d" else pytest.param(name, marks=pytest.mark.slow) for name in sorted(IMPORTS_OF)]
)
def test_looking_up_a_model_imports_no_other_detectors_folder(name):
    code = (
        "import sys\nfrom drivetrain.engine.registry import model_spec\n"
        f"model_spec({name!r}).build\n"
        "print(sorted({m.split('.')[2] for m in sys.modules if m.startswith('drivetrain.models.')}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    folder = "pointpillars" if name == "ssn" else name
    assert set(ast.literal_eval(done.stdout.strip())) == {folder} | IMPORTS_OF[name]
