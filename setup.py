"""Builds the optional C extension of the activity hot path (see
``porter_mesh/core/speedups.py``). Everything else is in ``pyproject.toml``.

The extension is ``optional``: when it cannot be compiled (no C compiler, no Python
headers) setuptools prints a warning and the install goes on; the package then runs
its pure Python path, which does the same work.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "porter_mesh.core._speedups",
            sources=["porter_mesh/core/_speedups.c"],
            optional=True,
        )
    ]
)
