"""aiayn.lightning_modules.data: the data: corpora (synthetic, Multi30k, WMT14, files, Hugging Face), the tokenizer,
token-bucket batches and the LightningDataModule.
"""
