"""An aiayn checkpoint as an MLflow Model: the code of the pyfunc model `aiayn train --log-model` logs.

MLflow's "models from code": this file is copied into the logged model and run by `mlflow.pyfunc.load_model`, which
puts the aiayn code the model carries (`code/aiayn`) on the path and calls `load_context` with the model's artifacts
(its `last.ckpt`, which carries the run's config and tokenizer). `predict` takes a list of strings (or a DataFrame of
one text column, which MLflow turns into one) and returns the translations, beam search as the paper decodes; its
signature is these type hints (MLflow infers it from them).
"""

from __future__ import annotations

from typing import Any

import mlflow
from mlflow.pyfunc import PythonModel


class AiaynTranslator(PythonModel):
    """`Translator` (lightning_modules/use/translate.py) behind MLflow's pyfunc interface."""

    def load_context(self, context) -> None:
        from aiayn.lightning_modules.use.translate import Translator

        self.translator = Translator.from_checkpoint(context.artifacts["checkpoint"], device="cpu")

    def predict(self, context, model_input: list[str], params: dict[str, Any] | None = None) -> list[str]:
        beam = (params or {}).get("beam")
        return self.translator.translate([str(s) for s in model_input], beam=beam)


mlflow.models.set_model(AiaynTranslator())
