"""A ``conf/`` folder of your own: when the working directory has one, its groups (``experiment/``, ``model/``,
``prompts/``, ...) are on the runner's config search path ahead of the packaged configs, so
``python -m sdjax_runner +experiment=mine`` finds ``conf/experiment/mine.yaml`` with no ``--config-dir``, and
a file of yours named as a packaged one is the one used (the run's log says so once:
:func:`sdjax_runner.config.user_conf.shadowed`).

Hydra finds search path plugins only in the ``hydra_plugins`` namespace package, hence this module. It touches
no other Hydra application: only a search path whose primary configs are the runner's."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin

from sdjax_runner.config.user_conf import PACKAGED, PROVIDER, user_conf_dir


class UserConfSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        folder = user_conf_dir()
        runners = any(element.path == PACKAGED for element in search_path.get_path())
        if folder is not None and runners and not any(e.provider == PROVIDER for e in search_path.get_path()):
            search_path.prepend(provider=PROVIDER, path=f"file://{folder}")
