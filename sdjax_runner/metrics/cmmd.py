"""CMMD (Jayasumana et al. 2024, "Rethinking FID: Towards a Better Evaluation Metric for Image Generation"): the
maximum mean discrepancy between two sets of images' CLIP image embeddings, with a Gaussian RBF kernel
(sigma 10) scaled by 1000, in JAX.

The reference is Google's own JAX code (google-research/google-research, ``cmmd/``: distance.py, embedding.py,
io_util.py). :func:`mmd` is its distance.py's estimator term for term, in the same order and the same float
handling: the inputs as float32 (``jnp.asarray``, JAX's float32 default), ``gamma = 1 / (2 * sigma**2)`` a Python
float, squared distances as ``-2 x.y + |x|^2 + |y|^2`` from full matmuls at JAX's default matmul precision, the
three kernel means, ``scale * (k_xx + k_yy - 2 k_xy)`` -- the biased (minimum-variance) estimator of Gretton et al.
2012, Eq. 5, so ``mmd(x, x)`` is 0 and a set of one image is allowed. (JAX's default matmul precision is full
float32 on a CPU; on an accelerator it may use fewer mantissa bits for float32 products, TF32 or bfloat16 passes
-- the reference's too, on the same device.)

:func:`image_embeddings` prepares images as the reference does (io_util.py's ``_center_crop_and_resize``, then
embedding.py): a centre crop to a square of the shorter side, a resize to the model's image size with Pillow's
bicubic filter (which anti-aliases), ``/ 255`` in float32, CLIP's ``(x - mean) / std``, the image embedding (the
visual projection of the class token), divided by its L2 norm. Where it must differ:

* the model: the reference runs scenic's CLIP on OpenAI's ViT-L/14@336 checkpoint (converted from the PyTorch
  file); this runs the runner's own CLIP (models/nn/clip.py: ``CLIPModel.image_features``, transformers'
  ``FlaxCLIPModel.get_image_features`` number for number) from a folder in transformers' layout, loaded as the
  CLIP score loads its model (metrics/clip_score.py). ``openai/clip-vit-large-patch14-336`` is transformers'
  conversion of the same OpenAI checkpoint (not compared here: no such weights on this machine); any other CLIP gives another metric (the tests' tiny random CLIP
  judges nothing);
* the image size and the mean/std are the folder's (``vision_config.image_size``, preprocessor_config.json's
  ``image_mean``/``image_std``: 336 and OpenAI's values, the reference's, for that model);
* the reference's second resize (``jax.image.resize`` to the size the image already has) is left out: JAX
  skips every dimension whose size does not change, so it returns the image as it is;
* images are converted to RGB first (the reference tiles a grayscale image to three channels, the same
  values, and refuses one with an alpha channel); none is dropped (the reference drops the images past the
  last whole batch of 32), and batches are padded instead.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, overload

import numpy as np

# The reference's constants (distance.py): the RBF kernel's bandwidth, and the factor that makes the value readable.
SIGMA = 10.0
SCALE = 1000.0
# Images embedded per call of the compiled program (the reference's default batch size): one program per model.
BATCH = 32


def _mmd(x: Any, y: Any, sigma: float, scale: float) -> Any:
    import jax.numpy as jnp

    x = jnp.asarray(x)
    y = jnp.asarray(y)
    # Recomputed, not kept: as in the reference, where the n x n products would not fit twice for many images.
    x_sqnorms = jnp.diag(jnp.matmul(x, x.T))
    y_sqnorms = jnp.diag(jnp.matmul(y, y.T))
    gamma = 1 / (2 * sigma**2)  # a Python float, as the reference's
    k_xx = jnp.mean(jnp.exp(-gamma * (-2 * jnp.matmul(x, x.T) + jnp.expand_dims(x_sqnorms, 1)
                                      + jnp.expand_dims(x_sqnorms, 0))))
    k_xy = jnp.mean(jnp.exp(-gamma * (-2 * jnp.matmul(x, y.T) + jnp.expand_dims(x_sqnorms, 1)
                                      + jnp.expand_dims(y_sqnorms, 0))))
    k_yy = jnp.mean(jnp.exp(-gamma * (-2 * jnp.matmul(y, y.T) + jnp.expand_dims(y_sqnorms, 1)
                                      + jnp.expand_dims(y_sqnorms, 0))))
    return scale * (k_xx + k_yy - 2 * k_xy)


@functools.cache
def _compiled_mmd() -> Any:
    import jax

    return jax.jit(_mmd, static_argnames=("sigma", "scale"))


def mmd(x: Any, y: Any, sigma: float = SIGMA, scale: float = SCALE) -> Any:
    """The CMMD distance of embeddings ``x`` (n, d) and ``y`` (m, d) -- a float32 scalar array; ``float()`` it.
    Jitted (once per shape pair); ``sigma`` and ``scale`` are Python numbers, fixed in the program as the
    reference's constants are. ValueError for inputs that are not two (rows, d) arrays of one ``d``."""
    x_shape, y_shape = np.shape(x), np.shape(y)
    if len(x_shape) != 2 or len(y_shape) != 2 or x_shape[1] != y_shape[1] or not x_shape[0] or not y_shape[0]:
        raise ValueError(f"mmd takes two (n, d) embedding arrays of one d with a row each, not {x_shape} and {y_shape}")
    return _compiled_mmd()(x, y, sigma=float(sigma), scale=float(scale))


