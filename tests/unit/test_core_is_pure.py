"""The core must not import I/O: no zmq, asyncio, zeroconf, sockets or threads."""

from __future__ import annotations

import ast
import pathlib

import porter_mesh.core

FORBIDDEN = {"zmq", "asyncio", "zeroconf", "socket", "threading", "subprocess", "pyoxigraph"}


def test_core_modules_import_no_io() -> None:
    root = pathlib.Path(porter_mesh.core.__file__).parent
    offenders = []
    paths = sorted(root.rglob("*.py"))
    assert root / "__init__.py" in paths and root / "as2" / "model.py" in paths  # subpackages too
    for path in paths:
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                if name.split(".")[0] in FORBIDDEN:
                    offenders.append(f"{path.relative_to(root)}: {name}")
    assert not offenders, offenders
