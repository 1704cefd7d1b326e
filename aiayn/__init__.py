"""aiayn: Table 3 of "Attention Is All You Need", run as sweeps with generated reports.

Layers, bottom to top (each imports only those below it; tests/test_layers.py checks this):

- ``aiayn.common``: plumbing every layer shares (errors, atomic files, secrets, locks, options).
- ``aiayn.ablations`` (``ablations/``): what to run, as data: Table 3, the extended rows, the presets.
- ``aiayn.lightning_modules`` (``lightning_modules/``): one run: model, data, training, evaluation.
- ``aiayn.sweeps`` (``sweeps/``) and ``aiayn.reports`` (``reports/``): many runs, and their tables.
- ``aiayn.cli``: the ``aiayn`` command.
"""

import os
from importlib.metadata import PackageNotFoundError, version

# In a checkout, aiayn.ablations, .lightning_modules, .sweeps and .reports live beside this directory, not in it
# (pyproject's [tool.setuptools.package-dir]). An installed package holds them inside; an editable install maps
# them. But when this directory is imported straight from a checkout, with neither (`python -m aiayn` or a
# sweep's forkserver started in the checkout, whose working directory comes first on sys.path and shadows a
# regular install), the subpackages are found by searching the checkout's root as well.
_here = os.path.dirname(os.path.abspath(__file__))
if not os.path.isdir(os.path.join(_here, "lightning_modules")) and os.path.isfile(
    os.path.join(os.path.dirname(_here), "lightning_modules", "__init__.py")
):
    __path__.append(os.path.dirname(_here))  # the package's own __path__

try:
    __version__ = version("aiayn")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

__all__ = ["Ct2Translator", "Translator", "__version__"]


def __getattr__(name: str):
    """`from aiayn import Translator` (or Ct2Translator) without importing torch when `aiayn` (or any aiayn.* module) is
    imported: the CLI's light commands and every layer import this package first."""
    if name == "Translator":
        from aiayn.lightning_modules.use.translate import Translator

        return Translator
    if name == "Ct2Translator":
        from aiayn.lightning_modules.use.ct2 import Ct2Translator

        return Ct2Translator
    raise AttributeError(f"module 'aiayn' has no attribute {name!r}")