def square_crop(image: Any) -> Any:
    """The reference's centre crop (io_util.py): the largest centred square, its corner rounded down. A PIL image
    or a uint8 (H, W, 3) array in; an RGB PIL image out."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        array = np.asarray(image)
        if array.dtype != np.uint8 or array.ndim != 3 or array.shape[-1] != 3:
            raise ValueError(f"CMMD takes PIL images or uint8 (H, W, 3) arrays, not {array.dtype} {array.shape}")
        image = Image.fromarray(array)
    if image.mode != "RGB":
        image = image.convert("RGB")
    width, height = image.size
    side = min(width, height)
    top, left = (height - side) // 2, (width - side) // 2
    return image.crop((left, top, left + side, top + side))


@dataclass
class ClipEmbedder:
    """A CLIP model placed on ``devices``, and how its images are prepared: CMMD's image embeddings."""

    directory: Path
    module: Any  # models/nn/clip.CLIPModel
    params: Any  # replicated over ``devices``
    processor: Any  # models/nn/clip.CLIPImagePreprocessor: a bicubic resize to size x size, rescale, normalise
    devices: list

    @property
    def size(self) -> int:
        return int(self.processor.crop_size[0])

    def pixels(self, images: Sequence[Any]) -> np.ndarray:
        """(N, 3, size, size) float32, channels first as ``image_features`` takes them: the reference's
        preparation (the module's docstring)."""
        return np.stack([self.processor.one(square_crop(image)) for image in images]).astype(np.float32)

    @functools.cached_property
    def _program(self) -> Any:
        import jax
        import jax.numpy as jnp

        module = self.module

        def embed(params: Any, pixel_values: Any) -> Any:
            features = module.apply({"params": params}, pixel_values, method="image_features")
            return features / jnp.linalg.norm(features, axis=-1, keepdims=True)

        return jax.jit(embed)

    def __call__(self, images: Sequence[Any], batch_size: int = BATCH) -> np.ndarray:
        """(N, projection_dim) float32 unit vectors. Batches of ``batch_size`` (rounded up to a multiple of the
        device count: one compiled program whatever N) sharded over the devices; the last padded with its own
        last image, then dropped. ``images``: a sequence the batches are sliced from (one batch read at a time)."""
        import jax

        from sdjax_runner.engine.sharded import global_array

        count, devices = len(images), len(self.devices)
        if not count:
            raise ValueError("CMMD needs at least one image a set")
        batch = -(-max(1, batch_size) // devices) * devices
        data = jax.NamedSharding(jax.sharding.Mesh(np.array(self.devices), ("data",)), jax.P("data"))
        out = []
        for start in range(0, count, batch):
            pixels = self.pixels(images[start:start + batch])
            kept = len(pixels)
            if kept < batch:
                pixels = np.concatenate([pixels, np.repeat(pixels[-1:], batch - kept, axis=0)])
            out.append(np.asarray(self._program(self.params, global_array(pixels, data)))[:kept])
        return np.concatenate(out)


def load_embedder(clip_folder: Path, devices: Optional[list] = None) -> ClipEmbedder:
    """The CLIP model of ``clip_folder`` (transformers' layout: config.json with a CLIPConfig,
    preprocessor_config.json, flax_model.msgpack or model.safetensors) on ``devices`` (default: this process's),
    loaded by metrics/clip_score.py's loader. Its errors are that loader's (UserError, ValueError, OSError)."""
    import dataclasses

    import jax

    from sdjax_runner.metrics.clip_score import load_model
    from sdjax_runner.models.loading import read_config
    from sdjax_runner.models.nn.clip import CLIPImagePreprocessor

    directory = Path(clip_folder)
    devices = list(devices or jax.local_devices())
    module, params = load_model(directory, devices)
    size = int(module.vision_config["image_size"])
    folder_processor = CLIPImagePreprocessor.from_config(read_config(directory, "preprocessor_config.json"))
    # The reference's order: its crop (square_crop) first, then a resize of the square to the model's size.
    processor = dataclasses.replace(folder_processor, do_resize=True, size=(("height", size), ("width", size)),
                                    resample=3, do_center_crop=False, crop_size=(size, size))
    return ClipEmbedder(directory, module, params, processor, devices)


def image_embeddings(images: Sequence[Any], clip_folder: Optional[Path] = None, *,
                     embedder: Optional[ClipEmbedder] = None, batch_size: int = BATCH) -> np.ndarray:
    """CMMD's embeddings of ``images`` -- a uint8 (N, H, W, 3) array, or a sequence of PIL images or uint8
    (H, W, 3) arrays of any sizes -- with the CLIP model of ``clip_folder`` (or an ``embedder`` already loaded):
    (N, projection_dim) float32, each of norm 1."""
    if embedder is None:
        if clip_folder is None:
            raise ValueError("image_embeddings needs a clip_folder or an embedder")
        embedder = load_embedder(Path(clip_folder))
    images = list(images)
    return embedder(images, min(batch_size, len(images)))


def cmmd_between(images_a: Sequence[Any], images_b: Sequence[Any], clip_folder: Optional[Path] = None, *,
                 embedder: Optional[ClipEmbedder] = None, batch_size: int = BATCH, sigma: float = SIGMA,
                 scale: float = SCALE) -> float:
    """CMMD between two sets of images (each as :func:`image_embeddings` takes them), one CLIP model loaded once."""
    if embedder is None:
        if clip_folder is None:
            raise ValueError("cmmd_between needs a clip_folder or an embedder")
        embedder = load_embedder(Path(clip_folder))
    images_a, images_b = list(images_a), list(images_b)
    batch = min(batch_size, max(len(images_a), len(images_b)))  # one program for both sets
    a, b = embedder(images_a, batch), embedder(images_b, batch)
    return float(mmd(a, b, sigma, scale))


# -- a sweep's settings (metrics.cmmd: comparison.json) -----------------------------------------------------------

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


class ImageFiles(Sequence):
    """Image files read as RGB when a batch asks for them (one batch in memory at a time)."""

    def __init__(self, files: Sequence[Path]):
        self.files = list(files)

    def __len__(self) -> int:
        return len(self.files)

    def _read(self, file: Path) -> Any:
        from PIL import Image

        with Image.open(file) as image:
            return image.convert("RGB")

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> list: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return [self._read(file) for file in self.files[index]]
        return self._read(self.files[index])

    def __iter__(self) -> Iterator[Any]:
        return (self._read(file) for file in self.files)


def cached_hub_model(repo: str) -> Optional[Path]:
    """The local Hugging Face cache's snapshot of ``repo``, without the network; None where it has none."""
    import re

    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        return None
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo, local_files_only=True))
    except Exception:
        return None


