"""Writing model folders as diffusers and transformers lay them out, with no library of theirs: what the built-in
models (models/builtin.py) are written with, so that they load exactly like a hub model.

Each writer gives the files those libraries' ``save_pretrained`` write for the same configs and weights, byte for
byte (diffusers 0.39 and transformers 4.57, the last releases with Flax; ``tests/test_builtin_writer.py`` writes
every tiny built-in both ways and compares the bytes):

* a diffusers component: ``config.json`` -- every ``__init__`` argument of the Flax class with its value, plus
  ``_class_name`` and ``_diffusers_version``, keys sorted, indented by 2 -- and its Flax weights
  (``flax.serialization.to_bytes`` of the parameter tree);
* a transformers model: ``config.json`` -- what ``PretrainedConfig.to_diff_dict`` keeps for these configs (every
  key of the model's own config class, the token ids, ``architectures``, ``model_type``, ``transformers_version``)
  -- and ``flax_model.msgpack``;
* a CLIP BPE tokenizer (``vocab.json``, ``merges.txt``, ``tokenizer_config.json``, ``special_tokens_map.json``),
  a T5 tokenizer (``tokenizer.json`` from the ``tokenizers`` library, its two JSON files), a CLIP image
  processor's ``preprocessor_config.json`` and a pipeline's ``model_index.json``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

DIFFUSERS_VERSION = "0.39.0"
TRANSFORMERS_VERSION = "4.57.6"

# diffusers' Flax classes' __init__ arguments that go into config.json, with their defaults there (the UNet's,
# ControlNet's and VAE's are the runner's own modules' tables: families/sd/models/unet.py, families/sd/models/controlnet.py,
# models/nn/vae.py).
FLAX_VAE_KEYS = ("in_channels", "out_channels", "down_block_types", "up_block_types", "block_out_channels",
                 "layers_per_block", "act_fn", "latent_channels", "norm_num_groups", "sample_size", "scaling_factor")
SCHEDULER_DEFAULTS: dict[str, dict[str, Any]] = {
    "FlaxPNDMScheduler": dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear",
                              trained_betas=None, skip_prk_steps=False, set_alpha_to_one=False, steps_offset=0,
                              prediction_type="epsilon"),
    "FlaxEulerDiscreteScheduler": dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02,
                                       beta_schedule="linear", trained_betas=None, prediction_type="epsilon",
                                       timestep_spacing="linspace"),
}
# transformers' config classes: the keys to_diff_dict writes for them, with their defaults.
CLIP_TEXT_DEFAULTS: dict[str, Any] = dict(
    vocab_size=49408, hidden_size=512, intermediate_size=2048, projection_dim=512, num_hidden_layers=12,
    num_attention_heads=8, max_position_embeddings=77, hidden_act="quick_gelu", layer_norm_eps=1e-05,
    attention_dropout=0.0, initializer_range=0.02, initializer_factor=1.0, pad_token_id=1, bos_token_id=49406,
    eos_token_id=49407)
CLIP_VISION_DEFAULTS: dict[str, Any] = dict(
    hidden_size=768, intermediate_size=3072, projection_dim=512, num_hidden_layers=12, num_attention_heads=12,
    num_channels=3, image_size=224, patch_size=32, hidden_act="quick_gelu", layer_norm_eps=1e-05,
    attention_dropout=0.0, initializer_range=0.02, initializer_factor=1.0)
T5_DEFAULTS: dict[str, Any] = dict(
    vocab_size=32128, d_model=512, d_kv=64, d_ff=2048, num_layers=6, num_decoder_layers=None, num_heads=8,
    relative_attention_num_buckets=32, relative_attention_max_distance=128, dropout_rate=0.1,
    layer_norm_epsilon=1e-06, initializer_factor=1.0, feed_forward_proj="relu", is_encoder_decoder=True,
    use_cache=True, pad_token_id=0, eos_token_id=1, classifier_dropout=0.0)
# CLIPImageProcessor's preprocessor_config.json, but for its sizes.
CLIP_IMAGE_PROCESSOR: dict[str, Any] = dict(
    do_center_crop=True, do_convert_rgb=True, do_normalize=True, do_rescale=True, do_resize=True,
    image_mean=[0.48145466, 0.4578275, 0.40821073], image_processor_type="CLIPImageProcessor",
    image_std=[0.26862954, 0.26130258, 0.27577711], resample=3, rescale_factor=1 / 255)


def write_json(path: Path, value: Any, ascii_only: bool = True) -> None:
    """``value`` as both libraries write their JSON files: keys sorted, indented by 2, a final newline."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=ascii_only) + "\n", encoding="utf-8")


