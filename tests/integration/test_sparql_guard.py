"""The read-only SPARQL guard on a real shard: refusals, syntax, row limits, deadlines."""

from __future__ import annotations

import pathlib
import select
import socket
import time
from collections.abc import Iterator

import pyoxigraph as ox
import pytest

from porter_mesh.adapters.shard import Durability, Shard
from porter_mesh.adapters.sparql import MAX_QUERY_CHARS, QueryEngine, QueryForm, check_query
from porter_mesh.errors import QueryError, QueryTimeout

PROFILE_QUERY = (
    "SELECT ?about ?finding WHERE { ?obs <https://porter.chapeaux.io/vocab#about> ?about ; "
    "<https://porter.chapeaux.io/vocab#finding> ?finding }"
)
#: Three unconnected patterns: a cross product far too large to finish.
RUNAWAY = "SELECT (COUNT(*) AS ?n) WHERE { ?a ?b ?c . ?d ?e ?f . ?g ?h ?i }"


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shard]:
    s = Shard(tmp_path_factory.mktemp("guard") / "shard", agent="worker-1",
              durability=Durability.OS)
    for i in range(300):
        s.remember(f"urn:porter:file:f{i % 30}.ts", f"finding {i}",
                   severity="high" if i % 3 == 0 else "low")
    yield s
    s.close()


@pytest.fixture(autouse=True)
def stop_worker(request: pytest.FixtureRequest) -> Iterator[None]:
    """Each test ends with no query worker left (the leak check runs after this)."""
    yield
    if "shard" in request.fixturenames:
        request.getfixturevalue("shard").stop_query_worker()


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP listener on loopback that a SERVICE call would have to connect to."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    yield srv
    srv.close()


def _no_connection(srv: socket.socket) -> bool:
    readable, _, _ = select.select([srv], [], [], 0.2)
    return not readable


# --- refusals ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "reason"),
    [
        ("INSERT DATA { <urn:a> <urn:b> <urn:c> }", "update"),
        ("DELETE WHERE { ?s ?p ?o }", "update"),
        ("PREFIX ex: <http://e/> DELETE { ?s ?p ?o } INSERT { ?s ?p 1 } WHERE { ?s ?p ?o }",
         "update"),
        ("CLEAR DEFAULT", "update"),
        ("DROP ALL", "update"),
        ("WITH <urn:g> DELETE { ?s ?p ?o } WHERE { ?s ?p ?o }", "update"),
        ("LOAD <http://127.0.0.1:9/data.ttl>", "load"),
        ("load silent <http://127.0.0.1:9/data.ttl> into graph <urn:g>", "load"),
        ("SELECT * WHERE { SERVICE <http://127.0.0.1:9/sparql> { ?s ?p ?o } }", "service"),
        ("select * where { ?x ?y ?z optional { service silent <http://127.0.0.1:9/> "
         "{ ?x ?q ?r } } }", "service"),
        ("SELECT * WHERE { { SELECT ?s WHERE { SERVICE ?endpoint { ?s ?p ?o } } } }",
         "service"),
        ("SELECT * WHERE { SERVICE# a comment\n<http://127.0.0.1:9/> { ?s ?p ?o } }",
         "service"),
        ("SELECT * FROM <urn:porter:shard:meta> WHERE { ?s ?p ?o }", "dataset"),
        ("SELECT * FROM NAMED <urn:g> WHERE { ?s ?p ?o }", "dataset"),
        ("x" * (MAX_QUERY_CHARS + 1), "too-long"),
        ("", "syntax"),
        ("hello world", "syntax"),
    ],
)
def test_refused_query_kinds(shard: Shard, query: str, reason: str) -> None:
    before = shard.stats()
    with pytest.raises(QueryError) as info:
        shard.query(query)
    assert info.value.reason == reason
    assert len(str(info.value)) > 20  # a sentence, not a code
    assert shard.stats() == before


