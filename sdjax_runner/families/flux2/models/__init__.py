"""FLUX.2 [klein]'s modules, the runner's own flax.linen twins of diffusers 0.39's PyTorch classes -- the transformer
(:mod:`.transformer`), the VAE with its batch-norm statistics (:mod:`.autoencoder`) -- and its loader
(:mod:`.pipeline`); the Qwen3 text encoder and its tokenizer are shared (models/nn/qwen3.py, qwen_tokenizer.py)."""