def model_folder(given: str) -> Path:
    """A CLIP model folder, or a hub id's snapshot in the local cache; ValueError naming what is missing."""
    path = Path(given).expanduser()
    if path.is_dir():
        return path
    cached = cached_hub_model(given)
    if cached is None:
        raise ValueError(f"{given} is no folder here, nor a hub model in the local Hugging Face cache")
    return cached


def _reference_key(folder: Path, files: list[Path]) -> str:
    """What a folder's embeddings depend on: the model (its folder, config and weight files' names and sizes) and
    every image's bytes."""
    import hashlib

    digest = hashlib.sha256(str(folder.resolve()).encode())
    for part in sorted(folder.iterdir()):
        if part.is_file() and (part.suffix in (".json", ".msgpack", ".safetensors")):
            digest.update(f"{part.name}:{part.stat().st_size}".encode())
    for file in files:
        digest.update(file.name.encode() + hashlib.sha256(file.read_bytes()).digest())
    return digest.hexdigest()


MAX_REMEMBERED_FOLDERS = 4  # reference folders whose embeddings a process keeps (a sweep has one)


def reference_embeddings(embedder: ClipEmbedder, folder: Path, cache_dir: Optional[Path]) -> np.ndarray:
    """The embeddings of the images in ``folder`` (.png/.jpg/.jpeg, sorted by name), kept in ``cache_dir``/cmmd/ as
    a NumPy array (read back with allow_pickle=False: data, never code) under a key of the model and the images'
    bytes; within a process, kept by the model and each image's path, size and modification time (a sweep's jobs
    do not hash the folder again; an image written since is)."""
    from sdjax_runner import process

    files = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
    if not files:
        raise ValueError(f"{folder} holds no .png/.jpg/.jpeg images")
    stamps = tuple((str(p.resolve()), stat.st_size, stat.st_mtime_ns) for p, stat in ((p, p.stat()) for p in files))
    remembered = process.current().cmmd_references
    key = (str(Path(embedder.directory).resolve()), stamps)
    if key not in remembered:
        if len(remembered) >= MAX_REMEMBERED_FOLDERS:
            remembered.pop(next(iter(remembered)))
        remembered[key] = _stored_embeddings(embedder, files, cache_dir)
    return remembered[key]


