"""Plots (matplotlib, headless): each function returns a Figure; save it with ``fig.savefig(path)``.

* :func:`plot_gantt` - pipeline Gantt chart of a trace, bubbles visible, bubble fraction in the title;
* :func:`plot_overlay` - predicted vs measured Gantt charts;
* :func:`plot_scaling` - throughput / MFU against GPU count;
* :func:`plot_memory_breakdown`, :func:`plot_memory_timeline` - memory per rank and over time;
* :func:`plot_sweep_ranking`, :func:`plot_tp_pp_heatmap` - layout sweep views;
* :func:`plot_latency_vs_load`, :func:`plot_kv_occupancy`, :func:`plot_capacity` - serving.
"""

from simgrid.plots.gantt import default_ranks, plot_gantt
from simgrid.plots.memory import plot_memory_breakdown, plot_memory_timeline
from simgrid.plots.overlay import plot_overlay
from simgrid.plots.scaling import plot_scaling
from simgrid.plots.serving import plot_capacity, plot_kv_occupancy, plot_latency_vs_load
from simgrid.plots.sweep_views import plot_sweep_ranking, plot_tp_pp_heatmap

__all__ = [
    "default_ranks",
    "plot_capacity",
    "plot_gantt",
    "plot_kv_occupancy",
    "plot_latency_vs_load",
    "plot_memory_breakdown",
    "plot_memory_timeline",
    "plot_overlay",
    "plot_scaling",
    "plot_sweep_ranking",
    "plot_tp_pp_heatmap",
]
