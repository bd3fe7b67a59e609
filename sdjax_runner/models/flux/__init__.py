"""FLUX.1 (issue #46): the runner's own flax.linen twins of diffusers 0.39's PyTorch FLUX modules -- the
transformer (:mod:`.transformer`), the 16-channel VAE (:mod:`.autoencoder`) -- and the torch-free conversion of
diffusers' PyTorch safetensors to their parameters (:mod:`.convert`). diffusers has FLUX only in PyTorch; these
match its ``FluxTransformer2DModel`` and ``AutoencoderKL`` number for number (tests/test_flux_modules.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


def config_fields(config: Mapping[str, Any], defaults: Mapping[str, Any], what: str,
                  tuples: tuple[str, ...] = ()) -> dict[str, Any]:
    """A diffusers ``config.json``'s values for a module's fields: ``_``-prefixed keys (diffusers' bookkeeping)
    ignored, any other key not in ``defaults`` refused (ValueError: it could change the model), lists of the
    keys in ``tuples`` made tuples (module fields are hashable)."""
    unknown = sorted(k for k in config if not k.startswith("_") and k not in defaults)
    if unknown:
        raise ValueError(f"{what} config has unknown key(s) {', '.join(unknown)}")
    values = {k: config[k] for k in defaults if k in config}
    for key in tuples:
        if values.get(key) is not None:
            values[key] = tuple(values[key])
    return values


class FromDiffusersConfig:
    """A Flax module built from a diffusers component's ``config.json``: its fields are the config's keys
    (``CONFIG_DEFAULTS``, diffusers' ``__init__`` defaults; ``CONFIG_TUPLES`` the keys read as tuples) and
    :meth:`check` refuses a config it cannot run. Mixed into FLUX.1's and SD 3's transformers and VAE."""

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {}
    CONFIG_WHAT: ClassVar[str] = ""  # for messages: "FLUX transformer"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> Any:
        """The module for a ``config.json`` (a dict): its keys as fields (``_``-prefixed keys, diffusers'
        bookkeeping, are ignored; any other unknown key is refused: it could change the model); ``kwargs`` set
        ``dtype``, ``param_dtype``, ``attention_implementation``. ValueError for a config it cannot run."""
        module = cls(**config_fields(config, cls.CONFIG_DEFAULTS, cls.CONFIG_WHAT, cls.CONFIG_TUPLES),
                     **kwargs)
        module.check()
        return module

    @property
    def config(self) -> dict[str, Any]:
        """The config.json keys and their values (what :meth:`from_config` reads)."""
        return {k: getattr(self, k) for k in self.CONFIG_DEFAULTS}

    def check(self) -> None:
        """ValueError for a config this module cannot run (nothing here)."""
