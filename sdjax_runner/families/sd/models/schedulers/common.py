"""What the schedulers share: the training schedule (:class:`CommonState`: betas, alphas, alphas_cumprod), zero
terminal SNR, the settings read from a ``scheduler_config.json`` (:class:`Scheduler`), the step's output, and the
helpers more than one family uses (x0 from a model output, per-image noise, diffusers' timestep spacings).

The arithmetic is diffusers 0.39's Flax schedulers' own, written in the same order of operations: an image sampled
with these is bit for bit the one sampled with those (tests/test_own_schedulers.py).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from sdjax_runner.models.nn.config import Config

CONFIG_NAME = "scheduler_config.json"
ZERO_SNR_KEY = "rescale_betas_zero_snr"
ZERO_SNR_FLOOR = 2.0**-24  # the last alphas_cumprod of a floored zero-terminal-SNR schedule (finite sigmas)


def cosine_betas(steps: int, max_beta: float = 0.999) -> list[float]:
    """GLIDE's cosine schedule (``squaredcos_cap_v2``): 1 - alpha_bar(t2) / alpha_bar(t1) per step, capped
    (diffusers' ``betas_for_alpha_bar``, in Python floats)."""

    def alpha_bar(time: float) -> float:
        return math.cos((time + 0.008) / 1.008 * math.pi / 2) ** 2

    return [min(1 - alpha_bar((i + 1) / steps) / alpha_bar(i / steps), max_beta) for i in range(steps)]


def training_betas(config: Mapping[str, Any], dtype: Any) -> jnp.ndarray:
    """(num_train_timesteps,) betas of the config: ``trained_betas`` if given, else by ``beta_schedule`` --
    ``linear`` (beta_start to beta_end), ``scaled_linear`` (their square roots evenly, squared: Stable
    Diffusion's) or ``squaredcos_cap_v2``."""
    if config.get("trained_betas") is not None:
        return jnp.asarray(config["trained_betas"], dtype=dtype)
    steps, start, end = config["num_train_timesteps"], config["beta_start"], config["beta_end"]
    schedule = config["beta_schedule"]
    if schedule == "linear":
        return jnp.linspace(start, end, steps, dtype=dtype)
    if schedule == "scaled_linear":
        return jnp.linspace(start**0.5, end**0.5, steps, dtype=dtype) ** 2
    if schedule == "squaredcos_cap_v2":
        return jnp.array(cosine_betas(steps), dtype=dtype)
    raise ValueError(f"beta_schedule {schedule!r}: linear, scaled_linear or squaredcos_cap_v2")


@flax.struct.dataclass
class CommonState:
    """The training schedule every scheduler's state holds as ``common`` (diffusers' CommonSchedulerState)."""

    alphas: jnp.ndarray
    betas: jnp.ndarray
    alphas_cumprod: jnp.ndarray

    @classmethod
    def create(cls, scheduler: Any) -> CommonState:
        """From ``scheduler.config``'s beta settings, in ``scheduler.dtype`` (no zero terminal SNR)."""
        betas = training_betas(scheduler.config, scheduler.dtype)
        alphas = 1.0 - betas
        return cls(alphas=alphas, betas=betas, alphas_cumprod=jnp.cumprod(alphas, axis=0))


def rescale_zero_terminal_snr(betas: Any) -> np.ndarray:
    """diffusers' ``rescale_zero_terminal_snr`` (Lin et al. 2023, algorithm 1): sqrt(alphas_cumprod) shifted so the
    last is 0 and scaled so the first is unchanged, back to betas (NumPy, float64)."""
    alphas_bar_sqrt = np.sqrt(np.cumprod(1.0 - np.asarray(betas, np.float64)))
    first, last = alphas_bar_sqrt[0], alphas_bar_sqrt[-1]
    alphas_bar_sqrt = (alphas_bar_sqrt - last) * (first / (first - last))
    alphas_bar = alphas_bar_sqrt**2
    alphas = np.concatenate([alphas_bar[:1], alphas_bar[1:] / alphas_bar[:-1]])
    return 1 - alphas


def zero_terminal_snr(common: Any, floored: bool) -> CommonState:
    """``common`` (any object with ``betas``) with its betas rescaled to zero terminal SNR, computed in float64 and
    cast to its dtype; ``floored``: the last alphas_cumprod 2**-24 instead of 0, as diffusers' PyTorch Euler and
    DPM-Solver set it (their sigmas would be infinite)."""
    betas = rescale_zero_terminal_snr(np.asarray(common.betas))
    alphas = 1.0 - betas
    alphas_cumprod = np.cumprod(alphas)
    if floored:
        alphas_cumprod[-1] = ZERO_SNR_FLOOR
    dtype = common.betas.dtype
    return CommonState(alphas=jnp.asarray(alphas, dtype), betas=jnp.asarray(betas, dtype),
                       alphas_cumprod=jnp.asarray(alphas_cumprod, dtype))


@flax.struct.dataclass
class SchedulerOutput:
    """What ``step`` returns: the sample one step on and the state (a pytree, so a jitted step may return it)."""

    prev_sample: jnp.ndarray
    state: Any

    def to_tuple(self) -> tuple[jnp.ndarray, Any]:
        return self.prev_sample, self.state


def output(prev_sample: jnp.ndarray, state: Any, return_dict: bool) -> Any:
    return SchedulerOutput(prev_sample=prev_sample, state=state) if return_dict else (prev_sample, state)


def training_timesteps(config: Mapping[str, Any]) -> jnp.ndarray:
    """Every training timestep, decreasing (int32): a new state's ``timesteps``, before ``set_timesteps``."""
    return jnp.arange(0, config["num_train_timesteps"]).round()[::-1]


def broadcast_from_left(x: jnp.ndarray, shape: tuple[int, ...]) -> jnp.ndarray:
    """``x`` (one value per image) broadcast over ``shape``'s trailing axes."""
    return jnp.broadcast_to(x.reshape(x.shape + (1,) * (len(shape) - x.ndim)), shape)


def alpha_scales(common: Any, shape: tuple[int, ...], timesteps: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """sqrt(alphas_cumprod[t]) and sqrt(1 - alphas_cumprod[t]) per image, over ``shape``."""
    alphas_cumprod = common.alphas_cumprod
    signal = broadcast_from_left((alphas_cumprod[timesteps] ** 0.5).flatten(), shape)
    noise = broadcast_from_left(((1 - alphas_cumprod[timesteps]) ** 0.5).flatten(), shape)
    return signal, noise


def add_noise_at(common: Any, original_samples: jnp.ndarray, noise: jnp.ndarray, timesteps: jnp.ndarray):
    """The forward process: ``original_samples`` noised to training timesteps ``timesteps`` (one per image)."""
    signal, scale = alpha_scales(common, original_samples.shape, timesteps)
    return signal * original_samples + scale * noise


def velocity_at(common: Any, sample: jnp.ndarray, noise: jnp.ndarray, timesteps: jnp.ndarray):
    """The v-prediction target at ``timesteps``: sqrt(a) * noise - sqrt(1 - a) * sample."""
    signal, scale = alpha_scales(common, sample.shape, timesteps)
    return signal * noise - scale * sample


def original_sample(prediction_type: str, model_output, sample, alpha_prod_t, name: str):
    """x0 from the model's output at a timestep of ``alpha_prod_t`` (the "predicted original sample"), for
    ``prediction_type`` epsilon, sample or v_prediction; ``name``: the scheduler, for the error."""
    if prediction_type == "epsilon":
        return (sample - (1 - alpha_prod_t) ** 0.5 * model_output) / alpha_prod_t**0.5
    if prediction_type == "sample":
        return model_output
    if prediction_type == "v_prediction":
        return alpha_prod_t**0.5 * sample - (1 - alpha_prod_t) ** 0.5 * model_output
    raise ValueError(f"prediction_type {prediction_type!r}: {name} takes epsilon, sample or v_prediction")


def image_noise(key: jax.Array, timestep, sample: jnp.ndarray) -> jnp.ndarray:
    """Standard normal noise per image, keyed by the timestep and the image's latent bits (an integer sum: exact
    and independent of reduction order) -- so the seed alone decides an image, whatever batch or device it is in."""

    def one(image):
        bits = jax.lax.bitcast_convert_type(image.astype(jnp.float32), jnp.uint32).sum(dtype=jnp.uint32)
        return jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, timestep), bits), image.shape, image.dtype)

    return jax.vmap(one)(sample)


