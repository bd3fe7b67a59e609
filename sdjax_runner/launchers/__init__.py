"""Sweeps that outgrow one process: Hydra launchers whose workers each load and compile once.

``hydra/launcher=ray`` (:mod:`.ray_sweep`) runs a multirun's points on long-lived Ray actors;
``hydra/launcher=slurm_workers`` / ``local_workers`` (:mod:`.array_tasks`) split them into array tasks
through submitit. Either way a worker is one process (:class:`.workers.SweepWorker`) that runs the points it
is given one after another through Hydra's own ``run_job`` -- the same job as the basic launcher's, with the
same reuse cache (:mod:`sdjax_runner.engine.reuse`), so it loads each model and compiles each program once.
The Hydra plugin classes are thin, in ``hydra_plugins/sdjax_runner_launchers``; the guide is
docs/guides/clusters.md.
"""
