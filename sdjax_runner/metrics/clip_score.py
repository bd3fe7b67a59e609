"""Text-image agreement: the CLIP score of each image against its own prompt, in JAX.

``score = max(100 * cos(E_image, E_text), 0)`` with the runner's CLIP (models/nn/clip.py: transformers'
``FlaxCLIPModel`` number for number) -- the definition of torchmetrics' ``CLIPScore`` and of diffusers' evaluation
guide. Images are preprocessed as the CLIP model's own ``CLIPImageProcessor`` config says (resize, centre crop,
normalise: models/nn/clip.CLIPImagePreprocessor) and
prompts tokenized by its tokenizer (77 tokens, truncated). The batch is sharded over this process's
devices (``NamedSharding`` along ``data``, params replicated), as generation is.

The CLIP model is a built-in random one (``tiny-random-clip``, for tests and the smoke run: its
scores are numbers, not judgements), a local directory, or a hub id (Flax weights, or PyTorch
safetensors converted without torch). A process loads and compiles it once; with
``compilation_cache.executables`` the compiled scoring program is also kept across processes
(:mod:`sdjax_runner.engine.executable_cache`), so a warm start neither builds the model
nor traces it: the weights file is read as it is and handed to the stored program.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner import process
from sdjax_runner.console import one_line
from sdjax_runner.records import Quality

log = logging.getLogger("sdjax_runner")


@dataclass
class ClipScorer:
    """A CLIP model placed on ``devices``, with its scoring program per input shape."""

    directory: Path
    params: Any  # placed on ``devices``
    module: Any  # models/nn/clip.CLIPModel; None while the params are the weights file's own tree, read directly
    processor: Any  # models/nn/clip.CLIPImagePreprocessor
    tokenizer: Any
    devices: list
    executables: Optional[str]  # compilation_cache.dir where scoring programs are kept, or None
    load_s: float
    # What it computes of the cosine similarity of image and prompt: "clip_score" (100 x, at least 0) or "pick_score"
    # (exp(logit_scale) x: metrics/pick_score.py)
    formula: str = "clip_score"
    programs: dict = field(default_factory=dict)  # input shapes -> compiled (params, pixels, ids, mask) -> scores
    compile_path: str = ""  # how the last scoring program came: "reused", "executable_cache" or "traced"

    def facts(self) -> list:
        """What, besides its arguments, determines the scoring program: the model's class and config."""
        config = json.loads((self.directory / "config.json").read_text(encoding="utf-8"))
        return [self.formula, "CLIPModel", config]

    def score(self, pixels, ids, mask) -> np.ndarray:
        from jax.errors import JaxRuntimeError

        inputs = (pixels, ids, mask)
        program = self._program(inputs)
        try:
            return np.asarray(program(self.params, *inputs))
        except JaxRuntimeError as exc:
            if self.compile_path != "executable_cache" or self.executables is None:
                raise
            from sdjax_runner.engine import executable_cache

            log.warning("metrics: the stored CLIP score program failed at its first call (%s); removed, tracing "
                        "instead", one_line(exc))
            executable_cache.discard(self.executables, self._key(inputs))
            program = self.programs[tuple(x.shape for x in inputs)] = self._compiled(inputs)
            return np.asarray(program(self.params, *inputs))

    def _program(self, inputs: tuple) -> Callable:
        shapes = tuple(x.shape for x in inputs)
        self.compile_path = "reused"
        if shapes not in self.programs:
            self.compile_path = "executable_cache"
            self.programs[shapes] = self._stored(inputs) or self._compiled(inputs)
        return self.programs[shapes]

    def _key(self, inputs: tuple) -> str:
        from sdjax_runner.engine import executable_cache

        return executable_cache.key(self.facts(), (self.params, *inputs), self.devices)

    def _stored(self, inputs: tuple) -> Optional[Callable]:
        if self.executables is None:
            return None
        from sdjax_runner.engine import executable_cache

        return executable_cache.load(self.executables, self._key(inputs), self.devices, (self.params, *inputs))

    def _compiled(self, inputs: tuple) -> Callable:
        """Trace and compile with the model and its loading (and keep the executable)."""
        import jax
        import jax.numpy as jnp

        from sdjax_runner.engine import compile_cache, executable_cache

        if self.module is None:  # read directly, which only a stored program may take as they are
            self.module, self.params = load_model(self.directory, self.devices)
            self.programs.clear()  # made for the file's own tree, which the loading may rename
            stored = self._stored(inputs)
            if stored is not None:
                return stored
        module, pick = self.module, self.formula == "pick_score"
        self.compile_path = "traced"

        def score(params, pixel_values, input_ids, attention_mask):
            image = module.apply({"params": params}, pixel_values, method="image_features")
            text = module.apply({"params": params}, input_ids, attention_mask, method="text_features")
            image = image / jnp.linalg.norm(image, axis=-1, keepdims=True)
            text = text / jnp.linalg.norm(text, axis=-1, keepdims=True)
            cosine = jnp.sum(image * text, axis=-1)
            return jnp.exp(params["logit_scale"]) * cosine if pick else jnp.maximum(100.0 * cosine, 0.0)

        lowered = jax.jit(score).lower(self.params, *inputs)
        if self.executables is None:
            return lowered.compile()
        hits = compile_cache.hits()
        with compile_cache.bypassed():  # to be stored whole (see executable_cache)
            compiled = lowered.compile()
        if compile_cache.hits() == hits:  # one the persistent cache served would not reload
            executable_cache.save(self.executables, self._key(inputs), compiled, self.devices)
        return compiled




