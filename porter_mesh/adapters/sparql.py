"""The read-only SPARQL guard: what ``Recall`` may run, and within which bounds.

Theory of operation
-------------------
A query goes through three gates before any row is read.

1. **Refusals.** The text is tokenised with a SPARQL lexer (strings, long strings, IRIs,
   comments, prefixed names and variables are recognised as SPARQL defines them), so a
   keyword is only seen where the grammar would see one: ``"SERVICE"`` in a string or
   ``ex:LOAD`` as a prefixed name are data, not keywords. ``SERVICE`` is refused (both
   Oxigraph and rdflib would make the HTTP call), ``LOAD`` and every other update form
   are refused (the shard changes only through replicated records), and dataset
   clauses (``FROM``/``FROM NAMED``) are refused (the shard has one graph). A query
   over :data:`MAX_QUERY_CHARS` is refused before it is lexed.
2. **Syntax.** Oxigraph's own parser checks the text, with the prefixes ``porter``,
   ``as``, ``prov``, ``rdf``, ``rdfs`` and ``xsd`` predefined; its error becomes a
   :class:`QueryError` with ``reason="syntax"`` and the ``(line, column)``.
3. **Bounds.** Every query has a row limit and a deadline, and reaching either is
   reported, never silent: a result cut at the row limit says ``truncated=True``; a
   query past its deadline raises :class:`QueryTimeout`.

How the deadline is enforced
----------------------------
pyoxigraph cannot interrupt a running query from Python, so the guard picks one of two
ways to run each query, by its shape:

* **In process, streaming** (the hot path: no process hop, no copy). Used when the
  query is a plain group of triple patterns that all share variables (a connected basic
  graph pattern), optionally with ``FILTER``, ``OPTIONAL``, ``DISTINCT``, ``LIMIT`` and
  ``OFFSET``: Oxigraph evaluates these lazily, so rows are pulled one at a time and the
  clock is checked after each. *Bounded:* the time between two checks is at most one
  index-driven join step over connected patterns, in practice a scan of the shard.
  *Not bounded in theory:* a join whose intermediate results explode without producing
  rows; connectivity keeps that from the cross products that usually cause it.
* **Isolated, in a worker process** (hard bound). Everything else -- aggregates,
  ``ORDER BY``, ``GROUP BY``, sub-queries, ``UNION``, ``MINUS``, ``EXISTS``, property
  paths with ``*`` or ``+``, ``VALUES``, ``BIND``, disconnected patterns (cross
  products), anything the classifier does not recognise -- runs in a child process on a
  hard-linked checkpoint of the store (``Store.backup``; cheap, and immune to the live
  store's compactions). The parent waits until the deadline and then kills the child
  by its pid; the next isolated query starts a fresh one. Callers can also force
  isolation with ``isolate=True``.

The classification errs towards isolation: a query it cannot prove streaming pays the
process hop (a few milliseconds, plus a checkpoint after writes) rather than risk an
unbounded call. A store without a checkpoint (an in-memory one, in tests and benchmarks)
runs everything in process.
"""

from __future__ import annotations

import enum
import functools
import itertools
import logging
import math
import os
import re
import select
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

import msgpack
import pyoxigraph as ox

from porter_mesh.core.constants import AS_NS, PORTER_VOCAB, PROV_NS
from porter_mesh.errors import QueryError, QueryTimeout

__all__ = [
    "DEFAULT_DEADLINE",
    "DEFAULT_ROW_LIMIT",
    "MAX_QUERY_CHARS",
    "MAX_ROW_LIMIT",
    "PREFIXES",
    "CheckedQuery",
    "QueryEngine",
    "QueryForm",
    "QueryResult",
    "check_query",
    "term_text",
    "validate_query",
]

log = logging.getLogger("porter_mesh.sparql")

#: Prefixes every query may use without declaring them.
PREFIXES: Final[dict[str, str]] = {
    "porter": PORTER_VOCAB,
    "as": AS_NS,
    "prov": PROV_NS,
    "rdf": "http://www.w3.org/1999/02/22-rdf-syntax-ns#",
    "rdfs": "http://www.w3.org/2000/01/rdf-schema#",
    "xsd": "http://www.w3.org/2001/XMLSchema#",
}
#: Rows returned when the caller does not say. A Recall's answer goes into an agent's
#: context, where a hundred findings (some 10 KB of text) is already a lot; callers that
#: want more ask for it (``row_limit``, ``--limit``), and ``kg export`` dumps everything.
DEFAULT_ROW_LIMIT: Final = 100
#: Largest row limit a caller may ask for (use ``kg export`` for whole-graph dumps).
MAX_ROW_LIMIT: Final = 1_000_000
#: Seconds a query may run when the caller does not say.
DEFAULT_DEADLINE: Final = 10.0
#: Longest query text accepted.
MAX_QUERY_CHARS: Final = 64 * 1024


