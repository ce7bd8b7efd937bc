"""The JSON Schema of every document attnlab writes as JSON (``--json``, ``--format json``), shipped as files.

Each document carries its schema's name first: ``"schema": "attnlab.check/1"``, the command, a slash and the
version. The version goes up when a field is removed, renamed or changes its meaning; new fields may appear without
a new version (the schemas allow them), so a script reads the fields it knows and checks the name.

>>> name("check")
'attnlab.check/1'
>>> schema("attnlab.check/1")["title"]
'attnlab check --json'
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

__all__ = ["VERSIONS", "name", "schema"]

#: The version of each command's JSON document; its schema is ``<command>.json`` in this package.
VERSIONS: dict[str, int] = {
    "bench": 1,
    "check": 1,
    "check-model": 1,
    "cost": 1,
    "explain": 1,
    "intervene": 1,
}


def name(command: str) -> str:
    """The schema name of ``command``'s JSON document, ``attnlab.<command>/<version>`` (``check --backward``
    writes a ``check`` document)."""
    base = command.split()[0]
    if base not in VERSIONS:
        raise ValueError(f"command: expected one of {', '.join(VERSIONS)}, got {command!r}")
    return f"attnlab.{base}/{VERSIONS[base]}"


def _load(command: str) -> dict[str, Any]:
    return json.loads(resources.files(__package__).joinpath(f"{command}.json").read_text(encoding="utf-8"))


def schema(schema_name: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of the documents named ``schema_name`` (``"attnlab.check/1"``), a
    new dict on every call."""
    command, _, version = schema_name.removeprefix("attnlab.").partition("/")
    if command not in VERSIONS or version != str(VERSIONS[command]):
        known = ", ".join(name(c) for c in VERSIONS)
        raise ValueError(f"schema_name: expected one of {known}, got {schema_name!r}")
    return _load(command)
