"""sdjax-runner: declarative Stable Diffusion inference experiments in JAX/Flax."""

__version__ = "0.1.0"
