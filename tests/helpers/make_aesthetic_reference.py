"""Make the LAION aesthetic predictor reference (issue #61, aesthetic scores) in ``tests/fixtures/aesthetic/``.

The predictor (christophschuhmann/improved-aesthetic-predictor, ``sac+logos+ava1-l14-linearMSE.pth``, the one LAION
filtered LAION-Aesthetics with) is five linear layers (no activations) over the L2-normalised CLIP ViT-L/14 image
embedding. Its ``simple_inference.py``, transcribed in :func:`published_aesthetic` below::

    model = MLP(768); model.load_state_dict(torch.load("...pth"))
    model2, preprocess = clip.load("ViT-L/14")
    image_features = model2.encode_image(preprocess(pil_image).unsqueeze(0))
    im_emb_arr = normalized(image_features.cpu().detach().numpy())
    prediction = model(torch.from_numpy(im_emb_arr).float())

The CLIP step here is transformers' ``CLIPModel.get_image_features`` with its ``CLIPProcessor``: transformers'
conversion of the checkpoint ``clip.load`` reads (openai/clip-vit-large-patch14), whose preprocessing is the same
bicubic resize of the short side, centre crop and normalisation.

This script (the reference environment: torch, transformers 4.57's PyTorch CLIP, Pillow; versions in
``VERSIONS.json``) builds, from fixed seeds, a tiny CLIP of ViT-L/14's kind (``quick_gelu``) with transformers' own
``CLIPModel`` and saves it as openai/clip-vit-large-patch14 is published (``clip/``: config.json, model.safetensors,
the runner's ``tiny-random-clip`` tokenizer files given with ``--tokenizer``, the image processor at 32 pixels), and
the predictor's MLP -- the published class's layers on the tiny CLIP's projection width -- saved as the published file
is, by ``torch.save`` of its state dict (``predictor.pth``: a pickle, which the runner reads only after the one-time
conversion, tools/pickle_to_safetensors.py). It scores the PickScore fixture's three images
(``scores.json``).

Run from the checkout's root::

    /work/refvenv/bin/python tests/helpers/make_aesthetic_reference.py --tokenizer CACHE/models/tiny-random-clip-v1
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from reference_outputs import tokenizer_main, write_outputs  # (tests/helpers/, beside this script)
from torch import nn
from transformers import CLIPConfig, CLIPModel, CLIPProcessor

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "aesthetic"
IMAGES = Path(__file__).resolve().parents[1] / "fixtures" / "pickscore" / "images"
TOKENIZER_FILES = ("vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json")
PREPROCESSOR = {"crop_size": {"height": 32, "width": 32}, "do_center_crop": True, "do_convert_rgb": True,
                "do_normalize": True, "do_rescale": True, "do_resize": True,
                "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_processor_type": "CLIPImageProcessor",
                "image_std": [0.26862954, 0.26130258, 0.27577711], "resample": 3,
                "rescale_factor": 0.00392156862745098, "size": {"shortest_edge": 32}}


class MLP(nn.Module):
    """simple_inference.py's MLP (a LightningModule there; its forward and layers are these)."""

    def __init__(self, input_size: int):
        super().__init__()
        self.input_size = input_size
        self.layers = nn.Sequential(
            nn.Linear(self.input_size, 1024), nn.Dropout(0.2), nn.Linear(1024, 128), nn.Dropout(0.2),
            nn.Linear(128, 64), nn.Dropout(0.1), nn.Linear(64, 16), nn.Linear(16, 1))

    def forward(self, x):
        return self.layers(x)


def normalized(a, axis=-1, order=2):
    """simple_inference.py's."""
    l2 = np.atleast_1d(np.linalg.norm(a, order, axis))
    l2[l2 == 0] = 1
    return a / np.expand_dims(l2, axis)


def published_aesthetic(mlp: MLP, clip: CLIPModel, processor: CLIPProcessor, pil_image) -> float:
    image = processor(images=pil_image, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        image_features = clip.get_image_features(pixel_values=image)
        im_emb_arr = normalized(image_features.cpu().detach().numpy())
        prediction = mlp(torch.from_numpy(im_emb_arr).float())
    return float(prediction[0, 0])


def tiny_clip_config(vocab_size: int, bos: int, eos: int) -> CLIPConfig:
    text = {"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "max_position_embeddings": 77, "hidden_act": "quick_gelu",
            "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos}
    vision = {"hidden_size": 40, "intermediate_size": 80, "num_hidden_layers": 2, "num_attention_heads": 4,
              "image_size": 32, "patch_size": 8, "hidden_act": "quick_gelu"}
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=24)


def write(out: Path, tokenizer: Path) -> None:
    if out.exists():
        shutil.rmtree(out)
    clip_dir = out / "clip"
    clip_dir.mkdir(parents=True)
    vocab = json.loads((tokenizer / "vocab.json").read_text())
    torch.manual_seed(0)
    clip = CLIPModel(tiny_clip_config(len(vocab), vocab["<|startoftext|>"], vocab["<|endoftext|>"])).eval()
    clip.save_pretrained(clip_dir, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(tokenizer / name, clip_dir / name)
    (clip_dir / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR, indent=2) + "\n")
    torch.manual_seed(1)
    mlp = MLP(clip.config.projection_dim).eval()
    with torch.no_grad():  # PyTorch's initialisation leaves the output near 0: a spread the check can see
        mlp.layers[7].bias.fill_(5.0)
        mlp.layers[0].weight.mul_(8.0)
    torch.save(mlp.state_dict(), out / "predictor.pth")
    clip = CLIPModel.from_pretrained(clip_dir).eval()
    processor = CLIPProcessor.from_pretrained(clip_dir)
    mlp = MLP(clip.config.projection_dim).eval()
    mlp.load_state_dict(torch.load(out / "predictor.pth", weights_only=True))
    rows = []
    for path in sorted(IMAGES.glob("*.png")):
        with Image.open(path) as image:
            rows.append({"image": path.name, "aesthetic": published_aesthetic(mlp, clip, processor, image.convert("RGB"))})
    write_outputs(out, rows)


if __name__ == "__main__":
    tokenizer_main(__doc__, write, OUT)
