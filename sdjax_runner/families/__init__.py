"""The model families the runner runs, one package each (docs/architecture.md, "Where a new model family goes").

A family's package holds everything that is that family's, each part in the layer it belongs to, named after it:

    families/<name>/config.py          ENTRY: what the config knows of it (config/family_entry.FamilyEntry): its
                                       published pipelines, modes, defaults, built-in models, refusals
    families/<name>/models/            its modules, converters and loader; models/entry.py's LOADER
                                       (models/family_loader.FamilyLoader)
    families/<name>/engine/            its stages and sampler model; engine/entry.py's FAMILY (engine/family.Family)

Each layer's registry (config/families.py, models/loaders.py, engine/families.py) gathers its part of every family
named in :data:`NAMES`; nothing outside a family's package branches on its name (tests/test_families.py). What
families share lives once in the layers beside them: attention, CLIP, T5, the VAE and safetensors reading in
models/nn and models/, the modes and samplers in engine/.

This module imports nothing: a module of any layer may read :data:`NAMES`."""

# The families, in the order the registries list them (and messages name them); the first is the default family
# (config/families.DEFAULT), the one a model is where nothing says another.
NAMES = ("sd", "flux", "sd3", "flux2")
