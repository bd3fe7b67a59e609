"""Make the PickScore reference (issue #61, preference scores) in ``tests/fixtures/pickscore/``.

PickScore (Kirstain et al. 2023, yuvalkirstain/PickScore_v1) is a fine-tune of LAION's CLIP ViT-H/14, published as a
transformers ``CLIPModel`` (config.json + weights) whose tokenizer and image processor are those of
``laion/CLIP-ViT-H-14-laion2B-s32B-b79K``: two folders. Its score is the published inference code's (the project's
README, "Inference with PickScore"), transcribed in :func:`published_pickscore` below::

    image_inputs = processor(images=pil_images, padding=True, truncation=True, max_length=77, return_tensors="pt")
    text_inputs = processor(text=prompt, padding=True, truncation=True, max_length=77, return_tensors="pt")
    image_embs = model.get_image_features(**image_inputs); image_embs = image_embs / image_embs.norm(dim=-1, keepdim=True)
    text_embs = model.get_text_features(**text_inputs); text_embs = text_embs / text_embs.norm(dim=-1, keepdim=True)
    scores = model.logit_scale.exp() * (text_embs @ image_embs.T)[0]

This script (the reference environment: torch, transformers 4.57 with its PyTorch CLIP, Pillow; versions in
``VERSIONS.json``) builds a tiny model of PickScore's kind -- CLIP-H's ``gelu`` towers, random weights from a fixed
seed, its logit scale at PickScore's trained ln(100) -- with transformers' own PyTorch ``CLIPModel`` and saves it as
published: ``model/`` (``save_pretrained``: config.json, model.safetensors) and ``processor/`` (the runner's
``tiny-random-clip`` tokenizer files, given with ``--tokenizer``, and CLIP-H's image processor settings at 32 pixels).
It draws three images (``images/*.png``, fixed seed, three sizes) and writes the published code's score of each with
its prompt (``scores.json``).

Run from the checkout's root::

    /work/refvenv/bin/python tests/helpers/make_pickscore_reference.py --tokenizer CACHE/models/tiny-random-clip-v1
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from reference_outputs import tokenizer_main, write_outputs  # (tests/helpers/, beside this script)
from transformers import AutoModel, AutoProcessor, CLIPConfig, CLIPModel

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "pickscore"
PROMPTS = ["a red cube on a table", "an astronaut riding a horse on the moon, highly detailed",
           "a watercolour of a lighthouse at dawn"]
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
# laion/CLIP-ViT-H-14-laion2B-s32B-b79K's preprocessor_config.json, at 32 pixels for the tiny towers.
PREPROCESSOR = {"crop_size": {"height": 32, "width": 32}, "do_center_crop": True, "do_convert_rgb": True,
                "do_normalize": True, "do_rescale": True, "do_resize": True,
                "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "CLIPImageProcessor",
                "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3,
                "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 32}, "processor_class": "CLIPProcessor"}


def tiny_config(vocab_size: int, bos: int, eos: int) -> CLIPConfig:
    text = {"vocab_size": vocab_size, "hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
            "num_attention_heads": 3, "max_position_embeddings": 77, "hidden_act": "gelu", "bos_token_id": bos,
            "eos_token_id": eos, "pad_token_id": eos}
    vision = {"hidden_size": 40, "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 4,
              "image_size": 32, "patch_size": 8, "hidden_act": "gelu"}
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=24, logit_scale_init_value=math.log(100))


def published_pickscore(model, processor, prompt: str, pil_images: list) -> list[float]:
    """The PickScore README's inference code (calc_probs without the softmax), on CPU in float32."""
    image_inputs = processor(images=pil_images, padding=True, truncation=True, max_length=77, return_tensors="pt")
    text_inputs = processor(text=prompt, padding=True, truncation=True, max_length=77, return_tensors="pt")
    with torch.no_grad():
        image_embs = model.get_image_features(**image_inputs)
        image_embs = image_embs / torch.norm(image_embs, dim=-1, keepdim=True)
        text_embs = model.get_text_features(**text_inputs)
        text_embs = text_embs / torch.norm(text_embs, dim=-1, keepdim=True)
        scores = model.logit_scale.exp() * (text_embs @ image_embs.T)[0]
    return scores.tolist()


def images() -> list[Image.Image]:
    rng = np.random.default_rng(0)
    out = []
    for height, width in ((64, 64), (48, 80), (90, 40)):
        y, x = np.mgrid[0:height, 0:width]
        base = np.stack([x / width, y / height, (x + y) / (width + height)], axis=-1) * 200
        pixels = np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)
        out.append(Image.fromarray(pixels, "RGB"))
    return out


def write(out: Path, tokenizer: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    (out / "processor").mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer / name, out / "processor" / name)
    (out / "processor" / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    vocab = json.loads((tokenizer / "vocab.json").read_text())
    torch.manual_seed(0)
    model = CLIPModel(tiny_config(len(vocab), vocab["<|startoftext|>"], vocab["<|endoftext|>"])).eval()
    model.save_pretrained(out / "model", safe_serialization=True)
    # As the README loads them: AutoModel from the model's folder, AutoProcessor from the processor's.
    model = AutoModel.from_pretrained(out / "model").eval()
    processor = AutoProcessor.from_pretrained(out / "processor")
    (out / "images").mkdir()
    rows = []
    for number, (image, prompt) in enumerate(zip(images(), PROMPTS, strict=True)):
        name = f"{number}.png"
        image.save(out / "images" / name)
        with Image.open(out / "images" / name) as saved:  # scored as read back, as the runner reads its images
            [score] = published_pickscore(model, processor, prompt, [saved.convert("RGB")])
        rows.append({"image": name, "prompt": prompt, "pick_score": score})
    write_outputs(out, rows)


if __name__ == "__main__":
    tokenizer_main(__doc__, write, OUT)
