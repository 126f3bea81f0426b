"""Cellblock's benchmark: gateway vs. direct vs. peer proxies, measured side by side in one run.

Run `.venv/bin/python -m tests.bench` (see `docs/performance.md`). Nothing here is collected by
pytest (pyproject's `norecursedirs`), and the test suite never asserts on time.
"""
