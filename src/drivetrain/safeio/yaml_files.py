"""YAML from files someone else may have written: plain data only, and bounded before anything is copied.

:class:`BoundedSafeLoader` is ``yaml.SafeLoader`` (no tag that is not plain data) that refuses a document expanding
past :data:`MAX_YAML_NODES` nodes or nesting deeper than :data:`MAX_YAML_DEPTH` — counting every alias as the copy
it stands for, so a few hundred bytes of aliases (a "billion laughs" bomb) are refused before the config merge or a
dump copies them. :func:`load_yaml` parses with it; :func:`yaml_problem` says what is wrong and where without
quoting the text (which may be a file that is not ours). Every YAML drivetrain reads goes through here
(:mod:`drivetrain.engine.config_files` for configs and a run's ``config.yaml``). Imports nothing of drivetrain.

The largest shipped config (configs/ssn_lyft.yaml) is 4.5 KB and ~300 nodes, nested 5 deep, and a run's
config.yaml (every field written out) ~400 nodes; the bounds leave 200× and more room above that while keeping
what one file can make the merge copy to ~100k small objects (tens of MB at most).
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["MAX_YAML_DEPTH", "MAX_YAML_NODES", "BoundedSafeLoader", "YAMLBoundError", "load_yaml", "yaml_problem"]

MAX_YAML_NODES = 100_000  # nodes of one document, every alias counted as the copy it stands for
MAX_YAML_DEPTH = 100  # nesting of one document (through aliases too); the merge recurses this deep


class YAMLBoundError(yaml.composer.ComposerError):
    """A YAML document past :data:`MAX_YAML_NODES` / :data:`MAX_YAML_DEPTH`, or one that contains itself."""


class BoundedSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` refusing a document that expands past :data:`MAX_YAML_NODES` nodes or nests deeper than
    :data:`MAX_YAML_DEPTH` (module docstring), with a ``ComposerError`` at the node where the bound is crossed.

    PyYAML builds one object per node and lets every alias share it, so loading a bomb is cheap and copying it
    (the merge, a dump) is not. The loader counts what the copies would be: a node's expanded size is 1 plus its
    children's (an alias counts as its anchor's expanded size) and its height 1 plus the tallest child's, computed
    once per node as it is composed. An alias of a node still being composed (``&a [*a]``: a document that
    contains itself) has no finite expansion and is refused too.

    Example:
        >>> yaml.load("a: &x [1, 2]\nb: *x", Loader=BoundedSafeLoader)
        {'a': [1, 2], 'b': [1, 2]}
    """

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._depth = 0  # nesting of the node being composed, as written
        self._expanded: dict[int, tuple[int, int]] = {}  # id(node) → (nodes, height) once composed

    def compose_node(self, parent: Any, index: Any) -> Any:
        """The next node, as ``SafeLoader`` composes it, after checking its expansion against the bounds."""
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)  # the anchored node itself (or an undefined-alias error)
            if id(node) not in self._expanded:
                raise YAMLBoundError(None, None, "holds an alias of a node that contains it", mark)
            self._check(node, mark)
            return node
        mark = self.peek_event().start_mark
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise YAMLBoundError(None, None, f"is nested deeper than {MAX_YAML_DEPTH} levels", mark)
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.ScalarNode):
            children: list[Any] = []
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = list(node.value)
        sizes = [self._expanded[id(child)] for child in children]
        self._expanded[id(node)] = (1 + sum(n for n, _ in sizes), 1 + max((h for _, h in sizes), default=0))
        self._check(node, mark)
        return node

    def _check(self, node: Any, mark: Any) -> None:
        nodes, height = self._expanded[id(node)]
        if nodes > MAX_YAML_NODES:
            raise YAMLBoundError(None, None, f"expands to more than {MAX_YAML_NODES} nodes through its aliases", mark)
        if self._depth + height > MAX_YAML_DEPTH:
            raise YAMLBoundError(None, None, f"is nested deeper than {MAX_YAML_DEPTH} levels through its aliases", mark)


def _bounded_int(loader: BoundedSafeLoader, node: Any) -> int:
    """``SafeLoader``'s integer, with Python's digit limit for ``int(str)`` (4300 digits) a YAML error at the node
    instead of a ``ValueError`` that advises ``sys.set_int_max_str_digits``."""
    try:
        return yaml.SafeLoader.construct_yaml_int(loader, node)
    except ValueError:
        raise yaml.constructor.ConstructorError(
            None, None, f"holds an integer of {len(str(node.value))} characters, too long to convert", node.start_mark
        ) from None


BoundedSafeLoader.add_constructor("tag:yaml.org,2002:int", _bounded_int)


def load_yaml(text: str) -> Any:
    """``text`` parsed by :class:`BoundedSafeLoader` (``yaml.safe_load``'s values, bounded).

    Raises:
        yaml.YAMLError: not valid YAML, a tag that is not plain data, or past the bounds; :func:`yaml_problem`
            words it without quoting ``text``.
    """
    return yaml.load(text, Loader=BoundedSafeLoader)  # a SafeLoader: plain data only


def yaml_problem(err: yaml.YAMLError) -> str:
    """What is wrong with a YAML text and where (``mapping values are not allowed here (line 3, column 9)``),
    without the excerpt of the text PyYAML's own message quotes."""
    if isinstance(err, yaml.MarkedYAMLError):
        problem = err.problem or err.context or type(err).__name__
        mark = err.problem_mark or err.context_mark
        return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else problem
    return type(err).__name__
