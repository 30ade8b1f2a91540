"""Plots (matplotlib, headless): each function returns a Figure; save it with ``fig.savefig(path)``."""

from simgrid.plots.gantt import default_ranks, plot_gantt

__all__ = ["default_ranks", "plot_gantt"]