def write_weights(path: Path, params: Any) -> None:
    """A Flax parameter tree as both libraries write it (``flax.serialization.to_bytes``)."""
    from flax.serialization import to_bytes

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(to_bytes(params))


def diffusers_component(folder: Path, class_name: str, config: Mapping[str, Any], params: Any = None,
                        config_name: str = "config.json") -> None:
    """A diffusers component folder: ``config_name`` holding ``config`` (every ``__init__`` argument of the
    class, as diffusers writes them all) and ``params`` (diffusers' Flax file name) where given."""
    write_json(folder / config_name, {"_class_name": class_name, "_diffusers_version": DIFFUSERS_VERSION, **config})
    if params is not None:
        write_weights(folder / "diffusion_flax_model.msgpack", params)


def scheduler(folder: Path, class_name: str, config: Mapping[str, Any]) -> None:
    """``scheduler/scheduler_config.json`` of diffusers' Flax scheduler ``class_name``: its defaults, ``config``'s
    values where it has them (ValueError for a key the class does not take)."""
    defaults = SCHEDULER_DEFAULTS[class_name]
    unknown = set(config) - set(defaults)
    if unknown:
        raise ValueError(f"{class_name} takes no {sorted(unknown)}")
    diffusers_component(folder, class_name, {**defaults, **config}, config_name="scheduler_config.json")


def model_index(folder: Path, pipeline: str, components: Mapping[str, Sequence[Any]]) -> None:
    """A pipeline's ``model_index.json`` as diffusers' ``save_pretrained`` writes it."""
    write_json(folder / "model_index.json", {"_class_name": pipeline, "_diffusers_version": DIFFUSERS_VERSION,
                                             **{name: list(spec) for name, spec in components.items()}})


def clip_text_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A CLIPTextConfig's keys as transformers writes them (nested in a CLIPConfig: without architectures)."""
    return {**CLIP_TEXT_DEFAULTS, **config, "model_type": "clip_text_model"}


def transformers_model(folder: Path, architecture: str, config: Mapping[str, Any], params: Any) -> None:
    """A transformers model folder: ``config.json`` (``config``: its keys as :func:`clip_text_config` and the
    like give them) and ``flax_model.msgpack``."""
    write_json(folder / "config.json", {**config, "architectures": [architecture],
                                        "transformers_version": TRANSFORMERS_VERSION})
    write_weights(folder / "flax_model.msgpack", params)


def clip_model_config(text: Mapping[str, Any], vision: Mapping[str, Any], projection_dim: int) -> dict[str, Any]:
    """A CLIPConfig's keys as transformers writes them."""
    vision_config = {**CLIP_VISION_DEFAULTS, **vision, "model_type": "clip_vision_model"}
    return dict(initializer_factor=1.0, logit_scale_init_value=2.6592, model_type="clip",
                projection_dim=projection_dim, text_config=clip_text_config(text), vision_config=vision_config)


