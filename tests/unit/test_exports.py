"""The public surface is explicit: everything in ``__all__`` exists and is documented."""

from __future__ import annotations

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
