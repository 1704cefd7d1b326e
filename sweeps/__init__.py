"""aiayn.sweeps: many runs. Table 3 as an Optuna-kept sweep, SLURM job arrays, hyper-parameter search and
the W&B sweep export; each run is lightning_modules.run.train.train or, in a separate process, `aiayn train`."""
