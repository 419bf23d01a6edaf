"""``bench-compare sweep``: a matrix of runs (models x engines x backends x threads x numerics x commands x machines)
on one machine or on a Ray cluster, merged into one report.

* :mod:`~bench_compare.sweep.spec`: the sweep file (TOML) and its validation;
* :mod:`~bench_compare.sweep.matrix`: the cells (the product of the axes minus ``exclude``), each one command line;
* :mod:`~bench_compare.sweep.machine`: what a machine advertises (CPU, ISA, cores, GPU) as labels, and matching;
* :mod:`~bench_compare.sweep.cell_run`: one cell = one fresh process running an existing command;
* :mod:`~bench_compare.sweep.store`: the sweep's output directory (one folder per cell, written atomically);
* :mod:`~bench_compare.sweep.local` and :mod:`~bench_compare.sweep.ray_executor`: the two executors;
* :mod:`~bench_compare.sweep.report`: the merged report (``bench-compare report SWEEP_DIR``).
"""
