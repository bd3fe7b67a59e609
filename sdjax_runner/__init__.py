"""sdjax-runner: declarative Stable Diffusion inference experiments in JAX/Flax."""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# ``python -m sdjax_runner`` (and ``python -m sdjax_runner runs`` ...) puts the working directory first on
# sys.path, so a folder a run starts in -- a downloaded model folder, say -- that ships ``hydra.py`` or
# ``numpy.py`` would have that file imported in place of the library, before any of our code runs. While
# ``-m`` locates the module, sys.argv[0] is "-m" and this package's __init__ runs first: the working
# directory leaves sys.path here, before anything else is imported. (The console script, ``sdjax-runner``,
# never has it on its path.)
if _sys.argv[:1] == ["-m"]:
    _cwd = _os.path.realpath(_os.getcwd())
    _sys.path[:] = [entry for entry in _sys.path if entry and _os.path.realpath(entry) != _cwd]