def test_service_is_never_contacted(shard: Shard, listener: socket.socket) -> None:
    port = listener.getsockname()[1]
    endpoint = f"<http://127.0.0.1:{port}/sparql>"
    for isolate in (None, True, False):
        with pytest.raises(QueryError, match="SERVICE is refused"):
            shard.query(f"SELECT * WHERE {{ SERVICE {endpoint} {{ ?s ?p ?o }} }}",
                        isolate=isolate)
    with pytest.raises(QueryError, match="SERVICE"):
        shard.graph.query(f"ASK {{ SERVICE {endpoint} {{ ?s ?p ?o }} }}")
    assert _no_connection(listener)


def test_service_refusal_points_at_the_keyword(shard: Shard) -> None:
    with pytest.raises(QueryError) as info:
        shard.query("SELECT *\nWHERE {\n  SERVICE <http://127.0.0.1:9/> { ?s ?p ?o } }")
    assert info.value.position == (3, 3)


@pytest.mark.parametrize(
    "query",
    [
        "SELECT ?s WHERE { ?s porter:finding 'SERVICE <http://127.0.0.1:9/> LOAD INSERT' }",
        'SELECT ?s WHERE { ?s porter:finding """multi\nline SERVICE DELETE""" }',
        "PREFIX ex: <http://example.org/> SELECT ?s WHERE { ?s ex:SERVICE ex:LOAD }",
        "SELECT ?s WHERE { ?s <http://example.org/SERVICE/insert#LOAD> ?o }",
        "SELECT ?insert ?load WHERE { ?insert porter:about ?load } # SERVICE in a comment",
    ],
)
def test_keywords_as_data_are_not_refused(shard: Shard, query: str) -> None:
    shard.query(query)  # runs: the words are strings, IRIs, names or comments


# --- syntax --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "line"),
    [
        ("SELECT * WHERE {\n  ?s ?p ?o .\n  FILTER( }", 3),
        ("SELECT ?x WHERE { ?x nope:about ?y }", 1),
        ("SELECT (COUNT(*) AS ?n) WHERE {\n ?s ?p }", 2),  # the isolated path too
        ("ASK {", 1),
    ],
)
def test_syntax_errors_carry_their_position(shard: Shard, query: str, line: int) -> None:
    with pytest.raises(QueryError) as info:
        shard.query(query)
    assert info.value.reason == "syntax"
    assert info.value.position is not None and info.value.position[0] == line
    assert f"line {line}, column {info.value.position[1]}" in str(info.value)


@pytest.mark.parametrize("isolate", [False, True])
def test_an_unknown_prefix_is_named_with_its_declaration(shard: Shard, isolate: bool) -> None:
    query = ("PREFIX ex: <urn:ex:>\nSELECT ?x WHERE {\n ?x ex:a ?y .\n ?y nope:about ?z }")
    with pytest.raises(QueryError) as info:
        shard.query(query, isolate=isolate)
    text = str(info.value)
    assert text.startswith("unknown prefix nope: declare it with PREFIX nope: <...> "
                           "(line 4, column "), text
    assert "predefined prefixes: porter, as, prov, rdf, rdfs, xsd" in text
    assert "expected one of" not in text and "'0' ..= '9'" not in text  # no parser innards
    assert info.value.reason == "syntax" and info.value.position is not None
    assert info.value.position[0] == 4


@pytest.mark.parametrize("isolate", [False, True])
@pytest.mark.parametrize(("query", "columns"), [
    ("SELECT * WHERE { ?s porter:about ?o ; porter:finding 'finding 7' }", ("s", "o")),
    ("SELECT * WHERE { ?s ?p ?o . ?s porter:finding 'finding 7' } LIMIT 1", ("s", "p", "o")),
    ("SELECT DISTINCT * WHERE { ?obs porter:finding 'finding 7' ; porter:about ?about }",
     ("obs", "about")),
])
def test_select_star_keeps_the_querys_column_order(shard: Shard, query: str,
                                                   columns: tuple[str, ...],
                                                   isolate: bool) -> None:
    result = shard.query(query, isolate=isolate)
    assert result.variables == columns
    assert result.rows, query
    by_name = result.items()[0]
    assert list(by_name) == list(columns)
    if "about" in columns:
        assert by_name["about"] == "urn:porter:file:f7.ts"


