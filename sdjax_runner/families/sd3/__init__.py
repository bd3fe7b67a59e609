"""Stable Diffusion 3 and 3.5: its package (sdjax_runner/families), built on FLUX.1's parts where they are the same."""
