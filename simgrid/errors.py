"""The project's error hierarchy.

Every error a user can cause (a bad profile, model, layout, program file or CLI flag) is a
:class:`SimgridError`; the CLI prints its message on one line and exits non-zero, with no traceback.
Messages name the offending field, its value and how to fix it.
"""

from __future__ import annotations


class SimgridError(Exception):
    """Root of every error this project raises on purpose."""


class ProfileError(SimgridError):
    """A hardware profile is missing, malformed or inconsistent."""


class ModelError(SimgridError):
    """A model description is unknown or invalid."""


class LayoutError(SimgridError):
    """A parallel layout breaks a rule (divisibility, sizes, schedule constraints)."""


class ScheduleError(LayoutError):
    """A pipeline schedule cannot be built for the requested stages/micro-batches/chunks."""


class ProgramError(SimgridError):
    """A schedule IR program is malformed, fails validation or deadlocks."""


class SimulationError(SimgridError):
    """The engine could not simulate a program (e.g. a deadlock found while running)."""