def spaced_timesteps(spacing: str, train_steps: int, steps: int, steps_offset: int = 0) -> np.ndarray:
    """diffusers' PyTorch schedulers' ``timestep_spacing`` (DDIMScheduler.set_timesteps, Table 2 of Lin et al. 2023):
    ``linspace`` evenly from T - 1 to 0; ``leading`` every T // n-th from 0, plus steps_offset; ``trailing`` every
    T / n-th from T down, minus one -- the last training timestep always visited. Decreasing (NumPy)."""
    if spacing == "linspace":
        return np.linspace(0, train_steps - 1, steps).round()[::-1].copy()
    if spacing == "leading":
        return (np.arange(0, steps) * (train_steps // steps)).round()[::-1].copy() + steps_offset
    if spacing == "trailing":
        return np.round(np.arange(train_steps, 0, -train_steps / steps)) - 1
    raise ValueError(f"timestep_spacing {spacing!r}: linspace, leading or trailing")


class Scheduler:
    """A scheduler's settings and what every scheduler does alike.

    ``SETTINGS``: the ``scheduler_config.json`` keys it takes and their defaults (diffusers' ``__init__``'s).
    ``ZERO_SNR``: None if it takes no ``rescale_betas_zero_snr``; else whether that schedule is floored
    (:func:`zero_terminal_snr`). A subclass adds ``create_state``, ``set_timesteps`` and ``step``.
    """

    SETTINGS: ClassVar[dict[str, Any]] = {}
    ZERO_SNR: ClassVar[Optional[bool]] = None
    has_state = True  # (diffusers' FlaxSchedulerMixin.from_pretrained asks)

    def __init__(self, dtype: Any = jnp.float32, **settings: Any) -> None:
        unknown = sorted(set(settings) - set(self.SETTINGS))
        if unknown:
            raise TypeError(f"{type(self).__name__} takes no setting(s) {', '.join(unknown)}")
        self.dtype = dtype
        self._config = Config({**self.SETTINGS, **settings, "_class_name": type(self).__name__})

    @property
    def config(self) -> Config:
        """The settings (every one of ``SETTINGS``, and what :meth:`register_to_config` added), readable as keys
        and attributes; ``_class_name`` this class's name."""
        return self._config

    def register_to_config(self, **values: Any) -> None:
        """Set config values (a setting changes what the scheduler computes from then on; any other key is only
        recorded, for readers of the config such as the k samplers' sigmas)."""
        self._config = Config({**self._config, **values})

    @classmethod
    def from_config(cls, config: Optional[Mapping[str, Any]] = None, **kwargs: Any) -> Any:
        """The scheduler for a ``scheduler_config.json`` dict, ``kwargs`` (settings, ``dtype``) overriding it. Keys
        it does not take -- ``_``-prefixed bookkeeping (``_class_name``: the config's is replaced by this class's),
        another scheduler's or diffusers' PyTorch schedulers' settings -- are ignored, as diffusers' Flax
        schedulers ignore them (a model's published config is often another class's)."""
        values = {**(config or {}), **kwargs}
        dtype = values.pop("dtype", jnp.float32)
        return cls(dtype=dtype, **{k: v for k, v in values.items() if k in cls.SETTINGS})

    @classmethod
    def load_config(cls, path: Any, subfolder: Optional[str] = None) -> dict[str, Any]:
        """``path/subfolder/scheduler_config.json`` as a dict (a local folder; OSError or ValueError if unreadable)."""
        folder = Path(path) / subfolder if subfolder else Path(path)
        config = json.loads((folder / CONFIG_NAME).read_text(encoding="utf-8"))
        if not isinstance(config, dict):
            raise ValueError(f"{folder / CONFIG_NAME} holds no JSON object")
        return config

    @classmethod
    def from_pretrained(cls, path: Any, subfolder: Optional[str] = None, **kwargs: Any) -> tuple[Any, Any]:
        """(scheduler, its new state) from a folder's ``scheduler_config.json``, as diffusers' Flax ones load."""
        scheduler = cls.from_config(cls.load_config(path, subfolder), **kwargs)
        return scheduler, scheduler.create_state()

    def save_pretrained(self, directory: Any) -> None:
        """Write ``scheduler_config.json`` (the settings, ``_class_name`` diffusers' PyTorch name) to ``directory``."""
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / CONFIG_NAME).write_text(json.dumps(dict(self.config), indent=2, sort_keys=True), encoding="utf-8")

    def common_state(self) -> CommonState:
        """The training schedule of the config, rescaled to zero terminal SNR where the config asks and the
        scheduler takes it."""
        common = CommonState.create(self)
        if self.ZERO_SNR is not None and self.config.get(ZERO_SNR_KEY):
            common = zero_terminal_snr(common, floored=self.ZERO_SNR)
        return common

    def scale_model_input(self, state: Any, sample: jnp.ndarray, timestep: Any = None) -> jnp.ndarray:
        """The UNet's input at ``timestep``: the sample itself (the sigma-space schedulers scale it)."""
        return sample

    def add_noise(self, state: Any, original_samples: jnp.ndarray, noise: jnp.ndarray, timesteps: jnp.ndarray):
        """``original_samples`` noised to training timesteps ``timesteps`` (one per image)."""
        return add_noise_at(state.common, original_samples, noise, timesteps)

    def __len__(self) -> int:
        return int(self.config.num_train_timesteps)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.config)})"
