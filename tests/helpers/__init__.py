"""What the test modules share: waiting on a condition, a fake clock, the team's fixtures,
snapshot builders and the pipeline's inspection helpers.

A test module imports from here, never from another test module
(tests/unit/test_import_graph.py checks it): a `test_*.py` imported elsewhere runs its
module-level code twice under pytest's collection and ties two suites together.
"""
