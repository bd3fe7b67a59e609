"""FLUX.1 (issue #46): the runner's own flax.linen twins of diffusers 0.39's PyTorch FLUX modules -- the
transformer (:mod:`.transformer`), the 16-channel VAE (:mod:`.autoencoder`) -- and the torch-free conversion of
diffusers' PyTorch safetensors to their parameters (:mod:`.convert`). diffusers has FLUX only in PyTorch; these
match its ``FluxTransformer2DModel`` and ``AutoencoderKL`` number for number (tests/test_flux_modules.py)."""
