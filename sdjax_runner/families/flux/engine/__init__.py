"""The FLUX.1 family's stages of the generation program (engine/program.py): encode (CLIP's pooled embedding and
T5's hidden states), prepare (the initial noise, packed 2x2 into tokens), denoise (the flow-matching Euler
sampler on the model's shifted schedule, with [dev]'s distilled guidance) and decode (the 16-channel VAE).
The modules are families/flux/models/'s; the stages do what diffusers 0.39's PyTorch ``FluxPipeline.__call__`` does
(tests/fixtures/flux: its values for the runner's noise)."""
