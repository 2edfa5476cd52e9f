"""The student's tokenizer, chat template and processor, built locally (no Hub, no torchvision needed).

    tok = build_tokenizer()                     # Qwen2Tokenizer, left padding, chat template attached
    proc = build_processor("qwen3-vl", tok, image_processor_settings("qwen3-vl", small=True))
    proc.save_pretrained(folder)                # tokenizer + image processor + processor/video configs
    proc = load_processor(folder)               # AutoProcessor where torchvision works, else the shim
    chat_template()                             # training/templates/chat_template.jinja, as text

Why it looks like this (see research/learnability.md):
- Qwen's own pre-tokenizer regex, so every digit is its own token (`click(80,150)` -> `8 0 , 1 5 0`): copying
  coordinates from the prompt to the answer is then easy to learn.
- The BPE is trained on a fixed, generic built-in corpus (GUI words, JSON of the tool call, plain English), never
  on task data: names seen in training data must not become single tokens, or a small model cannot copy an
  unseen name letter by letter. Training is deterministic (same corpus, same settings, same merges).
- Qwen's special tokens come first, in Qwen's order, so the ids are stable across builds; `<tool_call>`,
  `</tool_call>`, `<thinking>`, `</thinking>` are added tokens that decoding keeps (the action parser needs them).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

TEMPLATE_PATH = Path(__file__).parent / "templates" / "chat_template.jinja"

# Qwen2/2.5/3-VL special tokens, in the released vocabulary's order (ids 0..13 here).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
EXTRA_TOKENS = ["<tool_call>", "</tool_call>", "<thinking>", "</thinking>"]
DEFAULT_VOCAB_SIZE = 1024
MAX_TOKEN_CHARS = 8  # caps merges: long words stay split into reusable pieces

# A generic corpus: the output format, UI vocabulary and everyday English. No task instances, no names.
_CORPUS = """\
You are a helpful assistant that operates a computer. Look at the screen and the task, then act.
Reply with your reasoning, a short description of the action, and one tool call.
The tool computer_use takes an action and its arguments. Coordinates are pixels of the screenshot.
{"name": "computer_use", "arguments": {"action": "click", "x": 1, "y": 2}}
{"name": "computer_use", "arguments": {"action": "double_click", "x": 3, "y": 4}}
{"name": "computer_use", "arguments": {"action": "right_click", "x": 5, "y": 6}}
{"name": "computer_use", "arguments": {"action": "move", "x": 7, "y": 8}}
{"name": "computer_use", "arguments": {"action": "drag", "x1": 9, "y1": 0, "x2": 1, "y2": 2}}
{"name": "computer_use", "arguments": {"action": "scroll", "x": 3, "y": 4, "dx": 0, "dy": 5}}
{"name": "computer_use", "arguments": {"action": "type", "text": "some text"}}
{"name": "computer_use", "arguments": {"action": "key", "keys": ["ctrl", "a"]}}
{"name": "computer_use", "arguments": {"action": "key", "keys": ["enter"]}}
{"name": "computer_use", "arguments": {"action": "wait", "seconds": 1}}
{"name": "computer_use", "arguments": {"action": "done"}}
{"name": "computer_use", "arguments": {"action": "fail"}}
Action: click the button. Action: type the text into the field. Action: press the key.
Task: Click on the button. Task: Select the option from the list and press submit.
Task: Enter the text into the text field. Task: Click on the link. Task: Click on the tab.
Previous steps: none. Previous steps: the click did not change the page.
Current screen: a form with a text input, a checkbox, a radio button and a submit button.
Screen before step two: the menu was closed. The dialog shows a message and an OK button.
UI elements:
button "Submit" @ (1,2)
input_text "" @ (3,4)
link "Next page" @ (5,6)
div "Tab" @ (7,8)
span "Label" @ (9,0)
label "Check box" @ (1,2)
textarea "" @ (3,4)
select "Option" @ (5,6)
The page has a header, a menu, a search box, a table, a list of items and a footer.
Open the window, close the window, scroll down the page, scroll up the page, then wait.
Find the item in the list, select it, copy the value, paste it in the other field and save.
When the task is done, say done. When the task cannot be done, say fail.
The quick brown fox jumps over the lazy dog. A small cat sat on the warm mat by the door.
It was a clear day and the people in the town went to work, to school and to the market.
This is a test of the system. There are many ways to do it, but one of them is the best.
What is the time? Where is the file? Who has the key? Which one should we choose, and why?
Please read the instructions carefully before you start, and check your answer at the end.
You operate a computer through the computer_use tool to complete the task.
x, y are pixels of the screenshot as you see it (origin top-left).
x, y are relative positions from 0 to 1000 (0,0 top-left; 1000,1000 bottom-right).
Step 1: Click the button -> click(1,2) [ok]. Step 2: Enter the text -> type("word") [ok].
Step 3: Press enter -> key(["enter"]) [no change]. Step 4: Scroll down -> scroll(1,2,0,3) [ok].
Enter the text, select the item, submit the form, expand the section, pick the date and the color.
"""


@lru_cache(maxsize=1)
def chat_template() -> str:
    """The chat template (Qwen-style; `{% generation %}` marks assistant tokens for assistant-only loss)."""
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def _train_bpe(vocab_size: int):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    bpe = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    bpe.normalizer = normalizers.NFC()
    # Qwen's regex isolates each digit (\p{N} alone) before the byte-level mapping.
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        show_progress=False,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        max_token_length=MAX_TOKEN_CHARS,
    )
    bpe.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    return bpe


def build_tokenizer(vocab_size: int = DEFAULT_VOCAB_SIZE):
    """Train the BPE (deterministic) and wrap it as a left-padding Qwen2Tokenizer with the chat template."""
    import tempfile

    from transformers import PreTrainedTokenizerFast, Qwen2Tokenizer

    if vocab_size < 256 + len(SPECIAL_TOKENS) + len(EXTRA_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} is too small: need at least the 256 bytes and the special tokens")
    fast = PreTrainedTokenizerFast(
        tokenizer_object=_train_bpe(vocab_size),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.add_tokens(EXTRA_TOKENS)  # plain added tokens: kept by decode(skip_special_tokens=True)
    fast.chat_template = chat_template()
    # Reload through Qwen2Tokenizer so the saved tokenizer_config names the Qwen class and left padding.
    with tempfile.TemporaryDirectory() as d:
        fast.save_pretrained(d)
        tok = Qwen2Tokenizer.from_pretrained(d, padding_side="left")
    tok.chat_template = chat_template()
    return tok


def special_ids(tok) -> dict[str, int]:
    """Ids of the Qwen special tokens and the extra format tokens in `tok`."""
    ids = {t: tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS + EXTRA_TOKENS}
    missing = [t for t, i in ids.items() if i is None or i == tok.unk_token_id]
    if missing:
        raise ValueError(f"tokenizer lacks the Qwen tokens {missing}")
    return ids


# ------------------------------------------------------------------------------------------ processor
# Qwen's video processors need torchvision, and the CPU torch here has no working torchvision (its wheels are CUDA
# builds: `import torchvision` raises). The processors are image-only for us, so the shim lets video_processor be
# None and saves the folder by hand, in the layout that stock AutoProcessor loads where torchvision exists.
_PROCESSOR_CLASS = {"qwen3-vl": "Qwen3VLProcessor", "qwen2.5-vl": "Qwen2_5_VLProcessor"}
_VIDEO_PROCESSOR_CLASS = {"qwen3-vl": "Qwen3VLVideoProcessor", "qwen2.5-vl": "Qwen2VLVideoProcessor"}
_CLIP_MEAN, _CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]


class _NoVideo:
    """Mixin: accept video_processor=None and save without a video processor object."""

    arch = ""

    def check_argument_for_proper_class(self, argument_name, argument):
        if argument_name == "video_processor" and argument is None:
            return None
        return super().check_argument_for_proper_class(argument_name, argument)

    def save_pretrained(self, save_directory, **kwargs):
        """Tokenizer + image processor files, plus processor_config.json and video_preprocessor_config.json."""
        import json

        out = Path(save_directory)
        out.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save_pretrained(out)
        self.image_processor.save_pretrained(out)
        (out / "processor_config.json").write_text(
            json.dumps({"processor_class": _PROCESSOR_CLASS[self.arch]}, indent=2)
        )
        ip = self.image_processor
        video = {
            "video_processor_type": _VIDEO_PROCESSOR_CLASS[self.arch],
            "processor_class": _PROCESSOR_CLASS[self.arch],
            "size": dict(ip.size),
            "patch_size": ip.patch_size,
            "temporal_patch_size": ip.temporal_patch_size,
            "merge_size": ip.merge_size,
            "image_mean": list(ip.image_mean),
            "image_std": list(ip.image_std),
            "do_resize": True,
            "do_rescale": True,
            "do_normalize": True,
            "do_convert_rgb": True,
        }
        (out / "video_preprocessor_config.json").write_text(json.dumps(video, indent=2))
        return [str(out)]


def _shim_class(arch: str):
    from transformers import Qwen2_5_VLProcessor, Qwen3VLProcessor

    base = {"qwen3-vl": Qwen3VLProcessor, "qwen2.5-vl": Qwen2_5_VLProcessor}[arch]
    return type(f"Image{base.__name__}", (_NoVideo, base), {"arch": arch})


def image_processor_settings(arch: str, small: bool) -> dict:
    """Image processor kwargs: the released model's, or (small=True) a low pixel floor for CPU models.

    The floor matters: a 160x210 MiniWoB screenshot stays at native size (35 image tokens for Qwen3-VL) instead of
    being upscaled to the released minimum (65536 px for Qwen3-VL)."""
    if arch == "qwen3-vl":
        kw = dict(
            patch_size=16,
            merge_size=2,
            temporal_patch_size=2,
            image_mean=[0.5] * 3,
            image_std=[0.5] * 3,
            size={"shortest_edge": 65536, "longest_edge": 16777216},
        )
    elif arch == "qwen2.5-vl":
        kw = dict(
            patch_size=14,
            merge_size=2,
            temporal_patch_size=2,
            image_mean=_CLIP_MEAN,
            image_std=_CLIP_STD,
            size={"shortest_edge": 3136, "longest_edge": 12845056},
        )
    else:
        raise ValueError(f"unknown arch {arch!r}: use qwen3-vl or qwen2.5-vl")
    if small:
        kw["size"] = {"shortest_edge": 64 * 64, "longest_edge": 512 * 512}
    return kw


def build_processor(arch: str, tok, image_kwargs: dict):
    """The image-only processor (PIL image processor + shim) around `tok`."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    ip = Qwen2VLImageProcessorPil(**image_kwargs)
    return _shim_class(arch)(image_processor=ip, tokenizer=tok, video_processor=None, chat_template=tok.chat_template)


