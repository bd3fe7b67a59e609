"""The Stable Diffusion family's own flax.linen modules (issue #60): the UNet of SD 1.x, 2.x and XL
(:mod:`.unet`) and the ControlNet (:mod:`.controlnet`), with diffusers' Flax parameter names."""