class QueryForm(enum.Enum):
    """The four read-only SPARQL query forms."""

    SELECT = "SELECT"
    ASK = "ASK"
    CONSTRUCT = "CONSTRUCT"
    DESCRIBE = "DESCRIBE"


# --- lexing -----------------------------------------------------------------------------

_NAME_START = "A-Za-z\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u02ff\u0370-\u037d\u037f-\u1fff\u200c-\u200d\u2070-\u218f\u2c00-\u2fef\u3001-\ud7ff\uf900-\ufdcf\ufdf0-\ufffd\U00010000-\U000effff"  # noqa: E501
_VAR_CHAR = _NAME_START + "_0-9\u00b7\u0300-\u036f\u203f-\u2040"
_NAME_CHAR = _VAR_CHAR + "\\-"
# Every pattern below is linear: no nested quantifiers, no look-ahead that rescans. A
# "run" is any stretch of name characters, dots, colons and escapes; _tokens() splits it
# into prefixed names, blank nodes, words and dots afterwards, in one pass.
_TOKEN_RE: Final = re.compile(
    rf"""
      (?P<ws>\s+)
    | (?P<comment>\#[^\n\r]*)
    | (?P<iri><[^<>"{{}}|^`\\\x00-\x20]*>)
    | (?P<string>\"\"\"(?:[^"\\]|\\.|"(?!""))*\"\"\"
               |'''(?:[^'\\]|\\.|'(?!''))*'''
               |"(?:[^"\\\n\r]|\\.)*"
               |'(?:[^'\\\n\r]|\\.)*')
    | (?P<var>[?$][{_VAR_CHAR}]+)
    | (?P<lang>@[A-Za-z]+(?:-[A-Za-z0-9]+)*)
    | (?P<number>[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?)
    | (?P<run>(?:[{_NAME_START}_:])(?:[{_NAME_CHAR}.:%]|\\[_~.\-!$&'()*+,;=/?#@%])*)
    | (?P<op>\^\^|&&|\|\||!=|<=|>=|[{{}}()\[\].,;*+\-/|^?!=<>])
    | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str
    text: str
    pos: int


def _tokens(text: str) -> list[_Token]:
    out: list[_Token] = []
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup or "other"
        if kind in ("ws", "comment"):
            continue
        if kind != "run":
            out.append(_Token(kind, m.group(), m.start()))
            continue
        run, start = m.group(), m.start()
        body = run.rstrip(".")  # a name never ends with a dot: it ends the triple
        if ":" in body:
            out.append(_Token("bnode" if body.startswith("_:") else "pname", body, start))
        else:
            offset = start
            for index, piece in enumerate(body.split(".")):
                if index:
                    out.append(_Token("op", ".", offset))
                    offset += 1
                if piece:
                    out.append(_Token("word", piece, offset))
                    offset += len(piece)
        out.extend(_Token("op", ".", start + i) for i in range(len(body), len(run)))
    return out


def _line_col(text: str, pos: int) -> tuple[int, int]:
    line = text.count("\n", 0, pos) + 1
    return line, pos - (text.rfind("\n", 0, pos) + 1) + 1


_FORMS: Final = frozenset(f.value for f in QueryForm)
_UPDATE_WORDS: Final = frozenset(
    {"INSERT", "DELETE", "CLEAR", "DROP", "CREATE", "ADD", "MOVE", "COPY", "WITH", "USING"}
)
# Words after which the query is not provably streaming (see the module docstring).
_HEAVY_WORDS: Final = frozenset({
    "ORDER", "GROUP", "HAVING", "COUNT", "SUM", "MIN", "MAX", "AVG", "SAMPLE",
    "GROUP_CONCAT", "MINUS", "EXISTS", "NOT", "UNION", "GRAPH", "VALUES", "BIND",
    "LATERAL", "SERVICE",
})


@dataclass(frozen=True, slots=True)
class CheckedQuery:
    """A query that passed the refusal gate.

    Attributes:
        text: the query text.
        form: SELECT, ASK, CONSTRUCT or DESCRIBE.
        streaming: ``True`` when it can run in process with per-row deadline checks;
            ``False`` when it must run isolated to be bounded.
        star: for ``SELECT *``, its variables in the order they first appear in the
            text: the engine lists them in an order of its own, and the columns follow
            the query instead. ``None`` for any other projection.
    """

    text: str
    form: QueryForm
    streaming: bool
    star: tuple[str, ...] | None = None


def _refuse(text: str, token: _Token, reason: str, message: str) -> QueryError:
    line, col = _line_col(text, token.pos)
    return QueryError(f"{message} (line {line}, column {col})", reason=reason,
                      position=(line, col))


@functools.lru_cache(maxsize=512)
def check_query(text: str) -> CheckedQuery:
    """Apply the refusal gate and classify a query (cached per text).

    Args:
        text: the SPARQL text.

    Returns:
        The checked query. Its syntax is checked later, by the engine's parser.

    Raises:
        QueryError: ``reason`` is ``"too-long"``, ``"service"``, ``"load"``,
            ``"update"``, ``"dataset"`` or ``"syntax"`` (no query form found, or a
            character that cannot start any SPARQL token).
    """
    if not isinstance(text, str) or not text.strip():
        raise QueryError("the query is empty; give a SELECT, ASK, CONSTRUCT or DESCRIBE query",
                         reason="syntax", position=(1, 1))
    if len(text) > MAX_QUERY_CHARS:
        raise QueryError(f"the query is {len(text)} characters; the limit is {MAX_QUERY_CHARS}",
                         reason="too-long")
    tokens = _tokens(text)
    words = [(t, t.text.upper()) for t in tokens if t.kind == "word"]
    for token, word in words:
        if word == "SERVICE":
            raise _refuse(text, token, "service",
                          "SERVICE is refused: a Recall never makes network calls; query the "
                          "local shard only")
    for token, word in words:
        if word == "LOAD":
            raise _refuse(text, token, "load",
                          "LOAD is refused: the knowledge graph changes only through "
                          "Remember and Delete, which replicate")
    for token, word in words:
        if word in _UPDATE_WORDS:
            raise _refuse(text, token, "update",
                          f"{word} is a SPARQL update and updates are refused: Recall is "
                          "read-only; use Remember to add and Delete to retract observations")
    for token, word in words:
        if word == "FROM":
            raise _refuse(text, token, "dataset",
                          "FROM / FROM NAMED are refused: the shard is one graph, query it "
                          "without a dataset clause")
    for token in tokens:
        if token.kind == "other":
            raise _refuse(text, token, "syntax",
                          f"SPARQL syntax error: unexpected character {token.text!r}")
    form = next((QueryForm(w) for _, w in words if w in _FORMS), None)
    if form is None:
        raise QueryError("SPARQL syntax error: no SELECT, ASK, CONSTRUCT or DESCRIBE found",
                         reason="syntax", position=(1, 1))
    return CheckedQuery(text, form, _is_streaming(tokens), _star_variables(tokens))


def _star_variables(tokens: list[_Token]) -> tuple[str, ...] | None:
    """The variables of a ``SELECT [DISTINCT|REDUCED] *`` in order of first appearance;
    ``None`` when the query names its columns (or is no SELECT)."""
    words = iter(tokens)
    for token in words:
        if token.kind == "word" and token.text.upper() == "SELECT":
            break
    else:
        return None
    after = next(words, None)
    if after is not None and after.kind == "word" and after.text.upper() in ("DISTINCT",
                                                                              "REDUCED"):
        after = next(words, None)
    if after is None or after.text != "*":
        return None
    return tuple(dict.fromkeys(t.text[1:] for t in tokens if t.kind == "var"))


def _in_query_order(checked: CheckedQuery, variables: tuple[str, ...],
                    rows: tuple[tuple[Any, ...], ...]
                    ) -> tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]]:
    """The columns of a ``SELECT *`` result put in the query's order (see
    :attr:`CheckedQuery.star`); any other result as it is."""
    if checked.star is None or set(checked.star) != set(variables):
        return variables, rows
    index = [variables.index(name) for name in checked.star]
    return checked.star, tuple(tuple(row[i] for i in index) for row in rows)


def _undeclared_prefix(text: str, prefixes: Mapping[str, str]) -> str | None:
    """The first prefix ``text`` uses that neither ``prefixes`` nor its own ``PREFIX``
    declarations define, or None."""
    tokens = _tokens(text)
    declared = {nxt.text[:-1] for tok, nxt in itertools.pairwise(tokens)
                if tok.kind == "word" and tok.text.upper() == "PREFIX" and nxt.kind == "pname"}
    for token in tokens:
        if token.kind == "pname":
            name = token.text.split(":", 1)[0]
            if name not in prefixes and name not in declared:
                return name
    return None


# --- classification ---------------------------------------------------------------------


class _NotSimple(Exception):
    """The query leaves the shape the streaming path accepts."""


class _Shape:
    """A tiny recursive-descent reader of the streaming subset (see module docstring)."""

    def __init__(self, tokens: list[_Token]) -> None:
        self.toks = tokens
        self.i = 0
        self.patterns: list[set[str]] = []

    def peek(self) -> _Token | None:
        return self.toks[self.i] if self.i < len(self.toks) else None

    def take(self) -> _Token:
        tok = self.peek()
        if tok is None:
            raise _NotSimple
        self.i += 1
        return tok

    def peek_kind(self) -> str:
        tok = self.peek()
        return "" if tok is None else tok.kind

    def is_op(self, text: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "op" and tok.text == text

    def is_word(self, *words: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == "word" and tok.text.upper() in words

    def skip_balanced(self, open_: str, close: str) -> None:
        if not self.is_op(open_):
            raise _NotSimple
        depth = 0
        while True:
            tok = self.take()
            if tok.kind == "op" and tok.text == open_:
                depth += 1
            elif tok.kind == "op" and tok.text == close:
                depth -= 1
                if depth == 0:
                    return

    def term(self, variables: set[str], *, verb: bool = False) -> None:
        tok = self.take()
        if tok.kind in ("var", "bnode"):
            variables.add(tok.text[1:] if tok.kind == "var" else tok.text)
        elif tok.kind in ("iri", "pname") or (verb and tok.kind == "word" and tok.text == "a"):
            pass
        elif not verb and tok.kind == "string":
            if self.peek_kind() == "lang":
                self.take()
            elif self.is_op("^^"):
                self.take()
                if self.take().kind not in ("iri", "pname"):
                    raise _NotSimple
        elif not verb and (
            tok.kind == "number" or (tok.kind == "word" and tok.text in ("true", "false"))
        ):
            pass
        else:
            raise _NotSimple

    def triples(self) -> None:
        variables: set[str] = set()
        self.term(variables)
        while True:
            self.term(variables, verb=True)
            self.term(variables)
            while self.is_op(","):
                self.take()
                self.term(variables)
            if not self.is_op(";"):
                break
            while self.is_op(";"):
                self.take()
            if self.is_op(".") or self.is_op("}"):
                break
        self.patterns.append(variables)

    def group(self) -> None:
        if not self.is_op("{"):
            raise _NotSimple
        self.take()
        while not self.is_op("}"):
            if self.is_op("."):
                self.take()
            elif self.is_word("FILTER"):
                self.take()
                if self.peek_kind() == "word":
                    self.take()  # a built-in call such as CONTAINS(...)
                self.skip_balanced("(", ")")
            elif self.is_word("OPTIONAL"):
                self.take()
                self.group()
            else:
                self.triples()
        self.take()


def _is_streaming(tokens: list[_Token]) -> bool:
    words = [t.text.upper() for t in tokens if t.kind == "word"]
    if sum(1 for w in words if w in _FORMS) != 1 or any(w in _HEAVY_WORDS for w in words):
        return False
    for index, tok in enumerate(tokens):
        if tok.kind == "op" and tok.text in ("*", "+"):
            before = tokens[index - 1].text.upper() if index else ""
            if tok.text == "+" or before not in ("SELECT", "DISTINCT", "REDUCED", "DESCRIBE"):
                return False  # a transitive property path (or arithmetic: be safe)
    shape = _Shape(tokens)
    try:
        while shape.is_word("BASE", "PREFIX"):
            shape.take()
            shape.take()
            if shape.peek_kind() == "iri":
                shape.take()
        form = shape.take().text.upper()
        if form == "CONSTRUCT" and shape.is_op("{"):
            shape.skip_balanced("{", "}")
        if form == "DESCRIBE":
            while shape.peek() is not None and not shape.is_op("{") and not shape.is_word(
                "WHERE", "LIMIT", "OFFSET"
            ):
                shape.take()
            if shape.peek() is None:
                return True
        while not shape.is_op("{"):
            if shape.is_op("("):
                shape.skip_balanced("(", ")")  # a projection expression
            else:
                shape.take()
        shape.group()
        while shape.is_word("LIMIT", "OFFSET"):
            shape.take()
            if shape.take().kind != "number":
                return False
        if shape.peek() is not None:
            return False
    except _NotSimple:
        return False
    return _connected(shape.patterns)


def _connected(patterns: list[set[str]]) -> bool:
    groups = [p for p in patterns if p]
    if not groups:
        return True
    reached = set(groups[0])
    pending = groups[1:]
    changed = True
    while pending and changed:
        changed = False
        for group in list(pending):
            if group & reached:
                reached |= group
                pending.remove(group)
                changed = True
    return not pending


# --- results ----------------------------------------------------------------------------


def term_text(term: Any) -> str:
    """The plain text of an RDF term: an IRI's IRI, a literal's lexical form.

    Args:
        term: a pyoxigraph term (or ``None`` for an unbound variable).

    Returns:
        The text, ``""`` for ``None``.
    """
    if term is None:
        return ""
    if isinstance(term, ox.BlankNode):
        return "_:" + term.value
    if isinstance(term, ox.Triple):
        return str(term)
    return str(term.value)


@dataclass(frozen=True, slots=True)
class QueryResult:
    """What a query returned, and whether it was cut.

    Attributes:
        form: the query form.
        variables: SELECT variables; ``("subject", "predicate", "object")`` for CONSTRUCT
            and DESCRIBE; empty for ASK.
        rows: pyoxigraph terms (``None`` where a variable is unbound), at most
            ``row_limit`` rows.
        boolean: the answer of an ASK, else ``None``.
        truncated: ``True`` when more rows existed than ``row_limit`` (they were cut).
        row_limit: the limit applied.
        elapsed: seconds spent.
        isolated: whether the query ran in the worker process.
    """

    form: QueryForm
    variables: tuple[str, ...]
    rows: tuple[tuple[Any, ...], ...]
    boolean: bool | None
    truncated: bool
    row_limit: int
    elapsed: float
    isolated: bool

    def items(self) -> list[dict[str, str]]:
        """Rows as plain ``{variable: text}`` maps (unbound variables left out).

        This is the shape of the profile's ``Recall`` result items, e.g.
        ``{"about": "urn:porter:file:server.ts", "finding": "..."}``.
        """
        return [
            {name: term_text(value) for name, value in zip(self.variables, row, strict=True)
             if value is not None}
            for row in self.rows
        ]


# --- the engine -------------------------------------------------------------------------

_SYNTAX_RE: Final = re.compile(r"error at (\d+):(\d+): (.*)", re.DOTALL)


def _syntax_error(exc: SyntaxError, query: str,
                  prefixes: Mapping[str, str] = PREFIXES) -> QueryError:
    text = str(exc)
    m = _SYNTAX_RE.match(text)
    if m is None:
        return QueryError(f"SPARQL syntax error: {text[:300]}", reason="syntax")
    line, col, detail = int(m.group(1)), int(m.group(2)), " ".join(m.group(3).split())
    unknown = _undeclared_prefix(query, prefixes) if "Prefix not found" in detail else None
    if unknown is not None:
        # The parser lists every character it could have taken instead, which says
        # nothing to a person: name the prefix and the declaration it needs.
        return QueryError(
            f"unknown prefix {unknown}: declare it with PREFIX {unknown}: <...> (line "
            f"{line}, column {col}; predefined prefixes: {', '.join(PREFIXES)})",
            reason="syntax", position=(line, col))
    if len(detail) > 160:
        detail = detail[:160] + "..."
    return QueryError(
        f"SPARQL syntax error at line {line}, column {col}: {detail} (predefined prefixes: "
        f"{', '.join(PREFIXES)})",
        reason="syntax", position=(line, col),
    )


def _check_limits(row_limit: int, deadline: float) -> None:
    if type(row_limit) is not int or not 1 <= row_limit <= MAX_ROW_LIMIT:
        raise QueryError(f"row limit must be 1..{MAX_ROW_LIMIT}, got {row_limit!r}",
                         reason="bad-limit")
    if not 0 < deadline <= 3600:
        raise QueryError(f"deadline must be 0-3600 seconds, got {deadline!r}",
                         reason="bad-deadline")


_EMPTY_STORE: ox.Store | None = None


def _parse_only(text: str, prefixes: Mapping[str, str]) -> None:
    """Let Oxigraph's parser check ``text`` (against an empty store: nothing runs)."""
    global _EMPTY_STORE
    if _EMPTY_STORE is None:
        _EMPTY_STORE = ox.Store()
    try:
        _EMPTY_STORE.query(text, prefixes=dict(prefixes))
    except SyntaxError as exc:
        raise _syntax_error(exc, text, prefixes) from None


