"""Stable Diffusion 3 / 3.5 (issue #48): the runner's own flax.linen twin of diffusers 0.39's PyTorch
``SD3Transformer2DModel`` (:mod:`.transformer`, the MMDiT), built on FLUX.1's parts (families/flux/models: the
time-and-text embedding, the adaptive norms, the feed-forward, the 16-channel VAE, the T5 encoder and the
torch-free weight conversion). diffusers has SD 3 only in PyTorch; this matches it number for number
(tests/test_sd3_modules.py)."""
