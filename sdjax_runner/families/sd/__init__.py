"""Stable Diffusion 1.x, 2.x and XL (inpainting, ControlNet, the refiner): its package (sdjax_runner/families)."""
