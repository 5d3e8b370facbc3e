"""maskray: background removal for whole image catalogs, on Ray.

Installed, the repository's ``pipeline/`` and ``operators/`` folders are ``maskray.pipeline``
(config, the Ray Data graph, CLI, manifest, report) and ``maskray.operators`` (pure per-image
compute, no Ray imports): setuptools' package-dir mapping in pyproject.toml.
"""

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

try:
    __version__ = version("maskray")
except PackageNotFoundError:  # imported from a checkout that was never installed
    __version__ = "0+unknown"

# A checkout on PYTHONPATH without an install (a GPU box with unpacked wheels, a bench run): the
# two folders sit beside this one. Checked by files only maskray has, so an installed maskray
# never picks up someone else's top-level `pipeline` package from site-packages.
_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "pipeline" / "sizing.py").is_file() and (_checkout / "operators" / "segmenter.py").is_file():
    __path__.append(str(_checkout))
