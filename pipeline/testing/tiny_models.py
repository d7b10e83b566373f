"""Small random-initialised checkpoints of the real architectures, for tests and CPU demos.

``build_tiny_models(root)`` writes, with the libraries' own config classes and
``save_pretrained``, a directory per model that loads through the normal
``from_pretrained(local_dir)`` code path, exactly like downloaded weights:

* ``tiny-clip``   ``CLIPModel`` + ``CLIPProcessor`` (224 px, shorter side + centre crop)
* ``tiny-siglip`` ``SiglipModel`` + ``SiglipProcessor`` (224 px, squash)
* ``tiny-blip``   ``BlipForConditionalGeneration`` + ``BlipProcessor`` (384 px, squash)
* ``tiny-llava``  ``LlavaForConditionalGeneration`` + ``LlavaProcessor`` (the generic
  image-text-to-text path; 224 px)
* ``tiny-clip-768`` ``tiny-clip`` with projection_dim 768 (CLIP ViT-L/14's embedding
  size, for the LAION heads)
* ``tiny-convnext`` ``ConvNextForImageClassification`` + ``ConvNextImageProcessor``
  (labels ``clear``/``watermark``; 224 px: shorter side 256, centre crop)
* ``tiny-qwen2-vl`` ``Qwen2VLForConditionalGeneration`` + ``Qwen2VLProcessor`` (byte-level
  BPE with Qwen2-VL's special tokens and a Qwen-style chat template; dynamic resolution,
  patch 14, merge 2, at most 112x112 px per image): multi-frame captioning
  (``captioning.frames``, several images in one chat turn)
* ``tiny-xclip``  ``XCLIPModel`` + ``XCLIPProcessor`` (VideoMAE image processor, 224 px
  shorter side + centre crop; CLIP tokenizer; ``num_frames`` 4): the ``xclip`` video
  embedding
* ``tiny-heads``  random weights of the two LAION heads of ``models.heads`` at their real
  size (768 inputs): ``aesthetic.safetensors`` (improved-aesthetic-predictor MLP) and
  ``nsfw.safetensors`` (CLIP-based NSFW detector), for ``tiny-clip-768``

Input sizes, image processors and tokenizers are those of the real models (BLIP's is
bert-base-uncased plus ``[DEC]``, taken from the bundled MiniLM vocabulary; CLIP, SigLIP
and LLaVA get byte-level BPE / Unigram tokenizers trained on the bundled COCO captions),
so pre-processing, tokenisation and generation run the real code; only the widths and
depths are tiny and the weights random. Their embeddings and captions are therefore junk:
use them to exercise the pipeline, never to judge output quality.

``full_size=True`` keeps the real widths and depths (CLIP ViT-B/32, SigLIP base, BLIP base)
with random weights: compute per image is that of the real model, which is what
``bench/gpu_check.py`` needs when no real weights are at hand.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
CAPTIONS = REPO / "data" / "photos" / "captions.jsonl"
SEED = 0
NAMES = ("tiny-clip", "tiny-siglip", "tiny-blip", "tiny-llava", "tiny-convnext", "tiny-clip-768",
         "tiny-heads", "tiny-qwen2-vl", "tiny-xclip")


def _captions() -> list[str]:
    if not CAPTIONS.is_file():
        return ["a photo of a cat", "a dog on a beach", "two people riding bikes"]
    rows = [json.loads(line) for line in CAPTIONS.read_text().splitlines() if line.strip()]
    return [c for r in rows for c in r.get("captions", [])]


def _clip_tokenizer(vocab_size: int):
    from transformers import CLIPTokenizer

    return CLIPTokenizer().train_new_from_iterator(_captions(), vocab_size=vocab_size,
                                                   show_progress=False)


def _vision(full_size: bool, image_size: int, patch: int) -> dict:
    if full_size:
        return {"image_size": image_size, "patch_size": patch}
    return {"image_size": image_size, "patch_size": patch, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "initializer_range": 0.5}  # wide: outputs then visibly depend on the image


def _text(full_size: bool, vocab_size: int, **extra) -> dict:
    if full_size:
        return {"vocab_size": vocab_size, **extra}
    return {"vocab_size": vocab_size, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 2, "initializer_range": 0.1, **extra}


def build_clip_768(path: Path, full_size: bool = False) -> Path:
    """``build_clip`` with projection_dim 768, the embedding size of CLIP ViT-L/14 (what the
    LAION heads of ``models.heads`` take); tiny towers unless ``full_size``."""
    return build_clip(path, full_size, projection_dim=768)


def build_clip(path: Path, full_size: bool = False, projection_dim: int | None = None) -> Path:
    """CLIP ViT-B/32 layout (224 px, patch 32), tiny unless ``full_size``."""
    from transformers import CLIPConfig, CLIPImageProcessorPil, CLIPModel, CLIPProcessor

    tok = _clip_tokenizer(1000)
    config = CLIPConfig(
        text_config=_text(full_size, len(tok), max_position_embeddings=77,
                          bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                          pad_token_id=tok.pad_token_id),
        vision_config=_vision(full_size, 224, 32),
        projection_dim=projection_dim or (512 if full_size else 64))
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 224},
                                            crop_size={"height": 224, "width": 224})
    return _save(path, CLIPModel(config), CLIPProcessor(image_processor, tok))


def build_siglip(path: Path, full_size: bool = False) -> Path:
    """SigLIP base layout (224 px, patch 16, squash resize), tiny unless ``full_size``."""
    from transformers import (SiglipConfig, SiglipImageProcessorPil, SiglipModel,
                              SiglipProcessor, T5Tokenizer)

    tok = T5Tokenizer().train_new_from_iterator(_captions(), vocab_size=800,
                                                show_progress=False)
    config = SiglipConfig(
        text_config=_text(full_size, len(tok), max_position_embeddings=64,
                          pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                          bos_token_id=tok.eos_token_id),
        vision_config=_vision(full_size, 224, 16))
    image_processor = SiglipImageProcessorPil(size={"height": 224, "width": 224})
    return _save(path, SiglipModel(config), SiglipProcessor(image_processor, tok))


def build_blip(path: Path, full_size: bool = False) -> Path:
    """BLIP captioning layout (384 px, patch 16, bert-base-uncased + ``[DEC]`` tokenizer)."""
    from transformers import (BertTokenizer, BlipConfig, BlipForConditionalGeneration,
                              BlipImageProcessorPil, BlipProcessor)

    from pipeline.models.text import BUNDLED_MINILM, resolve_model_dir

    tok = BertTokenizer.from_pretrained(resolve_model_dir(BUNDLED_MINILM))
    tok.add_special_tokens({"bos_token": "[DEC]", "additional_special_tokens": ["[ENC]"]})
    text = _text(full_size, len(tok), bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id,
                 sep_token_id=tok.sep_token_id, eos_token_id=tok.sep_token_id)
    if not full_size:
        text["encoder_hidden_size"] = 32
    config = BlipConfig(text_config=text, vision_config=_vision(full_size, 384, 16),
                        projection_dim=512 if full_size else 32)
    image_processor = BlipImageProcessorPil(size={"height": 384, "width": 384})
    return _save(path, BlipForConditionalGeneration(config), BlipProcessor(image_processor, tok))


def build_llava(path: Path, full_size: bool = False) -> Path:
    """A tiny LLaVA (CLIP vision tower + Llama decoder): the generic image-text-to-text path."""
    from transformers import (CLIPImageProcessorPil, LlavaConfig, LlavaForConditionalGeneration,
                              LlavaProcessor, LlamaConfig)

    from transformers import LlamaTokenizer

    tok = LlamaTokenizer().train_new_from_iterator(_captions(), vocab_size=600,
                                                   show_progress=False)
    tok.add_special_tokens({"pad_token": "<pad>", "additional_special_tokens": ["<image>"]})
    vision = _vision(full_size, 224, 32)
    vision.update(model_type="clip_vision_model")
    llama = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64,
                        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id)
    config = LlavaConfig(vision_config=vision, text_config=llama.to_dict(),
                         image_token_index=tok.convert_tokens_to_ids("<image>"),
                         vision_feature_layer=-1)
    image_processor = CLIPImageProcessorPil(size={"shortest_edge": 224},
                                            crop_size={"height": 224, "width": 224})
    template = ("{% for m in messages %}{% for c in m['content'] %}{% if c['type'] == 'image' %}"
                "<image>{% else %}{{ c['text'] }}{% endif %}{% endfor %}{% endfor %}")
    processor = LlavaProcessor(image_processor=image_processor, tokenizer=tok, patch_size=32,
                               vision_feature_select_strategy="full", chat_template=template)
    return _save(path, LlavaForConditionalGeneration(config), processor)


QWEN_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>",
                "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
                 "{% for c in m['content'] %}{% if c['type'] == 'image' %}"
                 "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}"
                 "{% endfor %}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def build_qwen2_vl(path: Path, full_size: bool = False) -> Path:
    """A tiny Qwen2-VL (ViT with 2x2 patch merger + Qwen2 decoder with M-RoPE); images of
    at most 112x112 px (16 patches of 14 px, 4 tokens after merging) keep CPU runs
    short. ``full_size`` is not offered (a 2B decoder is not a test model)."""
    from transformers import (Qwen2Tokenizer, Qwen2VLConfig, Qwen2VLForConditionalGeneration,
                              Qwen2VLImageProcessorPil, Qwen2VLProcessor)

    from pipeline.models.processors import processor_without_video

    tok = Qwen2Tokenizer().train_new_from_iterator(_captions(), vocab_size=600,
                                                   show_progress=False,
                                                   new_special_tokens=list(QWEN_SPECIAL))
    ids = dict(zip(QWEN_SPECIAL, tok.convert_tokens_to_ids(list(QWEN_SPECIAL))))
    text = _text(False, len(tok), num_key_value_heads=2, max_position_embeddings=4096,
                 rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                  "mrope_section": [2, 3, 3]},  # head_dim 16: 8 pairs
                 bos_token_id=ids["<|endoftext|>"], eos_token_id=ids["<|im_end|>"],
                 pad_token_id=ids["<|endoftext|>"])
    vision = {"depth": 2, "embed_dim": 32, "hidden_size": 32, "num_heads": 2, "mlp_ratio": 2,
              "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2,
              "initializer_range": 0.5}
    config = Qwen2VLConfig(text_config=text, vision_config=vision,
                           image_token_id=ids["<|image_pad|>"],
                           video_token_id=ids["<|video_pad|>"],
                           vision_start_token_id=ids["<|vision_start|>"],
                           vision_end_token_id=ids["<|vision_end|>"])
    image_processor = Qwen2VLImageProcessorPil(min_pixels=28 * 28, max_pixels=112 * 112,
                                               patch_size=14, merge_size=2,
                                               temporal_patch_size=2)
    processor_without_video(Qwen2VLProcessor)(  # the parts fit together
        image_processor=image_processor, tokenizer=tok, video_processor=None,
        chat_template=QWEN_TEMPLATE)
    # saved part by part: a processor without its video processor cannot save itself
    _save(path, Qwen2VLForConditionalGeneration(config), image_processor)
    tok.save_pretrained(path)
    (path / "chat_template.jinja").write_text(QWEN_TEMPLATE)
    (path / "processor_config.json").write_text(
        json.dumps({"processor_class": "Qwen2VLProcessor"}, indent=2) + "\n")
    return path


def build_xclip(path: Path, full_size: bool = False) -> Path:
    """X-CLIP base layout (224 px, patch 32, 8 frames when ``full_size``; tiny towers and
    4 frames otherwise) with a VideoMAE image processor and a CLIP tokenizer."""
    from transformers import VideoMAEImageProcessorPil, XCLIPConfig, XCLIPModel, XCLIPProcessor

    tok = _clip_tokenizer(1000)
    vision = _vision(full_size, 224, 32)
    text = _text(full_size, len(tok), max_position_embeddings=77, bos_token_id=tok.bos_token_id,
                 eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    dim = 512 if full_size else 32
    if not full_size:
        vision.update(num_frames=4, mit_hidden_size=dim, mit_intermediate_size=64,
                      mit_num_attention_heads=2)
    config = XCLIPConfig(text_config=text, vision_config=vision, projection_dim=dim,
                         prompt_num_attention_heads=2 if not full_size else 8)
    image_processor = VideoMAEImageProcessorPil(size={"shortest_edge": 224},
                                                crop_size={"height": 224, "width": 224})
    return _save(path, XCLIPModel(config), XCLIPProcessor(image_processor, tok))


def build_convnext(path: Path, full_size: bool = False) -> Path:
    """A two-label image classifier (``clear``, ``watermark``): ConvNeXt-T layout and the
    facebook/convnext-tiny-224 image processor (224 px, crop_pct 0.875, ImageNet mean/std),
    tiny widths and depths unless ``full_size``."""
    from transformers import (ConvNextConfig, ConvNextForImageClassification,
                              ConvNextImageProcessorPil)

    labels = {"id2label": {0: "clear", 1: "watermark"}, "label2id": {"clear": 0, "watermark": 1}}
    tiny = {} if full_size else {"hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1],
                                 "initializer_range": 0.2}  # wide: scores vary by image
    model = ConvNextForImageClassification(ConvNextConfig(image_size=224, **tiny, **labels))
    processor = ConvNextImageProcessorPil(size={"shortest_edge": 224}, crop_pct=224 / 256,
                                          image_mean=[0.485, 0.456, 0.406],
                                          image_std=[0.229, 0.224, 0.225])
    return _save(path, model, processor)


def build_heads(path: Path, full_size: bool = False) -> Path:
    """The LAION aesthetic and NSFW heads (``models.heads`` presets, 768 inputs) with random
    weights, saved as safetensors; a ``config.json`` lists the files (heads themselves
    have none: their architecture is the spec's preset). ``full_size`` changes nothing."""
    from safetensors.torch import save_file

    from pipeline.models import heads

    path.mkdir(parents=True, exist_ok=True)
    files = {"laion-aesthetic": "aesthetic.safetensors", "laion-nsfw": "nsfw.safetensors"}
    for module, name in ((heads.laion_aesthetic(768), files["laion-aesthetic"]),
                         (heads.NsfwMlp(768), files["laion-nsfw"])):
        save_file({k: v.contiguous() for k, v in module.state_dict().items()}, str(path / name))
    (path / "config.json").write_text(json.dumps({"heads": files}, indent=2) + "\n")
    return path


BUILDERS = {"tiny-clip": build_clip, "tiny-siglip": build_siglip, "tiny-blip": build_blip,
            "tiny-llava": build_llava, "tiny-convnext": build_convnext,
            "tiny-clip-768": build_clip_768, "tiny-heads": build_heads,
            "tiny-qwen2-vl": build_qwen2_vl, "tiny-xclip": build_xclip}


def _save(path: Path, model, processor) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(path)
    processor.save_pretrained(path)
    return path


def build_tiny_models(root: str | os.PathLike, names: tuple[str, ...] = NAMES,
                      full_size: bool = False) -> dict[str, Path]:
    """Build the named checkpoints under ``root`` (skipping those already there, as marked
    by their ``config.json``); return name -> directory. Deterministic (seeded)."""
    import torch

    from transformers.utils import logging as hf_logging

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    hf_logging.disable_progress_bar()
    out = {}
    for name in names:
        path = Path(root) / name
        if not (path / "config.json").is_file():
            torch.manual_seed(SEED)
            log.info("building %s in %s", name, path)
            BUILDERS[name](path, full_size=full_size)
        out[name] = path
    return out
