"""aiayn.lightning_modules.transformer: the model (paper §3): its config, the Transformer, the loss and beam search.
Imports no Lightning.
"""
