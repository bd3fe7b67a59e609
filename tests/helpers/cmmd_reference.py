"""Google's CMMD reference, transcribed to NumPy (and Pillow), for tests/test_cmmd.py.

Read from google-research/google-research (the CMMD code's home; github.com/google-research/cmmd is not stored
here), at these commits:

* ``cmmd/distance.py`` @ 4c4299485319ed72ef782020c81784be5468924e: ``mmd`` -- transcribed term for term in
  :func:`mmd` (the JAX ``jnp`` calls as ``np`` ones; ``_SIGMA = 10``, ``_SCALE = 1000``).
* ``cmmd/io_util.py`` @ 4c4299485319ed72ef782020c81784be5468924e: ``_center_crop_and_resize`` and ``_read_image``
  (a centred square of the shorter side, a Pillow bicubic resize, ``float32``; a grayscale image tiled to three
  channels), then ``compute_embeddings_for_dir``'s ``/ 255.0``: :func:`pixels`.
* ``cmmd/embedding.py`` @ 8d8a4f1b27753c7580d16261a1468b3d6ad2c3d3 (5b09c22d73a9d35eb6c5d2a99b95677a45053466 only
  changes the copyright year): ``_clip_preprocess`` -- ``jax.image.resize`` to the size the image already has, then
  scenic's ``clip.normalize_image``, ``(x - IMAGE_MEAN) / IMAGE_STD`` (google-research/scenic
  ``scenic/projects/baselines/clip/model.py`` @ 03c3032af3e4885489d2e201cf18331753b3c366, OpenAI's mean and std;
  float32, as JAX computes it); and the embedding, scenic's ``CLIP.encode_image`` with ``normalize=True``
  (``scenic/projects/baselines/clip/layers.py``, same commit): divided by its L2 norm.
"""

from __future__ import annotations

import numpy as np

SIGMA = 10
SCALE = 1000
# scenic's IMAGE_MEAN / IMAGE_STD (OpenAI CLIP's), which the tiny CLIP's preprocessor_config.json also holds.
IMAGE_MEAN = np.array([0.48145466, 0.4578275, 0.40821073])
IMAGE_STD = np.array([0.26862954, 0.26130258, 0.27577711])


def mmd(x: np.ndarray, y: np.ndarray, dtype=np.float64) -> float:
    """distance.py's ``mmd``, in ``dtype`` (float64: what its float32 arithmetic approximates)."""
    x = np.asarray(x, dtype=dtype)
    y = np.asarray(y, dtype=dtype)

    x_sqnorms = np.diag(np.matmul(x, x.T))
    y_sqnorms = np.diag(np.matmul(y, y.T))

    gamma = 1 / (2 * SIGMA**2)
    k_xx = np.mean(np.exp(-gamma * (-2 * np.matmul(x, x.T) + np.expand_dims(x_sqnorms, 1)
                                    + np.expand_dims(x_sqnorms, 0))))
    k_xy = np.mean(np.exp(-gamma * (-2 * np.matmul(x, y.T) + np.expand_dims(x_sqnorms, 1)
                                    + np.expand_dims(y_sqnorms, 0))))
    k_yy = np.mean(np.exp(-gamma * (-2 * np.matmul(y, y.T) + np.expand_dims(y_sqnorms, 1)
                                    + np.expand_dims(y_sqnorms, 0))))
    return float(SCALE * (k_xx + k_yy - 2 * k_xy))


def pixels(image, size: int) -> np.ndarray:
    """One PIL image (RGB or L) as the reference hands it to the model: (size, size, 3) float32, normalised."""
    from PIL import Image

    w, h = image.size
    side = min(w, h)
    top = (h - side) // 2
    left = (w - side) // 2
    image = image.crop((left, top, left + side, top + side)).resize((size, size), resample=Image.BICUBIC)
    x = np.asarray(image).astype(np.float32)
    if x.ndim == 2:
        x = np.tile(x[..., np.newaxis], (1, 1, 3))
    x = x / 255.0
    return (x - IMAGE_MEAN.astype(np.float32)) / IMAGE_STD.astype(np.float32)
