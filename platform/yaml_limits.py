"""Reading a user's YAML file (experiments, serve configs) within bounds, before anything is built from it.

PyYAML's safe loader runs no code, but a small file can still cost minutes or gigabytes downstream:
anchors and aliases share one node many times over (nine aliases of nine aliases make a billion
leaves for anything that walks the result), nesting thousands deep overflows recursive code, and a
multi-megabyte file is never an experiment definition. `load_bounded_yaml` refuses, with one line
naming the file and the limit, a file over MAX_YAML_BYTES, one that is not UTF-8, and one whose node
graph, expanded as a walker would see it, has more than MAX_YAML_NODES nodes or nests deeper than
MAX_YAML_DEPTH. The graph is measured with shared nodes counted once per use but computed once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from genrec.workloads.errors import UserInputError

MAX_YAML_BYTES = 1 << 20
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 32  # deepest legitimate file: about 5 levels (search_space.x.range.low)


def measure(
    node: yaml.Node, memo: dict[int, tuple[int, int]], open_: set[int], depth: int = 0
) -> tuple[int, int]:
    """(expanded node count, depth) of `node`, each shared node computed once; stops past the limits."""
    key = id(node)
    if key in memo:
        return memo[key]
    if key in open_:
        raise UserInputError("an alias refers to a node that contains it (a recursive anchor)")
    if depth > MAX_YAML_DEPTH:
        return 1, MAX_YAML_DEPTH + 1
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = list(node.value)
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    open_.add(key)
    count, deepest = 1, 0
    for child in children:
        c, d = measure(child, memo, open_, depth + 1)
        count, deepest = count + c, max(deepest, d)
        if count > MAX_YAML_NODES or deepest > MAX_YAML_DEPTH:
            break
    open_.discard(key)
    memo[key] = (count, deepest + 1)
    return memo[key]


def load_bounded_yaml(path: Path, what: str) -> Any:
    """The YAML document in `path` (a `what`, e.g. "experiment file"), or UserInputError naming the
    file and the bound it breaks."""
    size = path.stat().st_size
    if size > MAX_YAML_BYTES:
        raise UserInputError(f"{path}: {size} bytes, over the {MAX_YAML_BYTES}-byte limit for a YAML {what}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserInputError(
            f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); save it as UTF-8"
        ) from None
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        count, depth = measure(node, {}, set())
        if depth > MAX_YAML_DEPTH:
            raise UserInputError(f"nests deeper than {MAX_YAML_DEPTH} levels")
        if count > MAX_YAML_NODES:
            raise UserInputError(
                f"expands to more than {MAX_YAML_NODES} values (anchors and aliases counted at each use)"
            )
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise UserInputError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None
    except RecursionError:
        raise UserInputError(f"{path}: not a {what}: nests too deep to read") from None
    except UserInputError as e:
        raise UserInputError(f"{path}: {e}; a {what} stays within these bounds") from None
    finally:
        loader.dispose()
