"""Suite-wide pytest setup. Being in tests/ (no ``__init__.py``), this file puts tests/ on ``sys.path`` under
pytest's default import mode, so every test directory can import the shared helpers kept here
(``script_modules``)."""

from hypothesis import settings

# Property tests assert behaviour, never speed: Hypothesis's default 200 ms deadline per example turns a loaded
# shared host (or a slow CI runner) into a spurious failure, so the suite runs without one.
settings.register_profile("suite", deadline=None)
settings.load_profile("suite")
