"""Run simgrid schedule Programs for real on torch.distributed (the only package that imports torch).

Entry points: :func:`executor.runner.run_program` (validate, launch one process per rank, interpret every
rank's ops, return losses, weights, step times and a :class:`simgrid.trace.Trace`),
:func:`executor.reference.reference_training` (the single-process step every layout must reproduce),
:func:`executor.calibrate.calibrate` (measure this machine into a cluster profile),
:func:`executor.validate.validate_layout` (predicted vs measured) and the ``simgrid-exec`` CLI
(:mod:`executor.cli`). GPU runs with NCCL are wired (device placement, CUDA-event timer) but untested here.

Layers, top first (each imports only its own and those below; docs/design.md draws them): entry points;
:mod:`executor.interpreter` (the step loop and the op table); :mod:`executor.handlers` (one function per
op kind, given the rank's state); :mod:`executor.state`; block runs, gradients and the cut plan; the model
(:mod:`executor.model`, :mod:`executor.tp`, :mod:`executor.cp`); communication and other primitives.
"""
