"""Keep library noise off the user's console.

diffusers 0.39 and transformers 4.57 log a Flax deprecation notice for every
Flax class they create and a safety-checker notice per load; JAX and absl add
their own. The runner prints one line per phase instead.
"""

from __future__ import annotations

import logging
import os
import warnings


def silence_libraries() -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    for name in ("absl", "jax._src.xla_bridge", "huggingface_hub"):
        logging.getLogger(name).setLevel(logging.ERROR)
    for module in ("diffusers", "transformers", "flax", "jax"):
        warnings.filterwarnings("ignore", category=FutureWarning, module=module)
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=module)
