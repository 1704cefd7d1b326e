"""An aiayn checkpoint as an MLflow Model: the code of the pyfunc model `aiayn train --log-model` logs.

MLflow's "models from code": this file is copied into the logged model (`model/mlflow_model.py`) and run by
`mlflow.pyfunc.load_model`, which then calls `load_context` with the model's artifacts (its `last.ckpt`, which carries
the run's config and tokenizer). `predict` takes a DataFrame of one text column (or a list of strings) and returns the
translations, beam search as the paper decodes. Loading needs aiayn importable (installed from its repository).
"""

from __future__ import annotations

import mlflow
from mlflow.pyfunc import PythonModel


class AiaynTranslator(PythonModel):
    """`Translator` (lightning_modules/use/translate.py) behind MLflow's pyfunc interface."""

    def load_context(self, context) -> None:
        from aiayn.lightning_modules.use.translate import Translator

        self.translator = Translator.from_checkpoint(context.artifacts["checkpoint"], device="cpu")

    def predict(self, context, model_input, params=None) -> list[str]:
        if hasattr(model_input, "iloc"):  # a DataFrame: its first column ("text" in the model's signature)
            sentences = model_input.iloc[:, 0].tolist()
        else:
            sentences = list(model_input)
        beam = (params or {}).get("beam")
        return self.translator.translate([str(s) for s in sentences], beam=beam)


mlflow.models.set_model(AiaynTranslator())