def test_predefined_prefixes(shard: Shard) -> None:
    result = shard.query(
        "SELECT ?f WHERE { ?o a porter:Observation ; porter:finding ?f ; "
        "prov:generatedAtTime ?t FILTER(datatype(?t) = xsd:dateTime) } LIMIT 3")
    assert len(result.rows) == 3
    assert shard.query("ASK { ?o rdf:type porter:Observation }").boolean is True
    assert shard.query("SELECT ?x WHERE { ?x rdfs:label ?l . ?x as:name ?l }").rows == ()


# --- forms and results ------------------------------------------------------------------------


def test_all_four_forms(shard: Shard) -> None:
    ask = shard.query("ASK { ?o porter:about 'urn:porter:file:f1.ts' }")
    assert ask.form is QueryForm.ASK and ask.boolean is True
    assert shard.query("ASK { ?o porter:about 'nothing' }").boolean is False
    built = shard.query("CONSTRUCT { ?o porter:about ?a } WHERE { ?o porter:about ?a ; "
                        "porter:finding 'finding 7' }")
    assert built.form is QueryForm.CONSTRUCT and len(built.rows) == 1
    subject = built.rows[0][0]
    described = shard.query(f"DESCRIBE <{subject.value}>")
    assert described.form is QueryForm.DESCRIBE and len(described.rows) == 6


def test_named_graphs_are_hidden(shard: Shard) -> None:
    assert shard.query("SELECT * WHERE { GRAPH ?g { ?s ?p ?o } }").rows == ()


def test_isolated_queries_return_the_same_answers(shard: Shard) -> None:
    grouped = shard.query("SELECT ?sev (COUNT(*) AS ?n) WHERE { ?o porter:severity ?sev } "
                          "GROUP BY ?sev ORDER BY ?sev")
    assert grouped.isolated
    assert grouped.items() == [{"sev": "high", "n": "100"}, {"sev": "low", "n": "200"}]
    # Without ORDER BY the order of rows is the store's own (the in-memory index and the
    # on-disk copy an isolated query reads may differ): compare the rows as sets.
    high = "SELECT ?a ?f WHERE { ?o porter:about ?a ; porter:finding ?f ; porter:severity 'high' }"
    forced = shard.query(high, isolate=True, row_limit=1000)
    in_process = shard.query(high, row_limit=1000)
    assert forced.isolated and not in_process.isolated and len(forced.rows) == 100
    assert sorted(map(str, forced.rows)) == sorted(map(str, in_process.rows))


# --- row limit ---------------------------------------------------------------------------------


def test_row_limit_cuts_and_says_so(shard: Shard) -> None:
    cut = shard.query(PROFILE_QUERY, row_limit=10)
    assert len(cut.rows) == 10 and cut.truncated and cut.row_limit == 10
    exact = shard.query(PROFILE_QUERY, row_limit=300)
    assert len(exact.rows) == 300 and not exact.truncated
    isolated = shard.query(PROFILE_QUERY + " ORDER BY ?finding", row_limit=7)
    assert isolated.isolated and len(isolated.rows) == 7 and isolated.truncated
    graph_form = shard.query("CONSTRUCT WHERE { ?o porter:about ?a }", row_limit=4)
    assert len(graph_form.rows) == 4 and graph_form.truncated
    # The query's own LIMIT is not a cut.
    own = shard.query(PROFILE_QUERY + " LIMIT 10", row_limit=10)
    assert len(own.rows) == 10 and not own.truncated


@pytest.mark.parametrize(("row_limit", "deadline"), [(0, 1.0), (-1, 1.0), (10, 0.0),
                                                     (10, -5.0), (10**9, 1.0)])
def test_bad_limits_are_refused(shard: Shard, row_limit: int, deadline: float) -> None:
    with pytest.raises(QueryError):
        shard.query(PROFILE_QUERY, row_limit=row_limit, deadline=deadline)


# --- deadlines ---------------------------------------------------------------------------------


