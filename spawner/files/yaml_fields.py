"""What every YAML file reader here shares: strict loading, typo-catching field checks, memory amounts.

Each reader keeps a small ``_Where`` that knows its file, its error type and where in the file a value sits;
the helpers take it (anything with a ``fail`` that raises) so every message starts the same way.
"""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Any, NoReturn, Protocol

import yaml

_MEMORY = re.compile(r"\s*([0-9]+)\s*(TiB|GiB|MiB)\s*")
_MIB_PER = {"TiB": 1024 * 1024, "GiB": 1024, "MiB": 1}


class Where(Protocol):
    """A place in a file that can raise the reader's own error, prefixed with that place."""

    def fail(self, what: str) -> NoReturn: ...


MAX_FILE_BYTES = 4 * 2**20  # a pool of 10,000 nodes is about 1.5 MB; more is a mistake or an attack


def read_text(path: str | Path, what: str, error_type: type[Exception]) -> str:
    """The file's text; a missing, unreadable, non-UTF-8 or oversized (over :data:`MAX_FILE_BYTES`) file
    raises ``error_type`` naming ``what``."""
    try:
        with Path(path).open("rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
        if len(data) > MAX_FILE_BYTES:
            raise error_type(
                f"{path}: the {what} is larger than {MAX_FILE_BYTES // 2**20} MiB, the most read"
            )
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) or error
        raise error_type(f"{path}: cannot read the {what}: {reason}") from None


def load_yaml(text: str, source: str, error_type: type[Exception]) -> object:
    """Parse ``text`` with :class:`StrictLoader`; bad YAML raises ``error_type`` naming the line and column."""
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader subclass: no arbitrary objects
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark or error.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise error_type(f"{source}: {where}invalid YAML: {error.problem or error.context}") from None
    except yaml.YAMLError as error:
        raise error_type(f"{source}: invalid YAML: {error}") from None


def required_field(where: Where, mapping: dict[Any, Any], key: str, label: str | None = None) -> object:
    """``mapping[key]``; a missing or null value fails, naming ``label`` (default ``key``)."""
    if mapping.get(key) is None:
        where.fail(f"missing required field {label or key!r}")
    return mapping[key]


def check_fields(where: Where, mapping: dict[Any, Any], allowed: tuple[str, ...], scope: str = "") -> None:
    """Catch typos: an unknown field is an error that names it, the likely intended one and all allowed."""
    for key in mapping:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            where.fail(f"unknown field {key!r}{scope}{hint}; allowed fields are {', '.join(allowed)}")


def kind(value: object) -> str:
    """What a value is, in the words of an error message: ``nothing``, ``a mapping``, ``str 'cpu'``."""
    if value is None:
        return "nothing"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list" if value else "an empty list"
    return f"{type(value).__name__} {value!r}"


def parse_memory_mib(where: Where, value: object, example: str, below: int | None = None) -> int:
    """A ``memory`` field: ``16GiB``, ``512MiB``, ``2TiB`` or an integer of MiB, above zero (and under
    ``below``)."""
    mib: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        mib = value
    elif isinstance(value, str) and (match := _MEMORY.fullmatch(value)):
        mib = int(match.group(1)) * _MIB_PER[match.group(2)]
    if mib is None or mib <= 0 or (below is not None and mib >= below):
        where.fail(f"memory must be like {example} or an integer of MiB, got {value!r}")
    return mib


class StrictLoader(yaml.SafeLoader):
    """A SafeLoader that refuses duplicate keys, which PyYAML would otherwise let silently overwrite."""


def _mapping_without_duplicates(loader: StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[object] = set()
    for key_node, _ in node.value:
        if key_node.tag == "tag:yaml.org,2002:merge":
            continue
        key = loader.construct_object(key_node, deep=True)
        try:
            duplicate = key in seen
        except TypeError:
            continue  # unhashable: construct_mapping below reports it
        if duplicate:
            raise yaml.constructor.ConstructorError(
                "while reading a mapping", node.start_mark, f"duplicate key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
