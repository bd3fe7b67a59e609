"""Model config -> a local diffusers-format directory: a built-in model, a local path or a hub snapshot.

Hub models are fetched with ``huggingface_hub.snapshot_download`` in two steps: configs,
tokenizers and Flax weights first; then, only for components that have no Flax weights, their
PyTorch safetensors (never pickles unless ``model.allow_pickle``). With ``HF_HUB_OFFLINE=1``
(or no network) the local Hugging Face cache is used; a model that is not there gives one
line naming the repository, the files and the command that fetches them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config.checks import is_local
from sdjax_runner.config.folder_files import check_folder
from sdjax_runner.config.schema import ModelConfig
from sdjax_runner.errors import UserError
from sdjax_runner.models.checkpoints import FLAX_FILES, PT_STEMS, find_weights, safetensors_names

KEY = "model.pretrained_model_name_or_path"
# Everything but weights (what a single-file checkpoint's base model gives), and the Flax weights.
CONFIG_PATTERNS = ["model_index.json", "*/*.json", "*/*.txt"]
FIRST_PATTERNS = CONFIG_PATTERNS + [f"*/{name}" for name in FLAX_FILES.values()]


def weight_components(directory: Path) -> dict[str, str]:
    """Component name -> the library that defines it, for components that carry weights."""
    from sdjax_runner.models import model_index

    index = model_index.read(directory)
    return {name: spec[0] for name, spec in index.items()
            if not name.startswith("_") and isinstance(spec, list) and spec[0] in PT_STEMS
            and (directory / name / "config.json").is_file()}


def fetch_command(repo: str, revision: str | None, configs_only: bool = False) -> str:
    """The whole repository but pickles and ONNX exports: Flax weights, or else PyTorch safetensors.
    ``configs_only``: just configs and tokenizers (the base of a single-file checkpoint)."""
    command = f"hf download {repo}" + (f" --revision {revision}" if revision else "")
    if configs_only:
        return command + " --include " + " ".join(f"'{p}'" for p in CONFIG_PATTERNS)
    return command + " --exclude '*.bin' '*.ckpt' '*.onnx*' '*.pb'"


def _snapshot(model: ModelConfig, patterns: list[str]) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    repo, revision = str(model.pretrained_model_name_or_path), model.revision
    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=patterns))
    except (RepositoryNotFoundError, GatedRepoError) as exc:
        raise UserError(KEY, f"{repo}: {type(exc).__name__} (check the name, or log in with `hf auth login` "
                             "for a gated model)", "a hub id such as CompVis/stable-diffusion-v1-4, or a local directory") from None
    except RevisionNotFoundError:
        raise UserError("model.revision", f"{repo} has no revision {revision!r}", "a branch, tag or commit of the repository") from None
    except (LocalEntryNotFoundError, OSError) as exc:
        from huggingface_hub import constants

        why = "HF_HUB_OFFLINE=1" if constants.HF_HUB_OFFLINE else f"the hub cannot be reached: {type(exc).__name__}"
        raise UserError(KEY, f"{repo}{f' (revision {revision})' if revision else ''} is not in the local Hugging Face "
                             f"cache ({why}); fetch it first with: "
                             f"{fetch_command(repo, revision, patterns == CONFIG_PATTERNS)}",
                        "a cached hub model, or a local directory") from None


def checkpoint_components(model: ModelConfig, opened: Any = None) -> Optional[tuple[str, ...]]:
    """The components whose weights ``model.checkpoint`` gives, told from its header by its family's rule
    (config/families.py's ``checkpoint_holds``: FLUX.1's transformer; SD 3's transformer and the text encoders and
    VAE the file holds); none without a checkpoint; None where the file gives the whole pipeline's (the SD
    family's). ``opened``: the checkpoint already opened (config/families.open_checkpoint), else it is opened
    here (its header only)."""
    from sdjax_runner.config.families import FAMILIES

    if not model.checkpoint:
        return ()
    holds = FAMILIES[model.family or "sd"].checkpoint_holds
    if holds is None:
        return None
    if opened is None:
        from sdjax_runner.config.families import open_checkpoint

        opened = open_checkpoint(Path(model.checkpoint).expanduser())
    return holds(opened.keys)


def resolve(model: ModelConfig, allow_pickle: bool = False, checkpoint: Any = None) -> Path:
    """A local directory holding ``model``'s pipeline (built or fetched if need be); ``checkpoint``:
    ``model.checkpoint`` already opened, where the caller has it."""
    from sdjax_runner.models.builtin import build_builtin

    name = str(model.pretrained_model_name_or_path)
    if model.builtin:
        return build_builtin(model.builtin, Path(name).expanduser())
    if is_local(name):
        return Path(name).expanduser()
    directory = _snapshot(model, CONFIG_PATTERNS if model.checkpoint else FIRST_PATTERNS)
    if not (directory / "model_index.json").is_file():
        raise UserError(KEY, f"{name} has no model_index.json: not a diffusers-format pipeline",
                        "a diffusers pipeline repository")
    check_folder(directory, KEY, "a diffusers pipeline repository, its files as diffusers writes them")
    in_file = checkpoint_components(model, checkpoint)
    if in_file is None:  # every component's weights come from the checkpoint
        return directory
    # No Flax weights: fall back to the PyTorch ones, as safetensors -- the variant's where the repository
    # has them (model.variant=fp16: half the download, the fp32 files not fetched), else the plain ones. A FLUX.1
    # or SD 3 single-file checkpoint holds the transformer (SD 3's maybe its text encoders and VAE): the other
    # components' weights come from the base.
    with_weights = {name: library for name, library in weight_components(directory).items() if name not in in_file}
    for variant in ([model.variant] if model.variant else []) + [None]:
        lacking = [(component, library) for component, library in with_weights.items()
                   if find_weights(directory / component, library, model.variant).format == "missing"]
        if not lacking:
            break
        patterns = []
        for component, library in lacking:
            single, index = safetensors_names(library, variant)[0]  # one file, or shards with their index
            shards = single.removesuffix(".safetensors") + "-*.safetensors"
            patterns += [f"{component}/{single}", f"{component}/{shards}", f"{component}/{index}"]
            if allow_pickle and variant is None:
                patterns += [f"{component}/{PT_STEMS[library]}.bin"]
        directory = _snapshot(model, patterns)
    return directory
