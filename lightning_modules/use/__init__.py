"""aiayn.lightning_modules.use: using a trained model: checkpoints (load, average), translation, evaluation and BLEU,
export (Hugging Face Marian, CTranslate2).
"""