def validate_query(text: str, *, row_limit: int = DEFAULT_ROW_LIMIT,
                   deadline: float = DEFAULT_DEADLINE) -> CheckedQuery:
    """Check a query as :meth:`QueryEngine.query` would, without a shard: the limits, the
    refusal gate and the parser. Cheap; a command checks its query before joining a mesh.

    Returns:
        The checked query.

    Raises:
        QueryError: refused, a syntax error, or a limit out of range.
    """
    _check_limits(row_limit, deadline)
    checked = check_query(text)
    _parse_only(checked.text, PREFIXES)
    return checked


def _collect(result: Any, row_limit: int, stop_at: float = math.inf,
             late: Callable[[int], None] | None = None) -> tuple[
    QueryForm | None, tuple[str, ...], list[tuple[Any, ...]], bool | None, bool
]:
    """Read rows lazily; past ``stop_at`` (monotonic) after a row, ``late(rows_so_far)``
    is called (it raises). The clock is read in the loop, not through a call per row:
    at the shard's row limit the loop is a tenth of a large store's query time."""
    rows: list[tuple[Any, ...]] = []
    truncated = False
    if isinstance(result, ox.QueryBoolean):
        return QueryForm.ASK, (), rows, bool(result), False
    clock, keep = time.monotonic, rows.append
    if isinstance(result, ox.QuerySolutions):
        variables = tuple(v.value for v in result.variables)
        for solution in result:
            if len(rows) == row_limit:
                truncated = True
                break
            keep(tuple(solution))
            if late is not None and clock() > stop_at:
                late(len(rows))
        return None, variables, rows, None, truncated
    for triple in result:
        if len(rows) == row_limit:
            truncated = True
            break
        keep((triple.subject, triple.predicate, triple.object))
        if late is not None and clock() > stop_at:
            late(len(rows))
    return None, ("subject", "predicate", "object"), rows, None, truncated


