"""Suite-wide pytest setup. Being in tests/ (no ``__init__.py``), this file puts tests/ on ``sys.path`` under
pytest's default import mode, so every test directory can import the shared helpers kept here
(``script_modules``)."""