def t5_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A T5Config's keys as transformers writes them for an encoder (FLUX.1's and SD 3's ``text_encoder``: no
    cache, not an encoder-decoder), with the keys T5Config derives from ``feed_forward_proj``."""
    values = {**T5_DEFAULTS, **config, "is_encoder_decoder": False, "use_cache": False, "decoder_start_token_id": 0,
              "model_type": "t5"}
    if values["num_decoder_layers"] is None:
        values["num_decoder_layers"] = values["num_layers"]
    projection = values["feed_forward_proj"].split("-")
    values["is_gated_act"] = projection[0] == "gated"
    values["dense_act_fn"] = "gelu_new" if values["feed_forward_proj"] == "gated-gelu" else projection[-1]
    return values


def _special(content: str, normalized: bool) -> dict[str, Any]:
    return dict(content=content, lstrip=False, normalized=normalized, rstrip=False, single_word=False)


def clip_tokenizer(folder: Path, tokens: Sequence[str], merges: Sequence[tuple[str, str]],
                   pad_token: str = "<|endoftext|>", model_max_length: int = 77, pad_as_text: bool = False) -> None:
    """A CLIP BPE tokenizer as transformers' ``CLIPTokenizer.save_pretrained`` writes it: ``tokens`` (their ids
    are their places; the last two are ``<|startoftext|>`` and ``<|endoftext|>``) and ``merges`` by rank. A pad
    token that is not ``<|endoftext|>`` (SDXL's second tokenizer's ``!``) is an added token, not normalised.
    ``pad_as_text``: the pad token's entry in special_tokens_map.json as a tokenizer made from its two files
    writes it (its text; one read back from a saved folder writes every entry in full)."""
    vocabulary = {token: number for number, token in enumerate(tokens)}  # a repeated token: its last id
    start, end = tokens[-2], tokens[-1]
    write_json(folder / "vocab.json", vocabulary, ascii_only=False)
    (folder / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges), encoding="utf-8")
    added = {vocabulary[start]: _special(start, True), vocabulary[end]: _special(end, True)}
    if pad_token != end:
        added[vocabulary[pad_token]] = _special(pad_token, False)
    write_json(folder / "tokenizer_config.json", dict(
        added_tokens_decoder={str(number): dict(added[number], special=True) for number in sorted(added)},
        bos_token=start, clean_up_tokenization_spaces=False, eos_token=end, errors="replace", extra_special_tokens={},
        model_max_length=model_max_length, pad_token=pad_token, tokenizer_class="CLIPTokenizer", unk_token=end))
    write_json(folder / "special_tokens_map.json", dict(
        bos_token=_special(start, True), eos_token=_special(end, True),
        pad_token=pad_token if pad_as_text else _special(pad_token, pad_token == end), unk_token=_special(end, True)))


def t5_tokenizer(folder: Path, tokenizer: Any, specials: Sequence[str], model_max_length: int = 512) -> None:
    """A T5 tokenizer as transformers' ``T5TokenizerFast.save_pretrained`` writes it: ``tokenizer`` (a
    ``tokenizers.Tokenizer`` whose ids 0, 1, 2 are ``specials``: pad, end, unknown) with those as special added
    tokens in ``tokenizer.json``, and its two JSON files."""
    from tokenizers import AddedToken

    pad, end, unknown = specials
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False) for token in specials])
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    write_json(folder / "tokenizer_config.json", dict(
        add_prefix_space=None,
        added_tokens_decoder={str(number): dict(_special(token, False), special=True)
                              for number, token in enumerate(specials)},
        additional_special_tokens=[], clean_up_tokenization_spaces=False, eos_token=end, extra_ids=0,
        extra_special_tokens={}, model_max_length=model_max_length, pad_token=pad, tokenizer_class="T5TokenizerFast",
        unk_token=unknown))
    write_json(folder / "special_tokens_map.json", dict(eos_token=end, pad_token=pad, unk_token=unknown))


def clip_image_processor(folder: Path, image_size: int) -> None:
    """``preprocessor_config.json`` of a CLIPImageProcessor for square ``image_size`` images."""
    write_json(folder / "preprocessor_config.json", dict(
        CLIP_IMAGE_PROCESSOR, crop_size=dict(height=image_size, width=image_size),
        size=dict(shortest_edge=image_size)))
