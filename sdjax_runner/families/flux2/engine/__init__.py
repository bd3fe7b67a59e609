"""FLUX.2 [klein]'s stages of the generation program (engine/program.py): encode (three of Qwen3's hidden states),
prepare (the patchified noise), denoise (the flow-matching Euler on FLUX.2's fitted shift, and the flow k samplers) and
decode (the batch norm's statistics undone, the 32-channel VAE). The stages do what diffusers 0.39's PyTorch
``Flux2KleinPipeline.__call__`` does (tests/fixtures/flux2: its values for the runner's noise)."""