def test_runaway_query_stops_at_its_deadline(shard: Shard) -> None:
    deadline = 2.0
    started = time.monotonic()
    with pytest.raises(QueryTimeout) as info:
        shard.query(RUNAWAY, deadline=deadline)
    elapsed = time.monotonic() - started
    assert deadline <= elapsed < deadline + 1.5
    assert isinstance(info.value, TimeoutError) and info.value.reason == "deadline"
    assert "worker process was killed" in str(info.value)
    # The next isolated query gets a fresh worker and an answer.
    count = shard.query("SELECT (COUNT(*) AS ?n) WHERE { ?o porter:about ?a }")
    assert count.items() == [{"n": "300"}]


def test_streaming_query_stops_at_its_deadline(shard: Shard) -> None:
    # Forced in process: rows keep coming (a cross product), the clock is checked per row.
    started = time.monotonic()
    with pytest.raises(QueryTimeout, match="deadline"):
        shard.query("SELECT * WHERE { ?a ?b ?c . ?d ?e ?f }", row_limit=1_000_000,
                    deadline=0.3, isolate=False)
    # Without the deadline this runs for minutes (300 observations, squared, a million
    # rows); the bound leaves room for a loaded machine.
    assert time.monotonic() - started < 0.3 + 5.0


# --- classification ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "streaming"),
    [
        (PROFILE_QUERY, True),
        (PROFILE_QUERY + " LIMIT 10 OFFSET 5", True),
        ("SELECT DISTINCT ?a WHERE { ?o porter:about ?a ; porter:severity 'high' }", True),
        ("SELECT ?o WHERE { ?o porter:finding ?f FILTER(CONTAINS(?f, 'x')) "
         "OPTIONAL { ?o porter:severity ?s } }", True),
        ("ASK { ?o porter:about 'x' }", True),
        ("CONSTRUCT { ?o porter:about ?a } WHERE { ?o porter:about ?a }", True),
        ("DESCRIBE <urn:porter:obs:00>", True),
        ("SELECT * WHERE { ?a ?b ?c . ?d ?e ?f }", False),
        ("SELECT * WHERE { ?o porter:about ?a OPTIONAL { ?x porter:finding ?f } }", False),
        (RUNAWAY, False),
        ("SELECT ?a WHERE { ?o porter:about ?a } ORDER BY ?a", False),
        ("SELECT ?a WHERE { { ?o porter:about ?a } UNION { ?o porter:finding ?a } }", False),
        ("SELECT ?a WHERE { ?o porter:next+ ?a }", False),
        ("SELECT ?a WHERE { ?o porter:about ?a FILTER NOT EXISTS { ?o porter:context ?c } }",
         False),
        ("SELECT * WHERE { { SELECT ?o WHERE { ?o ?p ?v } } }", False),
        ("SELECT * WHERE { VALUES ?a { 1 2 } ?o porter:about ?a }", False),
    ],
)
def test_classification(query: str, streaming: bool) -> None:
    assert check_query(query).streaming is streaming


def test_engine_without_checkpoint_runs_in_process() -> None:
    store = ox.Store()
    store.add(ox.Quad(ox.NamedNode("urn:a"), ox.NamedNode("urn:p"), ox.Literal("1")))
    engine = QueryEngine(store)
    result = engine.query("SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }")
    assert not result.isolated and result.items() == [{"n": "1"}]
    engine.close()
    with pytest.raises(QueryError, match="closed"):
        engine.query("ASK { ?s ?p ?o }")


def test_worker_is_stopped_with_the_shard(tmp_path: pathlib.Path) -> None:
    with Shard(tmp_path / "w", agent="worker-1") as s:
        s.remember("a", "b")
        assert s.query("SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }").isolated
    # the autouse fixture fails this test if the worker process outlived the shard


@pytest.mark.parametrize("piece", ["a.", "ex:a" + "." * 50, "_:b.", "?", '"""""a', "a:"])
def test_lexing_is_linear_on_hostile_input(piece: str) -> None:
    text = (piece * (MAX_QUERY_CHARS // len(piece)))[:MAX_QUERY_CHARS]
    started = time.monotonic()
    with pytest.raises(QueryError):
        check_query(text)
    assert time.monotonic() - started < 3.0
