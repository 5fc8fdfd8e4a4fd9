"""Reading an archive's metadata within bounds, and showing what it says safely.

MANIFEST.json, MAR-INF/tsctl.json, MAR-INF/golden.json and model-config.yaml come from whoever built
the archive: they are read with bounds on size, depth and values before they are parsed
(``bounded_json``, ``bounded_yaml``): a 132 KB golden.json that unpacks to 60 MB of ``[[],[],...]``
took 1.6 GB to parse, a YAML alias bomb 3.9 GB. ``printable`` escapes control characters in anything
of the archive's that gets printed. Every problem is an ``ArchiveError``: one sentence naming the
archive and what is wrong with it.
"""

import json
import re
from typing import Any

MAX_METADATA_VALUES = 1_000_000  # JSON values or YAML nodes (aliases expanded) in one metadata file
MAX_METADATA_DEPTH = 64
CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")  # incl. bidi overrides


class ArchiveError(ValueError):
    """A model archive that cannot or must not be read; the message names it and the problem."""

    exit_code = 2


def bounded_json(data: bytes, where: str) -> Any:
    """JSON metadata, its values counted on the raw text before it is parsed and its depth checked
    (``protocol``'s counting, as for requests); an ArchiveError naming ``where`` otherwise."""
    from . import protocol  # not at the top: protocol is the wire, this module reads files

    limits = protocol.Limits(max_json_depth=MAX_METADATA_DEPTH, max_json_values=MAX_METADATA_VALUES)
    try:
        text = data.decode("utf-8")
        values = protocol.json_values(text, limits)
        if values > MAX_METADATA_VALUES:
            raise ArchiveError(f"{where} holds {values:,} values, above {MAX_METADATA_VALUES:,}: package it again")
        value = json.loads(text)
        protocol.check_json(value, limits)
        return value
    except (RecursionError, protocol.ClientError):
        raise ArchiveError(f"{where} nests deeper than {MAX_METADATA_DEPTH} levels: package it again") from None
    except ValueError as exc:
        raise ArchiveError(f"{where} is not valid JSON ({printable(str(exc))}): package it again") from None


def bounded_yaml(data: bytes, where: str, fix: str = "fix the syntax") -> Any:
    """YAML metadata (model-config.yaml) read safely: at most ``MAX_METADATA_VALUES`` nodes once its
    aliases are expanded (a billion-laughs bomb is refused from its node graph, before anything is
    built from it) and ``MAX_METADATA_DEPTH`` levels; an ArchiveError naming ``where`` otherwise,
    carrying the YAML error's line and ``fix`` when it is not YAML."""
    import yaml

    try:
        root = yaml.compose(data, Loader=yaml.SafeLoader)
        if root is None:
            return None
        nodes = _expanded_nodes(root)
        if nodes > MAX_METADATA_VALUES:
            raise ArchiveError(
                f"{where} expands to {nodes:,} values through its YAML aliases, above {MAX_METADATA_VALUES:,}: "
                "write it without anchors and aliases"
            )
        return yaml.safe_load(data)
    except RecursionError:
        raise ArchiveError(f"{where} nests deeper than Python can read: {fix}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1})" if mark else ""
        raise ArchiveError(f"{where} is not valid YAML{line}: {fix}") from None


def _expanded_nodes(root) -> int:
    """How many nodes a YAML node graph holds with every alias expanded: each distinct node's count
    is computed once (aliases share node objects), so this costs the graph, not the expansion."""
    import yaml

    counts, stack = {}, [(root, 1, False)]
    while stack:
        node, depth, done = stack.pop()
        if depth > MAX_METADATA_DEPTH:
            raise RecursionError
        if id(node) in counts:
            continue
        children = []
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        if done:
            counts[id(node)] = 1 + sum(counts[id(child)] for child in children)
            continue
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in children if id(child) not in counts)
    return counts[id(root)]


def printable(text: Any) -> str:
    """``text`` with control characters (terminal escapes, carriage returns, bidi overrides) shown
    as ``\\xNN`` / ``\\uNNNN``: names and values of an archive's are printed through this."""
    return CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))
