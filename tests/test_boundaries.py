"""Module boundaries of ``src/drivetrain``, read from the source with ``ast`` (nothing is imported): no import cycle
between modules, every package imports only packages of lower layers, and no private name crosses a package.

Every import counts — at module level, inside functions (a lazy import is still a dependency, and a cycle hidden
in a function is still a cycle) and under ``if TYPE_CHECKING:`` (for the layers; a type-only import never runs, so
it cannot close a cycle). ``python tests/test_boundaries.py`` prints the package graph.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

import drivetrain

SOURCE = Path(drivetrain.__file__).resolve().parent  # src/drivetrain

# The layers, lowest first; a package may import packages of lower layers only (never one of its own layer but
# itself). docs/design.md ("Layers") describes the same table:
LAYERS: tuple[frozenset[str], ...] = (
    # the package itself: __version__ only
    frozenset({"drivetrain"}),
    # the readers and writers of files someone else made (no link followed, regular files only, bounded JSON and
    # YAML, torch files loaded tensors-only), under every writer and reader: profile's result files included
    frozenset({"safeio"}),
    # leaves: ragged batches, cached device constants, seed mixing, and profile (timed regions and cost counting,
    # which every layer may use); what a detector declares (its spec and the weight key maps' shared record), which
    # model folders define and the engine reads without importing a model
    frozenset({"ragged", "constants", "seeding", "profile", "detector"}),
    # on ragged and the constants: geometry (boxes, IoU, projection, heatmaps), the torch.compile helpers, and the
    # batch type (Batch, ModelBatch) that data collates into and the pipeline, models, losses and engine read
    frozenset({"geometry", "compiled", "batch"}),
    # matching (costs, solvers, assigners), nuScenes-format data (no models, no pipeline), drawing
    frozenset({"match", "data", "viz"}),
    # losses on the matchers; the pipeline (transfer, augmentation, voxelization) on data
    frozenset({"losses", "pipeline"}),
    # the reference detectors
    frozenset({"models"}),
    # the trainer: models only through the protocol and the registry (by name, never by import: see FORBIDDEN)
    frozenset({"engine"}),
    # the command line wires everything
    frozenset({"cli"}),
)
LAYER = {package: level for level, packages in enumerate(LAYERS) for package in packages}
# Imports the layers would allow but docs/design.md does not: the engine knows models through the protocol only.
FORBIDDEN = {("engine", "models")}
# RaggedBatch's private state: ragged's own (others use tensor, sizes, ragged_dim, cached_mask, unchecked).
RAGGED_PRIVATE = frozenset({"_tensor", "_sizes", "_ragged_dim", "_mask", "_make"})


@dataclass(frozen=True)
class Import:
    """One import statement's dependency: ``source`` module imports ``target`` module (``names`` from it)."""

    source: str
    target: str
    names: tuple[str, ...]
    line: int
    type_only: bool

    def where(self) -> str:
        return f"{module_path(self.source)}:{self.line}"


