"""The Stable Diffusion family as the engine runs it: its entry (:mod:`.entry`) on the shared stages (engine/encode.py,
engine/modes, engine/samplers, engine/decode.py), which the SD family defined and the others reuse in part."""
