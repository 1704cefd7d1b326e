"""aiayn.lightning_modules.run: one training run: its options and resolved spec, the LightningModule, the Trainer's
callbacks, loggers, devices, and the run directory's records.
"""
