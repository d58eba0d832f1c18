"""The public surface is explicit: everything in ``__all__`` exists and is documented."""

from __future__ import annotations

import importlib

import pytest

import porter_mesh


def test_all_names_exist_and_have_docstrings() -> None:
    for name in porter_mesh.__all__:
        value = getattr(porter_mesh, name)
        if name != "__version__":
            assert value.__doc__, f"{name} has no docstring"


def test_error_tree_root() -> None:
    for name in porter_mesh.__all__:
        value = getattr(porter_mesh, name)
        if isinstance(value, type) and issubclass(value, Exception):
            assert issubclass(value, porter_mesh.PorterError), name
    assert issubclass(porter_mesh.DeliveryTimeout, TimeoutError)
    assert issubclass(porter_mesh.OperationTimeout, TimeoutError)
    assert issubclass(porter_mesh.QueryTimeout, TimeoutError)


def test_the_tools_package_exports_load_on_first_use() -> None:
    import porter_mesh.tools as tools

    for name in tools.__all__:
        source = importlib.import_module(f"porter_mesh.tools.{tools._SOURCES[name]}")
        assert getattr(tools, name) is getattr(source, name), name
    assert set(tools.__all__) <= set(dir(tools))
    assert porter_mesh.Toolbox is tools.Toolbox
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        tools.nothing_here  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        porter_mesh.nothing_here  # noqa: B018