def torchvision_works() -> bool:
    """True when torchvision is installed and imports (the CPU torch here has only broken CUDA wheels)."""
    from transformers.utils import is_torchvision_available

    if not is_torchvision_available():
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 - a CUDA wheel on CPU torch raises RuntimeError, not ImportError
        return False
    return True


def _arch_of_folder(path: str) -> str:
    """qwen3-vl or qwen2.5-vl, from processor_config.json or config.json (local folder or Hub id)."""
    import json

    from transformers.utils import cached_file

    for name in ("processor_config.json", "config.json"):
        f = cached_file(path, name, _raise_exceptions_for_missing_entries=False)
        if f:
            data = json.loads(Path(f).read_text())
            kind = f"{data.get('processor_class', '')} {data.get('model_type', '')}".lower()
            if "qwen3" in kind:
                return "qwen3-vl"
            if "qwen2_5" in kind:
                return "qwen2.5-vl"
    raise ValueError(
        f"{path}: not a Qwen3-VL or Qwen2.5-VL folder (no processor_config.json or config.json naming one)"
    )


def load_processor(path: str):
    """The processor of a model folder or Hub id: stock AutoProcessor where torchvision works, else the shim."""
    from transformers import AutoProcessor, AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    if torchvision_works():
        proc = AutoProcessor.from_pretrained(path)
    else:
        tok = AutoTokenizer.from_pretrained(path)
        ip = Qwen2VLImageProcessorPil.from_pretrained(path)
        proc = _shim_class(_arch_of_folder(path))(
            image_processor=ip, tokenizer=tok, video_processor=None, chat_template=tok.chat_template
        )
    proc.tokenizer.padding_side = "left"  # batched generation needs left padding, whatever the folder says
    return proc