def clip_directory(clip: Any, key: str = "metrics.clip_score.model", source: Optional[str] = None) -> Path:
    """A local directory holding the CLIP model ``clip`` (a ClipScoreConfig, PickScoreConfig) names -- or ``source``
    (a folder or hub id with its tokenizer and image processor) -- built or fetched if need be; ``key`` is what a
    one-line error names."""
    from sdjax_runner.errors import UserError
    from sdjax_runner.models.builtin import build_builtin

    builtin = None if source else getattr(clip, "builtin", None)
    source = str(source or clip.model)
    if builtin:
        return build_builtin(builtin, Path(source).expanduser())
    path = Path(source).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    patterns = ["*.json", "*.txt", "flax_model.msgpack"]
    try:
        directory = Path(snapshot_download(source, revision=clip.revision, allow_patterns=patterns))
        if not (directory / "flax_model.msgpack").is_file():
            directory = Path(snapshot_download(source, revision=clip.revision,
                                               allow_patterns=patterns + ["model.safetensors", "model-*.safetensors",
                                                                          "model.safetensors.index.json"]))
    except Exception as exc:
        raise UserError(key, f"{source} could not be loaded ({type(exc).__name__}); fetch it "
                        f"first with: hf download {source} --include '*.json' '*.txt' 'flax_model.msgpack'",
                        "a cached hub CLIP model, or a local directory") from None
    return directory


def load_model(directory: Path, devices: list, key: str = "metrics.clip_score.model") -> tuple[Any, Any]:
    """(the CLIP model, models/nn/clip.CLIPModel; its params placed on ``devices``): Flax weights, or PyTorch
    safetensors converted without torch."""
    from sdjax_runner.engine.sharded import replicate_sharded
    from sdjax_runner.models.checkpoints import convert_safetensors, find_weights, read_flax
    from sdjax_runner.models.loading import read_config
    from sdjax_runner.models.nn.clip import CLIPModel

    found = find_weights(directory, "transformers", None)
    module = CLIPModel.from_config(read_config(directory))
    if found.format == "flax":
        params = read_flax(found.files[0], module, "transformers")
    elif found.format == "safetensors":
        params = convert_safetensors(found.files, module, "transformers", np.dtype(np.float32))
    else:
        from sdjax_runner.errors import UserError

        raise UserError(key, f"{directory} has no Flax or safetensors CLIP weights",
                        "a CLIP model directory (flax_model.msgpack or model.safetensors)")
    return module, replicate_sharded(params, devices)


def load_scorer(clip: Any, devices: list, executables: Optional[str] = None, formula: str = "clip_score",
                config_key: str = "metrics.clip_score.model") -> ClipScorer:
    """The CLIP model ``clip`` names (a ClipScoreConfig; a PickScoreConfig, whose ``processor`` folder has the
    tokenizer and image processor) on ``devices``, computing ``formula``, loaded once per process. With
    ``executables`` (a compilation_cache.dir), scoring programs are kept there, and a single Flax weights file is
    first read as it is: a stored program that takes it needs neither the model nor tracing. ``config_key``: what a
    one-line error names."""
    processor_source = getattr(clip, "processor", None)
    key = (formula, str(clip.model), getattr(clip, "builtin", None), clip.revision, processor_source,
           tuple(d.id for d in devices), executables)
    scorers = process.current().clip_scorers  # loaded and placed once per process
    if key in scorers:
        return scorers[key]
    from sdjax_runner.models.clip_tokenizer import ClipTokenizer
    from sdjax_runner.models.loading import read_config
    from sdjax_runner.models.nn.clip import CLIPImagePreprocessor

    started = time.perf_counter()
    directory = clip_directory(clip, config_key)
    processing = clip_directory(clip, config_key, processor_source) if processor_source else directory
    weights = directory / "flax_model.msgpack"
    if executables is not None and weights.is_file():
        from flax.serialization import msgpack_restore

        from sdjax_runner.engine.sharded import replicate_sharded

        module, params = None, replicate_sharded(msgpack_restore(weights.read_bytes()), devices)
    else:
        module, params = load_model(directory, devices, config_key)
    processor = CLIPImagePreprocessor.from_config(read_config(processing, "preprocessor_config.json"))
    scorer = ClipScorer(directory, params, module, processor, ClipTokenizer.from_folder(processing), devices,
                        executables, time.perf_counter() - started, formula)
    scorers[key] = scorer
    return scorer


