"""Knowledge tools' text side: keyword search as SPARQL, and query rows as text.

``memory_query`` takes either SPARQL or plain keywords. Keywords become a SELECT over
the mesh's observation vocabulary (``porter:about`` / ``porter:finding``) that keeps
findings whose subject or text contains every keyword, case-insensitively, so a model
that does not write SPARQL still finds what the team remembered.
"""

from __future__ import annotations

import re
from typing import Final

from porter_mesh.core.constants import PORTER_VOCAB, PROV_NS
from porter_mesh.tools.port import QueryResult

__all__ = ["KEYWORD_LIMIT", "ROW_LIMIT", "is_sparql", "keyword_query", "render_rows"]

#: Rows a keyword search asks for.
KEYWORD_LIMIT: Final = 50

#: Rows shown to the agent (the rest are counted).
ROW_LIMIT: Final = 50

_SPARQL_START: Final = re.compile(
    r"^\s*(?:#[^\n]*\n\s*)*(PREFIX|BASE|SELECT|ASK|CONSTRUCT|DESCRIBE)\b", re.IGNORECASE
)
_WORD: Final = re.compile(r"[^\s\"'{}()<>]+")
_CELL_LIMIT: Final = 400


def is_sparql(text: str) -> bool:
    """Tell whether ``text`` is a SPARQL query (starts with a query keyword or a prologue).

    Args:
        text: what the agent gave.

    Returns:
        ``True`` for SPARQL, ``False`` for keywords.
    """
    return _SPARQL_START.match(text) is not None


def _literal(word: str) -> str:
    escaped = word.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def keyword_query(text: str) -> str:
    """Build the SPARQL query for a keyword search.

    Args:
        text: keywords separated by spaces (quotes and brackets are ignored).

    Returns:
        A read-only SELECT of ``?about ?finding``; with no usable keyword, the most
        recent findings.
    """
    words = [w.lower() for w in _WORD.findall(text)][:8]
    filters = " ".join(
        f"FILTER(CONTAINS(LCASE(STR(?about)), {_literal(w)}) || "
        f"CONTAINS(LCASE(STR(?finding)), {_literal(w)}))"
        for w in words
    )
    return (
        f"PREFIX porter: <{PORTER_VOCAB}>\n"
        f"PREFIX prov: <{PROV_NS}>\n"
        "SELECT ?about ?finding WHERE { ?obs porter:about ?about ; porter:finding ?finding . "
        f"OPTIONAL {{ ?obs prov:generatedAtTime ?at }} {filters} }} "
        f"ORDER BY DESC(?at) LIMIT {KEYWORD_LIMIT}"
    )


def _cell(value: str) -> str:
    flat = " ".join(value.split())
    return flat if len(flat) <= _CELL_LIMIT else flat[:_CELL_LIMIT] + "..."


def render_rows(result: QueryResult) -> str:
    """Query rows as readable text, one numbered line per row.

    Args:
        result: the query's answer.

    Returns:
        ``N row(s) (vars):`` then ``1. var=value | var=value`` lines; or a sentence
        when there are none.
    """
    count = len(result.rows)
    if count == 0:
        cut = " (the answer was cut at the row limit)" if result.truncated else ""
        return "No results." + cut
    header = f"{count} row(s)"
    if result.variables:
        header += f" ({', '.join(result.variables)})"
    lines = [header + ":"]
    for index, row in enumerate(result.rows[:ROW_LIMIT], 1):
        names = result.variables or tuple(row)
        cells = [f"{n}={_cell(row[n])}" for n in names if n in row]
        lines.append(f"{index}. " + " | ".join(cells))
    if count > ROW_LIMIT:
        lines.append(f"[{count - ROW_LIMIT} more row(s) not shown; narrow the query]")
    if result.truncated:
        lines.append("[the answer was cut at the knowledge store's row limit]")
    return "\n".join(lines)