class QueryEngine:
    """Runs checked queries on a pyoxigraph store within a row limit and a deadline.

    Args:
        store: the store to query (its default graph; named graphs are hidden).
        checkpoint: returns the path of a current, consistent on-disk copy of the store
            for isolated queries, or ``None`` when the store has none (then everything
            runs in process).
    """

    def __init__(self, store: ox.Store, *, checkpoint: Callable[[], str] | None = None) -> None:
        self._store: ox.Store | None = store
        self._checkpoint = checkpoint
        self._worker: _Worker | None = None
        self._lock = threading.Lock()  # one isolated query at a time per worker

    def query(
        self,
        text: str,
        *,
        row_limit: int = DEFAULT_ROW_LIMIT,
        deadline: float = DEFAULT_DEADLINE,
        isolate: bool | None = None,
        prefixes: Mapping[str, str] | None = None,
        store: ox.Store | None = None,
    ) -> QueryResult:
        """Run a read-only query.

        Args:
            text: SPARQL; the prefixes in :data:`PREFIXES` are predefined.
            row_limit: most rows returned; more are cut and ``truncated`` is set.
            deadline: seconds before the query is stopped.
            isolate: ``True`` forces the worker process, ``False`` forces in-process
                (unbounded for non-streaming queries: only for trusted callers), ``None``
                lets the classifier choose.
            prefixes: more prefixes to predefine (those of :data:`PREFIXES` win).
            store: run it in process on this store instead of the engine's (a shard
                answering from a copy of its index while the index loads); isolated
                queries still run on the checkpoint.

        Returns:
            The result.

        Raises:
            QueryError: refused, or a syntax error (see :func:`check_query`).
            QueryTimeout: the deadline passed; no partial result is returned.
        """
        _check_limits(row_limit, deadline)
        if self._store is None:
            raise QueryError("the query engine is closed", reason="closed")
        started = time.monotonic()
        checked = check_query(text)
        known = PREFIXES if not prefixes else {**prefixes, **PREFIXES}
        use_worker = (not checked.streaming) if isolate is None else isolate
        if use_worker and self._checkpoint is not None:
            return self._isolated(checked, known, row_limit, started, started + deadline)
        return self._in_process(checked, known, row_limit, started, started + deadline,
                                store)

    def _in_process(
        self,
        checked: CheckedQuery,
        prefixes: Mapping[str, str],
        row_limit: int,
        started: float,
        stop_at: float,
        store: ox.Store | None = None,
    ) -> QueryResult:
        def late(count: int) -> None:
            if time.monotonic() > stop_at:
                raise QueryTimeout(
                    f"query stopped at its deadline of {stop_at - started:.3g} s after "
                    f"{count} rows; narrow it or raise the deadline",
                    reason="deadline",
                )

        if self._store is None:
            raise QueryError("the query engine is closed", reason="closed")
        if store is None:
            store = self._store
        try:
            result = store.query(checked.text, prefixes=dict(prefixes), named_graphs=[])
            late(0)
            form, variables, rows, boolean, truncated = _collect(result, row_limit, stop_at,
                                                                 late)
        except SyntaxError as exc:
            raise _syntax_error(exc, checked.text, prefixes) from None
        except QueryError:
            raise  # our own QueryTimeout is also an OSError (via TimeoutError)
        except OSError as exc:
            raise QueryError(f"the store failed while answering: {exc}", reason="store") from None
        columns, ordered = _in_query_order(checked, variables, tuple(rows))
        return QueryResult(form or checked.form, columns, ordered, boolean, truncated,
                           row_limit, time.monotonic() - started, False)

    def _isolated(
        self,
        checked: CheckedQuery,
        prefixes: Mapping[str, str],
        row_limit: int,
        started: float,
        stop_at: float,
    ) -> QueryResult:
        assert self._checkpoint is not None
        _parse_only(checked.text, prefixes)
        # One isolated query at a time per worker; waiting for the worker counts against
        # this query's deadline too.
        if not self._lock.acquire(timeout=max(0.0, stop_at - time.monotonic())):
            raise QueryTimeout(
                f"query stopped at its deadline of {stop_at - started:.3g} s while waiting "
                "for another isolated query to finish; raise the deadline",
                reason="deadline",
            )
        try:
            path = self._checkpoint()
            if self._worker is not None and not self._worker.alive():
                self._worker.kill()  # reap it and close its pipes
                self._worker = None
            if self._worker is None:
                self._worker = _Worker()
            worker = self._worker
            try:
                reply = worker.ask({"db": path, "q": checked.text, "n": row_limit,
                                    "p": dict(prefixes)}, stop_at)
            except QueryTimeout:
                worker.kill()
                self._worker = None
                raise QueryTimeout(
                    f"query stopped at its deadline of {stop_at - started:.3g} s (it ran "
                    "isolated and its worker process was killed); narrow it or raise the "
                    "deadline",
                    reason="deadline",
                ) from None
            except QueryError:
                worker.kill()  # it died or spoke garbage: start afresh next time
                self._worker = None
                raise
        finally:
            self._lock.release()
        if not reply.get("ok"):
            if reply.get("syntax"):
                raise _syntax_error(SyntaxError(reply.get("err", "")), checked.text, prefixes)
            raise QueryError(f"query failed: {reply.get('err')}", reason="store")
        rows = tuple(tuple(_term_in(v) for v in row) for row in reply["rows"])
        boolean = reply.get("bool")
        form = QueryForm.ASK if boolean is not None else checked.form
        columns, ordered = _in_query_order(checked, tuple(reply["vars"]), rows)
        return QueryResult(form, columns, ordered, boolean, bool(reply["cut"]),
                           row_limit, time.monotonic() - started, True)

    def stop_worker(self) -> None:
        """Stop the worker process, if one is running (the next isolated query starts one)."""
        with self._lock:
            if self._worker is not None:
                self._worker.stop()
                self._worker = None

    def use_store(self, store: ox.Store) -> None:
        """Answer from ``store`` from now on (the shard's index moved to disk)."""
        self._store = store

    def close(self) -> None:
        """Stop the worker process, if one is running, and let go of the store."""
        self.stop_worker()
        self._store = None


