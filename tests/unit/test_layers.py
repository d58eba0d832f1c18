"""The layers of DESIGN.md hold in the imports: the agent programs, which the command line
starts, do not import the command line's package; the package uses zeroconf's public
surface only; and nothing outside ``porter_mesh.core.as2`` reaches into its values'
private slots or private names."""

from __future__ import annotations

import ast
import pathlib

import agents


def imported_modules(path: pathlib.Path) -> list[str]:
    """Every module an ``import`` statement of ``path`` names (at any depth)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_agents_import_no_cli() -> None:
    root = pathlib.Path(agents.__file__).parent
    paths = sorted(root.rglob("*.py"))
    assert root / "runtime.py" in paths
    offenders = [f"{path.relative_to(root)}: {name}" for path in paths
                 for name in imported_modules(path)
                 if name == "porter_mesh.cli" or name.startswith("porter_mesh.cli.")]
    assert not offenders, offenders


def test_the_package_uses_only_public_zeroconf_modules() -> None:
    import porter_mesh

    root = pathlib.Path(porter_mesh.__file__).parent
    offenders = [f"{path.relative_to(root)}: {name}" for path in sorted(root.rglob("*.py"))
                 for name in imported_modules(path)
                 if name.startswith("zeroconf.") and any(
                     part.startswith("_") for part in name.split(".")[1:])]
    assert not offenders, offenders


#: The slots of Activity and ASObject (porter_mesh.core.as2.model).
AS2_SLOTS = {"_d", "_json", "_s", "_src", "_i", "_data", "_kind"}


def test_nothing_outside_as2_touches_its_private_parts() -> None:
    import porter_mesh

    package = pathlib.Path(porter_mesh.__file__).parent
    as2_dir = package / "core" / "as2"
    roots = [package, pathlib.Path(agents.__file__).parent, package.parent / "bench"]
    offenders = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            if as2_dir in path.parents:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.Attribute) and node.attr in AS2_SLOTS:
                    offenders.append(f"{path.name}:{node.lineno}: .{node.attr}")
                elif (isinstance(node, ast.ImportFrom) and node.module
                      and node.module.startswith("porter_mesh.core.as2")):
                    offenders += [f"{path.name}:{node.lineno}: {a.name}" for a in node.names
                                  if a.name.startswith("_")]
    assert not offenders, offenders
