"""FLUX.2 [klein] (issue #63): Black Forest Labs' 4B and 9B flow transformers with a Qwen3 text encoder and a
32-channel VAE, as diffusers' Flux2KleinPipeline runs them."""
