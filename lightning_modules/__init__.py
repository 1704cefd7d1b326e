"""aiayn.lightning_modules: one run. The model (paper §3), its LightningModule and DataModule, decoding,
evaluation, training, the Trainer's callbacks, and the run directory (rundir.py)."""
