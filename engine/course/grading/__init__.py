"""Grading a notebook: make grade (grade), make autograde and its nbgrader step (autograde,
autograde_step), on one machine or a Dask cluster (cluster, cluster_task), each notebook run by the
sealed grader (kernel, sealed/) in a sandbox (sandbox), deciding own work and copies from the
cells' text alone (reading/)."""
