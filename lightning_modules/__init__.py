"""aiayn.lightning_modules: one run, in four rooms, each importing only what it needs of the others:

- ``transformer/``: the model (paper §3), its config, the loss and beam search; plain PyTorch, no Lightning.
- ``data/``: corpora, the tokenizer, token-bucket batches and the LightningDataModule.
- ``run/``: one training run: options, the resolved spec, the LightningModule, callbacks, loggers, the run directory.
- ``use/``: a trained model: checkpoints, translation, evaluation and BLEU, export (Marian, CTranslate2).
"""
