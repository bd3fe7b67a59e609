"""A flax.linen module whose fields are a published component's ``config.json`` keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar


class Config(dict):
    """A module's config: a dict whose keys also read as attributes (``unet.config.in_channels``), as diffusers'
    ``FrozenDict`` configs read."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def config_fields(config: Mapping[str, Any], defaults: Mapping[str, Any], what: str,
                  tuples: tuple[str, ...] = (), ignored: tuple[str, ...] = ()) -> dict[str, Any]:
    """A ``config.json``'s values for a module's fields: ``_``-prefixed keys (diffusers' bookkeeping) and the keys
    in ``ignored`` (a library's generic ones that change nothing computed) skipped, any other key not in
    ``defaults`` refused (ValueError: it could change the model), lists of the keys in ``tuples`` made tuples
    (module fields are hashable)."""
    unknown = sorted(k for k in config if not k.startswith("_") and k not in defaults and k not in ignored)
    if unknown:
        raise ValueError(f"{what} config has unknown key(s) {', '.join(unknown)}")
    values = {k: config[k] for k in defaults if k in config}
    for key in tuples:
        if isinstance(values.get(key), list):
            values[key] = tuple(values[key])
    return values


class FromDiffusersConfig:
    """A Flax module built from a published component's ``config.json``: its fields are the config's keys
    (``CONFIG_DEFAULTS``, the publishing library's ``__init__`` defaults; ``CONFIG_TUPLES`` the keys read as
    tuples; ``CONFIG_IGNORED`` generic keys that change nothing computed) and :meth:`check` refuses a config it
    cannot run. Mixed into every model module of the runner's own."""

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = {}
    CONFIG_WHAT: ClassVar[str] = ""  # for messages: "FLUX transformer"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = ()
    CONFIG_IGNORED: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> Any:
        """The module for a ``config.json`` (a dict): its keys as fields (``_``-prefixed keys, diffusers'
        bookkeeping, and ``CONFIG_IGNORED`` are skipped; any other unknown key is refused: it could change the
        model); ``kwargs`` set fields that are no config keys (``dtype``, the attention). ValueError for a config
        it cannot run."""
        module = cls(**config_fields(config, cls.CONFIG_DEFAULTS, cls.CONFIG_WHAT, cls.CONFIG_TUPLES,
                                     cls.CONFIG_IGNORED), **kwargs)
        module.check()
        return module

    @property
    def config(self) -> Config:
        """The config.json keys and their values (what :meth:`from_config` reads), readable as attributes."""
        return Config({k: getattr(self, k) for k in self.CONFIG_DEFAULTS})

    def check(self) -> None:
        """ValueError for a config this module cannot run (nothing here)."""
