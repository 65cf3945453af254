"""The version matrix: stepwarm's version-independent suites against the
Python sources of other vLLM releases (``nox -s compat``; docs/version-matrix.md)."""
