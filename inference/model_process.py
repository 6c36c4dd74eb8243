"""Setting up a process that serves models: the embedded arena's (``manage.py serve``) and
``bench_engine --memory``'s, which measures what that process holds. Plain module (no Django);
call ``prepare`` before anything imports Keras.

Keras imports scikit-learn (its scikit-learn wrappers) and pandas (its pandas data adapter)
wherever they are installed, and the project's virtual environment has both for its tests
(pyproject's ``dev`` extra). A process that serves models uses neither; they cost it 77 MB
resident (``import jax, keras, keras_hub``: 337 MB with them, 260 MB without, this project's
machine). Marked absent, Keras runs as where they are not installed (the Docker image installs
no ``dev`` extra).
"""

from __future__ import annotations

import sys

TEST_ONLY = ("sklearn", "pandas")


def prepare() -> tuple[str, ...]:
    """Mark the test-only packages as absent for the rest of this process (an import of one then
    raises ImportError, which Keras takes as not installed); those already imported are left
    alone. Returns the ones marked."""
    marked = tuple(name for name in TEST_ONLY if name not in sys.modules)
    for name in marked:
        sys.modules[name] = None  # type: ignore[assignment]  # Python's own "not importable" mark.
    return marked
