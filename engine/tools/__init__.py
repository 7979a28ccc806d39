"""The tools above the runtime: the command line, the benches, the simulator, the demos, the GPU checks.

They import the runtime (model, caches, attention, serving core) and nothing of the checks or the course;
the runtime imports nothing of them (pyproject.toml's import contract, tests/test_import_layers.py).
"""
