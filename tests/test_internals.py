"""sdjax_runner/internals.py: the private JAX and Hydra APIs the package uses work against the installed
releases; a release other than the one a use was written for is said in one line, once per package; a
private API that is gone fails soft as the package always has, in one line."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest

from sdjax_runner import internals, process


@pytest.fixture
def fresh(monkeypatch):
    """A process that has checked no version and said nothing yet."""
    monkeypatch.setattr(process.current(), "said_once", set())


def _lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "sdjax_runner" and r.levelno == logging.WARNING]


def test_every_use_names_a_package_and_the_release_it_was_written_for():
    for name, entry in internals.INTERNALS.items():
        assert entry.package in ("jax", "hydra-core"), name
        assert internals._minor(entry.written_for), name
        assert entry.uses and entry.what, name


def test_the_installed_releases_are_those_the_uses_were_written_for(fresh, caplog):
    # The table is kept in step with the releases pyproject.toml installs: a new one is checked, then entered.
    with caplog.at_level("WARNING", logger="sdjax_runner"):
        assert internals.check_version("jax") is None
        assert internals.check_version("hydra-core") is None
    assert _lines(caplog) == []


def test_another_release_is_one_line_once_per_package(fresh, monkeypatch, caplog):
    found = {"jax": "0.13.1", "hydra-core": "1.3.9"}
    monkeypatch.setattr(internals, "installed_version", found.get)
    with caplog.at_level("WARNING", logger="sdjax_runner"):
        line = internals.check_version("jax")
        assert internals.check_version("jax") is None  # once per process
        assert internals.check_version("hydra-core") is None  # 1.3.9 is still 1.3
    assert _lines(caplog) == [line]
    assert "\n" not in line
    assert line.startswith("internals: jax 0.13.1 found, the use of its private API was written for jax 0.12.0.1; "
                           "may misbehave: ")
    assert "compilation cache" in line and "XLA flags" in line


def test_a_release_is_compared_by_major_and_minor(fresh, monkeypatch, caplog):
    monkeypatch.setattr(internals, "installed_version", {"jax": "0.12.7rc1", "hydra-core": "2.3.8"}.get)
    with caplog.at_level("WARNING", logger="sdjax_runner"):
        assert internals.check_version("jax") is None
        assert internals.check_version("hydra-core").startswith("internals: hydra-core 2.3.8 found, ")
    assert len(_lines(caplog)) == 1


def test_the_first_use_checks_the_release(fresh, monkeypatch, caplog):
    monkeypatch.setattr(internals, "installed_version", {"jax": "1.0.0", "hydra-core": "1.3.8"}.get)
    with caplog.at_level("WARNING", logger="sdjax_runner"):
        internals.jax_backends_started()
        with internals.jax_cache_bypassed():
            pass
    [line] = _lines(caplog)
    assert line.startswith("internals: jax 1.0.0 found")


# Each use, against the installed JAX and Hydra.

def test_the_compilation_cache_guard_is_installed(tmp_path):
    from jax._src import compilation_cache as jax_cache
    from jax._src.lru_cache import LRUCache

    assert internals.guard_jax_cache_entries()
    assert internals.guard_jax_cache_entries()  # once: a second call finds it in place
    assert LRUCache._sdjax_guarded and jax_cache.get_executable_and_time.__module__ == "sdjax_runner.internals"
    cache = LRUCache(str(tmp_path / "xla"), max_size=-1)
    cache.put("key", b"entry")
    assert cache.get("key") == b"entry"
    assert [p.name for p in (tmp_path / "xla").iterdir()] == ["key-cache"]  # whole, by rename: no temporary left


def test_the_compilation_cache_bypass_flips_and_restores_jaxs_decision():
    from jax._src import compilation_cache as jax_cache

    before = (jax_cache._cache_checked, jax_cache._cache_used)
    with internals.jax_cache_bypassed() as bypassing:
        assert bypassing
        assert (jax_cache._cache_checked, jax_cache._cache_used) == (True, False)
    assert (jax_cache._cache_checked, jax_cache._cache_used) == before


def test_whether_jax_started_is_read_from_jax():
    script = ("from sdjax_runner import internals; import jax; print(internals.jax_backends_started()); "
              "jax.devices(); print(internals.jax_backends_started())")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


def test_hydras_override_semantics_apply_in_place():
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    config = OmegaConf.create({"steps": 20, "sampler": {"name": "ddim"}})
    parser = OverridesParser.create()
    internals.apply_hydra_overrides(parser.parse_overrides(["steps=4", "+extra=1", "~sampler"]), config)
    assert OmegaConf.to_container(config) == {"steps": 4, "extra": 1}


def test_hydras_basic_sweeper_is_the_one_hydra_names():
    sweeper, conf = internals.hydra_basic_sweeper()
    assert f"{sweeper.__module__}.{sweeper.__qualname__}" == internals.BASIC_SWEEPER_TARGET
    assert conf.__name__ == "BasicSweeperConf"
    from hydra_plugins.sdjax_runner_resume.resume_sweeper import ResumeSweeper

    assert issubclass(ResumeSweeper, sweeper)


# A private API that is gone: soft failures, each one line.

def test_a_missing_cache_guard_leaves_jax_as_shipped(fresh, monkeypatch, caplog):
    from jax._src import compilation_cache as jax_cache
    from jax._src.lru_cache import LRUCache

    monkeypatch.setattr(LRUCache, "_sdjax_guarded", False, raising=False)
    monkeypatch.delattr(jax_cache, "get_executable_and_time")
    with caplog.at_level("WARNING", logger="sdjax_runner"):
        assert internals.guard_jax_cache_entries() is False
        assert internals.guard_jax_cache_entries() is False
    [line] = _lines(caplog)  # said once
    assert line.startswith("internals: jax ") and "has no jax._src.compilation_cache.get_executable_and_time: " in line


def test_a_missing_cache_bypass_does_nothing(fresh, monkeypatch, caplog):
    from jax._src import compilation_cache as jax_cache

    monkeypatch.delattr(jax_cache, "_cache_used")
    with caplog.at_level("WARNING", logger="sdjax_runner"), internals.jax_cache_bypassed() as bypassing:
        assert bypassing is False
    [line] = _lines(caplog)
    assert "has no jax._src.compilation_cache._cache_used: " in line


def test_a_missing_backend_check_answers_not_started(fresh, monkeypatch, caplog):
    from jax._src import xla_bridge

    monkeypatch.delattr(xla_bridge, "backends_are_initialized")
    with caplog.at_level("WARNING", logger="sdjax_runner"):
        assert internals.jax_backends_started() is False
    [line] = _lines(caplog)
    assert "has no jax._src.xla_bridge.backends_are_initialized: XLA flags are set as if" in line


def test_missing_hydra_internals_are_one_line_errors(fresh, monkeypatch):
    from hydra._internal import config_loader_impl

    monkeypatch.delattr(config_loader_impl.ConfigLoaderImpl, "_apply_overrides_to_config")
    with pytest.raises(internals.MissingInternal) as raised:
        internals.apply_hydra_overrides([], None)
    assert str(raised.value).startswith("internals: hydra-core ")
    assert str(raised.value).endswith(
        " has no hydra._internal.config_loader_impl.ConfigLoaderImpl._apply_overrides_to_config")

    monkeypatch.setitem(sys.modules, "hydra._internal.core_plugins.basic_sweeper", None)  # import fails
    with pytest.raises(ImportError, match=r"^internals: hydra-core \S+ has no "
                                          r"hydra\._internal\.core_plugins\.basic_sweeper$"):
        internals.hydra_basic_sweeper()
