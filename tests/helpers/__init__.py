"""The fixtures and helpers every test may use, a module per subject (listed in tests/conftest.py)."""