# --- the isolated worker ----------------------------------------------------------------

_FRAME = struct.Struct(">I")
_MAX_FRAME = 512 * 1024 * 1024


def _term_out(term: Any) -> Any:
    if term is None:
        return None
    if isinstance(term, ox.NamedNode):
        return ["i", term.value]
    if isinstance(term, ox.BlankNode):
        return ["b", term.value]
    if isinstance(term, ox.Literal):
        return ["l", term.value, term.datatype.value, term.language]
    return ["t", _term_out(term.subject), _term_out(term.predicate), _term_out(term.object)]


def _term_in(item: Any) -> Any:
    if item is None:
        return None
    tag = item[0]
    if tag == "i":
        return ox.NamedNode(item[1])
    if tag == "b":
        return ox.BlankNode(item[1])
    if tag == "l":
        if item[3]:
            return ox.Literal(item[1], language=item[3])
        return ox.Literal(item[1], datatype=ox.NamedNode(item[2]))
    return ox.Triple(_term_in(item[1]), _term_in(item[2]), _term_in(item[3]))


class _Worker:
    """A child process answering isolated queries; killed (by pid) at a deadline."""

    def __init__(self) -> None:
        # The child must import this package even when it is not installed (a checkout
        # on PYTHONPATH, or the current directory): put its root first on the path.
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "porter_mesh.adapters.sparql"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            close_fds=True, env=env,
        )

    def alive(self) -> bool:
        return self._proc.poll() is None

    def ask(self, request: dict[str, Any], stop_at: float) -> dict[str, Any]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        data = msgpack.packb(request, use_bin_type=True)
        try:
            self._proc.stdin.write(_FRAME.pack(len(data)) + data)
            self._proc.stdin.flush()
        except OSError:
            raise QueryError("the query worker process died; try again",
                             reason="worker") from None
        fd = self._proc.stdout.fileno()
        header = self._read(fd, _FRAME.size, stop_at)
        (size,) = _FRAME.unpack(header)
        reply = msgpack.unpackb(self._read(fd, size, stop_at), raw=False)
        if not isinstance(reply, dict):
            raise QueryError("the query worker sent a malformed reply", reason="worker")
        return reply

    @staticmethod
    def _read(fd: int, size: int, stop_at: float) -> bytes:
        chunks: list[bytes] = []
        got = 0
        while got < size:
            remaining = stop_at - time.monotonic()
            if remaining <= 0:
                raise QueryTimeout("deadline", reason="deadline")
            ready, _, _ = select.select([fd], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(fd, min(size - got, 1 << 20))
            if not chunk:
                raise QueryError("the query worker process died while answering (out of "
                                 "memory?); narrow the query", reason="worker")
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def kill(self) -> None:
        if self._proc.poll() is None:
            os.kill(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._close_pipes()

    def stop(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()  # end of input: the worker exits by itself
                self._proc.wait(timeout=2.0)
            except (OSError, subprocess.TimeoutExpired):
                os.kill(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._close_pipes()

    def _close_pipes(self) -> None:
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


def _frames(stream: Any) -> Iterator[dict[str, Any]]:
    while True:
        header = stream.read(_FRAME.size)
        if len(header) < _FRAME.size:
            return
        (size,) = _FRAME.unpack(header)
        if size > _MAX_FRAME:
            return
        yield msgpack.unpackb(stream.read(size), raw=False)


def _worker_main() -> None:
    """Answer isolated queries read from stdin until it closes (run in the child)."""
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    store: ox.Store | None = None
    opened = ""
    for request in _frames(stdin):
        reply: dict[str, Any]
        try:
            if request["db"] != opened:
                store = None
                store = ox.Store.read_only(request["db"])
                opened = request["db"]
            assert store is not None
            result = store.query(request["q"], prefixes=request["p"], named_graphs=[])
            _, variables, rows, boolean, cut = _collect(result, int(request["n"]))
            reply = {"ok": True, "vars": list(variables), "bool": boolean, "cut": cut,
                     "rows": [[_term_out(t) for t in row] for row in rows]}
        except SyntaxError as exc:
            reply = {"ok": False, "syntax": True, "err": str(exc)}
        except Exception as exc:  # reported to the parent, which raises QueryError
            reply = {"ok": False, "err": f"{type(exc).__name__}: {exc}"}
        data = msgpack.packb(reply, use_bin_type=True)
        stdout.write(_FRAME.pack(len(data)) + data)
        stdout.flush()


if __name__ == "__main__":
    _worker_main()
