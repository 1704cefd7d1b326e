"""aiayn: Table 3 of "Attention Is All You Need", reproduced as sweeps and generated reports.

Layers, bottom to top (each imports only those below it; tests/test_layers.py checks this):

- ``aiayn.common``: plumbing every layer shares (errors, atomic files, secrets, locks, options).
- ``aiayn.ablations`` (``ablations/``): what to run, as data: Table 3, the extended rows, the presets.
- ``aiayn.lightning_modules`` (``lightning_modules/``): one run: model, data, training, evaluation.
- ``aiayn.sweeps`` (``sweeps/``) and ``aiayn.reports`` (``reports/``): many runs, and their tables.
- ``aiayn.cli``: the ``aiayn`` command.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("aiayn")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["Ct2Translator", "Translator", "__version__"]


def __getattr__(name: str):
    """`from aiayn import Translator` (or Ct2Translator) without importing torch when `aiayn` (or any aiayn.* module) is
    imported: the CLI's light commands and every layer import this package first."""
    if name == "Translator":
        from aiayn.lightning_modules.translate import Translator

        return Translator
    if name == "Ct2Translator":
        from aiayn.lightning_modules.ct2 import Ct2Translator

        return Ct2Translator
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
