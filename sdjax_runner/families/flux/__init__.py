"""FLUX.1 [dev] and [schnell]: its package (sdjax_runner/families)."""