def _stored_embeddings(embedder: ClipEmbedder, files: list[Path], cache_dir: Optional[Path]) -> np.ndarray:
    """``files``' embeddings from ``cache_dir``/cmmd/ where kept there, else computed and kept."""
    from sdjax_runner.files import private_folder, replaced

    stored = None
    if cache_dir is not None:
        stored = Path(cache_dir) / "cmmd" / f"{_reference_key(embedder.directory, files)}.npy"
        if stored.is_file():
            embeddings = np.load(stored, allow_pickle=False)
            if embeddings.shape[0] == len(files):
                return embeddings
    embeddings = embedder(ImageFiles(files), min(BATCH, len(files)))
    if stored is not None:
        private_folder(stored.parent)
        with replaced(stored) as file:
            np.save(file, embeddings, allow_pickle=False)
    return embeddings


def against_reference(images: Sequence[Any], model: str, reference: str, cache_dir: Optional[Path]) -> dict[str, Any]:
    """One run's CMMD against the ``reference`` folder's images (their embeddings kept in ``cache_dir``/cmmd/):
    quality.json's ``cmmd`` fields. Errors are the loader's and ValueError (no such folder, no images)."""
    from sdjax_runner import process

    folder = model_folder(model)
    held = process.current().clip_scorers  # a sweep's jobs share the loaded model and its programs
    key = ("cmmd", str(folder.resolve()))
    if key not in held:
        held[key] = load_embedder(folder)
    embedder = held[key]
    real = reference_embeddings(embedder, Path(reference).expanduser(), cache_dir)
    found = embedder(list(images), min(BATCH, len(images)))
    return {"cmmd": float(mmd(found, real)), "cmmd_reference": reference, "cmmd_reference_images": len(real),
            "cmmd_model": model}


def judge_settings(files: list[list[Path]], baseline: int, model: str, reference: Optional[str],
                   cache_dir: Optional[Path]) -> dict[str, Any]:
    """CMMD of each setting's images (``files``, one list per setting) against the baseline setting's, and against
    the ``reference`` folder's images where one is given: comparison.json's ``cmmd``."""
    folder = model_folder(model)
    embedder = load_embedder(folder)
    batch = min(BATCH, max(len(f) for f in files))
    embedded = [embedder(ImageFiles(f), batch) if f else None for f in files]
    real = reference_embeddings(embedder, Path(reference).expanduser(), cache_dir) if reference else None
    per_setting = []
    for index, found in enumerate(embedded):
        entry: dict[str, Any] = {"images": 0 if found is None else len(found)}
        if found is not None and index != baseline and embedded[baseline] is not None:
            entry["versus_baseline"] = float(mmd(found, embedded[baseline]))
        if found is not None and real is not None:
            entry["versus_reference"] = float(mmd(found, real))
        per_setting.append(entry)
    return {"model": model, "image_size": embedder.size, "reference": reference,
            "reference_images": None if real is None else len(real), "settings": per_setting}
