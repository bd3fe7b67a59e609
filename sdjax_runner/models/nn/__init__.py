"""The runner's own flax.linen building blocks that more than one model family uses (issue #60): a module built
from a published ``config.json`` (:mod:`.config`), the VAE (:mod:`.vae`), CLIP's text and vision towers
(:mod:`.clip`). A family's own modules live in its package (``families/sd/models``, ``families/flux/models``, ``families/sd3/models``).
Each has the parameter names of diffusers' or transformers' Flax module of the same name, so published Flax
``.msgpack`` folders and PyTorch safetensors (converted without torch) load unchanged."""