def clip_scores(scorer: ClipScorer, images: list, prompts: list[str]) -> np.ndarray:
    """One score per (image, prompt) pair; the batch is padded to a multiple of the device count."""
    pixels = scorer.processor([image.convert("RGB") for image in images])
    distinct = list(dict.fromkeys(prompts))  # each prompt tokenized once, however many images it has
    row = {prompt: number for number, prompt in enumerate(distinct)}
    rows = [row[prompt] for prompt in prompts]
    tokens = scorer.tokenizer(distinct, padding="max_length", truncation=True,
                              max_length=scorer.tokenizer.model_max_length, return_tensors="np")
    tokens = {key: np.asarray(tokens[key])[rows] for key in ("input_ids", "attention_mask")}
    out = scorer.score(*place_batch(scorer.devices, pixels.astype(np.float32), tokens["input_ids"].astype(np.int32),
                                    tokens["attention_mask"].astype(np.int32)))
    return out[:len(images)]


def place_batch(devices: list, *arrays: np.ndarray) -> list:
    """``arrays`` (one row per image) sharded along ``data`` over ``devices``, each padded with copies of its last row
    to a multiple of the device count (the caller drops what the padding gives)."""
    import jax

    from sdjax_runner.engine.sharded import global_array

    count = len(arrays[0])
    padded = -(-count // len(devices)) * len(devices)
    data = jax.NamedSharding(jax.sharding.Mesh(np.array(devices), ("data",)), jax.P("data"))
    return [global_array(np.concatenate([array, np.repeat(array[-1:], padded - count, axis=0)])
                         if padded > count else array, data) for array in arrays]


def score_run(clip: Any, images: list, prompts: list[str], executables: Optional[str] = None
              ) -> tuple[Optional[np.ndarray], Quality]:
    """(per-image scores or None, the run-level quality fields). Never raises: a CLIP model that
    cannot be loaded or run gives one warning and ``clip_score_error``. ``executables``: see load_scorer."""
    def quality(scores: Optional[np.ndarray], seconds: float, scorer: Optional[ClipScorer], error: Optional[str]):
        if scores is None:
            return Quality(clip_score_error=error, clip_score_s=seconds, clip_model=str(clip.model))
        return Quality(clip_score_mean=float(scores.mean()), clip_score_std=float(scores.std()), clip_score_s=seconds,
                       clip_score_compile_path=scorer.compile_path if scorer else None, clip_model=str(clip.model))

    return scored_run(clip, images, prompts, executables, "clip_score", "metrics.clip_score.model", "CLIP score",
                      quality)


def scored_run(config: Any, images: list, prompts: list[str], executables: Optional[str], formula: str,
               config_key: str, what: str, quality: Callable[..., Quality]) -> tuple[Optional[np.ndarray], Quality]:
    """A CLIP-based metric's run (the CLIP score's, PickScore's): the scorer ``config`` names computing ``formula``
    on each (image, prompt), and ``quality(scores or None, seconds, scorer or None, error or None)``, its run-level
    fields. Never raises: a model that cannot be loaded or run is one warning naming ``what``."""
    import jax

    from sdjax_runner.config.messages import describe

    started = time.perf_counter()
    try:
        scorer = load_scorer(config, jax.local_devices(), executables, formula=formula, config_key=config_key)
        scores = clip_scores(scorer, images, prompts)
    except Exception as exc:
        error = describe(exc) or f"{type(exc).__name__}: {one_line(exc, 300)}"
        log.warning("metrics: no %s for this run: %s", what, error)
        return None, quality(None, time.perf_counter() - started, None, error)
    return scores, quality(scores, time.perf_counter() - started, scorer, None)