def module_path(module: str) -> str:
    path = SOURCE.parent / Path(*module.split("."))
    return str((path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(SOURCE.parent))


@cache
def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(SOURCE.rglob("*.py")):
        parts = path.relative_to(SOURCE.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def package(module: str) -> str:
    """``drivetrain.ragged.ops`` → ``ragged``; ``drivetrain.constants`` → ``constants``; the root → ``drivetrain``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _resolve(name: str) -> str | None:
    """The innermost of our modules that ``name`` (a module or a name in one) lies in; None outside drivetrain."""
    if name != "drivetrain" and not name.startswith("drivetrain."):
        return None
    while name not in modules():
        name = name.rpartition(".")[0]
    return name


def _type_checking_lines(tree: ast.Module) -> set[int]:
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


@cache
def imports() -> tuple[Import, ...]:
    """Every import of one of our modules by another, anywhere in its source."""
    found = []
    for module, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        type_only = _type_checking_lines(tree)
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                pairs = [(alias.name, ()) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parent = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                    base = ".".join([*parent, *([node.module] if node.module else [])])
                pairs = []
                for alias in node.names:  # a submodule imported by name is a dependency on that submodule
                    sub = f"{base}.{alias.name}"
                    pairs.append((sub, ()) if sub in modules() else (base, (alias.name,)))
            else:
                continue
            for name, names in pairs:
                target = _resolve(name)
                if target is not None and target != module:
                    found.append(Import(module, target, names, node.lineno, node.lineno in type_only))
    return tuple(found)


def package_graph() -> dict[str, set[str]]:
    """Package → the other packages it imports."""
    graph: dict[str, set[str]] = defaultdict(set)
    for imp in imports():
        if package(imp.source) != package(imp.target):
            graph[package(imp.source)].add(package(imp.target))
    return dict(graph)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return components


# ---------------------------------------------------------------------------------------------- the reader
def test_the_reader_finds_the_imports_it_must():
    """The graph reader against imports known to exist, of each form (absolute, lazy, type-only, submodule)."""
    found = {(i.source, i.target, i.type_only) for i in imports()}
    assert ("drivetrain.ragged.ops", "drivetrain.ragged.padded", False) in found  # from ... import Name
    assert ("drivetrain.ragged", "drivetrain.ragged.select", False) in found  # a package's __init__
    assert ("drivetrain.engine.config", "drivetrain.engine.registry", False) in found  # inside a function
    assert ("drivetrain.engine.protocol", "drivetrain.pipeline.voxelize", True) in found  # if TYPE_CHECKING:
    assert ("drivetrain.compiled", "drivetrain.profile", False) in found  # from drivetrain import profile
    assert package_graph()["pipeline"] >= {"data", "ragged", "seeding"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


# ---------------------------------------------------------------------------------------------- the rules
def test_no_import_cycle_between_modules():
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in imports():
        if not imp.type_only:
            edges[imp.source].add(imp.target)
    cycles = _cycles(edges)
    lines = []
    for cycle in cycles:
        members = set(cycle)
        links = [
            f"{i.where()} → {i.target}"
            for i in imports()
            if i.source in members and i.target in members and not i.type_only
        ]
        lines.append(" ↔ ".join(cycle) + ": " + "; ".join(sorted(set(links))))
    assert not cycles, "import cycles:\n" + "\n".join(lines)


def data_edges() -> dict[str, set[str]]:
    """Module → the ``drivetrain.data`` modules that its imports run, between modules of ``drivetrain.data``: every
    import, type-only ones too (an idea that loops is a loop even where it never runs), and the packages above the
    imported module that Python initialises first (their ``__init__``), except those the importer lies in."""
    edges: dict[str, set[str]] = defaultdict(set)
    for imp in imports():
        if not (imp.source.startswith("drivetrain.data") and imp.target.startswith("drivetrain.data")):
            continue
        parts = imp.target.split(".")
        for end in range(2, len(parts) + 1):  # drivetrain.data, drivetrain.data.formats, ..., the target itself
            run = ".".join(parts[:end])
            if run != imp.source and not imp.source.startswith(run + "."):
                edges[imp.source].add(run)
    return edges


def test_the_data_graph_counts_type_only_imports_and_the_packages_an_import_initialises():
    edges = data_edges()
    assert "drivetrain.data.formats.nuscenes" in edges["drivetrain.data.synth.world"]  # its __init__ runs first
    assert "drivetrain.data" not in edges["drivetrain.data.index"]  # the importer's own package
    inside = [i for i in imports() if i.source.startswith("drivetrain.data") and i.target.startswith("drivetrain.data")]
    assert all(i.target in edges[i.source] for i in inside)  # every import, type-only or lazy ones too


def test_no_import_cycle_in_data_not_even_through_type_only_imports():
    """The dataset formats at the bottom, the format packages on them, the registry on those, the index and the
    synthetic generator's bookkeeping on the registry: no module of ``drivetrain.data`` reaches itself again."""
    edges = data_edges()
    lines = [" ↔ ".join(cycle) for cycle in _cycles(edges)]
    assert not lines, "import cycles in drivetrain.data (type-only imports and package __init__ included):\n" + (
        "\n".join(lines)
    )


def test_every_package_has_a_layer():
    packages = {package(m) for m in modules()}
    assert packages == set(LAYER), f"packages without a layer: {sorted(packages - set(LAYER))}"


def test_packages_import_only_lower_layers():
    upward = []
    for imp in imports():
        a, b = package(imp.source), package(imp.target)
        if a != b and (LAYER[b] >= LAYER[a] or (a, b) in FORBIDDEN):
            upward.append(f"{imp.where()}: {a} (layer {LAYER[a]}) imports {imp.target} ({b}, layer {LAYER[b]})")
    assert not upward, "imports against the layers:\n" + "\n".join(sorted(set(upward)))


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_no_private_name_crosses_a_package():
    """No ``from drivetrain.<pkg> import _private`` (or a private module) from another package, no attribute
    ``Imported._private`` on a name imported from another package, and RaggedBatch's private state stays in ragged."""
    crossing = []
    for imp in imports():
        if package(imp.source) == package(imp.target):
            continue
        private_module = any(_private(part) for part in imp.target.split("."))
        private_names = [n for n in imp.names if _private(n)]
        if private_module or private_names:
            crossing.append(f"{imp.where()}: imports {imp.target} {private_names or ''}")
    for module, path in modules().items():
        tree = ast.parse(path.read_text(), str(path))
        foreign = {  # local names bound to another package's modules or objects
            (alias.asname or alias.name).split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom | ast.Import)
            for alias in node.names
            if (target := _resolve(getattr(node, "module", None) or alias.name) or "")
            and package(target) != package(module)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or not _private(node.attr):
                continue
            owner = node.value.id if isinstance(node.value, ast.Name) else None
            if owner in foreign:
                crossing.append(f"{module_path(module)}:{node.lineno}: {owner}.{node.attr}")
            elif package(module) != "ragged" and node.attr in RAGGED_PRIVATE and owner not in ("self", "cls"):
                crossing.append(f"{module_path(module)}:{node.lineno}: .{node.attr} (RaggedBatch's private state)")
    assert not crossing, "private names used across packages:\n" + "\n".join(sorted(set(crossing)))


if __name__ == "__main__":
    for name, targets in sorted(package_graph().items(), key=lambda item: (LAYER.get(item[0], -1), item[0])):
        print(f"{name} (layer {LAYER.get(name, '?')}) → {', '.join(sorted(targets))}")
    sys.exit(pytest.main([__file__, "-q"]))


# ------------------------------------------------------------------ the engine and the command line name no model
# A detector is known to them by its spec (registry) and the protocol only; its name appears in one place, its line
# of the registry's MODELS table (and the fixed tables of old builder spellings and moved model arguments,
# engine/old_spellings.py). Case-insensitive, in code, strings, docstrings and comments alike: an example in --help
# names a placeholder, not a shipped detector.
MODEL_WORDS = re.compile(r"streampetr|petr3d|pointpillars|point pillars|\bssn\b|focal2d|voxelnet", re.IGNORECASE)
NAMING_TABLES = {
    "drivetrain.engine.registry": ("MODELS",),
    "drivetrain.engine.old_spellings": ("ALIASES", "MOVED_ARGS"),
}


def _table_lines(module: str, path: Path) -> set[int]:
    """The lines of ``module``'s tables that are allowed to name models."""
    lines: set[int] = set()
    for node in ast.parse(path.read_text()).body:
        targets = [node.target] if isinstance(node, ast.AnnAssign) else getattr(node, "targets", [])
        if any(isinstance(t, ast.Name) and t.id in NAMING_TABLES.get(module, ()) for t in targets):
            lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return lines


def test_the_engine_and_the_command_line_name_no_model():
    found = []
    for module, path in modules().items():
        if package(module) not in ("engine", "cli"):
            continue
        allowed = _table_lines(module, path)
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if number not in allowed and MODEL_WORDS.search(line):
                found.append(f"{module_path(module)}:{number}: {line.strip()[:100]}")
    assert not found, "the engine and the CLI know models by spec and protocol only:\n" + "\n".join(found)
