"""The example activities of the AS2 compact profile, verbatim.

Every example printed in the profile document (the ``Invoke``, ``Remember`` and
``Recall`` examples of its lifecycle sections, every entry under "Examples", and the
plain-text fallback) keyed by the heading it appears under. ``porter-mesh examples``
prints them and the test-suite checks each one against the validator and the builders;
``tests/data/profile_examples.json`` holds the same data as JSON and a test keeps the two
equal.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import orjson

__all__ = ["PROFILE_EXAMPLES", "profile_examples"]

_EXAMPLES: dict[str, dict[str, Any]] = {
    "Invoke (execution lifecycle)": {
        "type": "Invoke",
        "actor": "worker-1",
        "summary": "Running test suite",
        "context": "urn:porter:task:a3f9",
        "object": {
            "type": "Note",
            "content": "deno test --allow-all",
        },
        "result": {
            "type": "Note",
            "content": "14 tests passed, 0 failures",
        },
        "instrument": [
            "bash",
        ],
    },
    "Remember (knowledge lifecycle)": {
        "type": "Remember",
        "actor": "worker-1",
        "summary": "Recording dependency relationship",
        "object": {
            "type": "Note",
            "about": "urn:porter:file:server.ts",
            "content": "depends on express module for HTTP routing",
        },
    },
    "Recall (knowledge lifecycle)": {
        "type": "Recall",
        "actor": "architect",
        "summary": "Checking known dependencies",
        "object": {
            "type": "Note",
            "content": (
                "SELECT ?about ?finding WHERE { ?obs "
                "<https://porter.chapeaux.io/vocab#about> ?about ; "
                "<https://porter.chapeaux.io/vocab#finding> ?finding }"
            ),
        },
        "result": {
            "type": "Collection",
            "items": [
                {
                    "about": "urn:porter:file:server.ts",
                    "finding": "depends on express module",
                },
            ],
        },
    },
    "Admin assigns a task": {
        "type": "Offer",
        "actor": "architect",
        "summary": "Add GET /users endpoint",
        "context": "urn:porter:task:a3f9",
        "object": {
            "type": "Note",
            "content": (
                "Add a GET /users endpoint to the API router. Return JSON array of User "
                "objects from the database. Include pagination via ?page=&limit= query "
                "params."
            ),
        },
        "target": "worker-backend",
        "tag": [
            "api",
            "backend",
        ],
    },
    "Worker accepts": {
        "type": "Accept",
        "actor": "worker-backend",
        "summary": "Starting work on GET /users",
        "context": "urn:porter:task:a3f9",
    },
    "Worker invokes a command": {
        "type": "Invoke",
        "actor": "worker-backend",
        "summary": "Running database migration",
        "context": "urn:porter:task:a3f9",
        "object": {
            "type": "Note",
            "content": "deno task db:migrate",
        },
        "result": {
            "type": "Note",
            "content": "Migration complete: added users table",
        },
        "instrument": [
            "bash",
        ],
    },
    "Worker creates files": {
        "type": "Create",
        "actor": "worker-backend",
        "summary": "Added /users route and handler",
        "context": "urn:porter:task:a3f9",
        "object": {
            "type": "Collection",
            "items": [
                {
                    "type": "Document",
                    "url": "src/routes/users.ts",
                    "summary": "Route handler",
                },
                {
                    "type": "Document",
                    "url": "src/models/user.ts",
                    "summary": "User type definition",
                },
            ],
        },
        "instrument": [
            "file",
        ],
    },
    "Worker stores knowledge": {
        "type": "Remember",
        "actor": "worker-backend",
        "summary": "Recording API design decision",
        "context": "urn:porter:task:a3f9",
        "object": {
            "type": "Note",
            "about": "api-design",
            "content": "GET /users returns paginated JSON with {data, page, limit, total} envelope",
        },
    },
    "Admin queries knowledge": {
        "type": "Recall",
        "actor": "architect",
        "summary": "Checking API decisions",
        "object": {
            "type": "Note",
            "content": (
                "SELECT ?about ?finding WHERE { ?obs "
                "<https://porter.chapeaux.io/vocab#about> ?about ; "
                "<https://porter.chapeaux.io/vocab#finding> ?finding } LIMIT 10"
            ),
        },
    },
    "Worker requests review": {
        "type": "Offer",
        "actor": "worker-backend",
        "summary": "Ready for review: GET /users endpoint",
        "context": "urn:porter:task:a3f9",
        "object": {
            "type": "Collection",
            "items": [
                {
                    "type": "Document",
                    "url": "src/routes/users.ts",
                },
                {
                    "type": "Document",
                    "url": "src/models/user.ts",
                },
            ],
        },
        "target": "reviewer",
    },
    "Reviewer gives feedback": {
        "type": "Reject",
        "actor": "reviewer",
        "summary": "Missing input validation on pagination params",
        "context": "urn:porter:task:a3f9",
        "object": {
            "type": "Note",
            "content": (
                "The ?limit= param accepts any value including negative numbers. Add "
                "validation: limit must be 1-100, page must be >= 1. Also add a test for "
                "invalid query params."
            ),
        },
        "tag": [
            "validation",
            "testing",
        ],
    },
    "Worker updates after feedback": {
        "type": "Update",
        "actor": "worker-backend",
        "summary": "Added pagination validation and tests",
        "context": "urn:porter:task:a3f9",
        "object": {
            "type": "Collection",
            "items": [
                {
                    "type": "Document",
                    "url": "src/routes/users.ts",
                    "summary": "Added validation",
                },
                {
                    "type": "Document",
                    "url": "tests/users.test.ts",
                    "summary": "Pagination edge cases",
                },
            ],
        },
    },
    "Reviewer approves": {
        "type": "Accept",
        "actor": "reviewer",
        "summary": "LGTM -- validation and tests look good",
        "context": "urn:porter:task:a3f9",
    },
    "Agent asks a question": {
        "type": "Question",
        "actor": "worker-frontend",
        "summary": "Which auth library should I use?",
        "context": "urn:porter:task:b7c2",
        "object": {
            "type": "Note",
            "content": (
                "The project has both jose and jsonwebtoken in package.json. Which one is "
                "preferred for JWT validation?"
            ),
        },
        "target": "architect",
    },
    "Status announcement": {
        "type": "Announce",
        "actor": "worker-backend",
        "summary": "All tests passing",
        "context": "urn:porter:task:a3f9",
        "object": {
            "type": "Note",
            "content": "14 tests passing, 0 failures. Coverage: 87%.",
        },
    },
    "Fallback": {
        "type": "Note",
        "content": "<the raw message text>",
    },
}

#: Read-only view of the examples, name -> activity. Treat the nested values as
#: read-only too; :func:`profile_examples` gives copies that may be changed.
PROFILE_EXAMPLES: Final[Mapping[str, Mapping[str, Any]]] = MappingProxyType(_EXAMPLES)


def profile_examples() -> dict[str, dict[str, Any]]:
    """Return a fresh deep copy of the profile's examples, in document order.

    Returns:
        A dict mapping each example's name to its activity as a JSON-ready dict.
    """
    copy: dict[str, dict[str, Any]] = orjson.loads(orjson.dumps(_EXAMPLES))
    return copy
