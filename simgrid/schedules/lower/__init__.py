"""Lowering passes: from a compute-only pipeline order to a full IR program (see ``simgrid.schedules.build``)."""
