"""The checkpoint every peer serves: a random-weight Llama with a sentencepiece tokenizer.

llama.cpp's ``convert_hf_to_gguf.py`` reads a Llama vocabulary from ``tokenizer.model``
(sentencepiece); a tokenizer.json-only checkpoint goes down its GPT-2 path, which rejects an
unknown pre-tokenizer such as the demo model's byte-level one. So the peer checkpoint carries
both files, made from one sentencepiece model:

- ``tokenizer.model``: BPE, byte fallback, trained deterministically (one thread, no
  sampling) on the running Python's standard-library sources. No normalisation and no
  whitespace folding, so the text reaching the model is exactly the text sent, which is
  what llama.cpp's SPM tokenizer assumes.
- ``tokenizer.json``: the same vocabulary as a Hugging Face BPE (merges ranked by the merged
  piece's score, Metaspace with a prefix on the first word, byte fallback), what DualPace
  and transformers read. ``check_tokenizers_agree`` proves the two encode alike.

Weights: ``dualpace.demo_model.random_llama_weights`` (fixed seed), fp32, plain RoPE, and the
shape the llama.cpp orientation numbers were taken on (hidden 512, 8 layers, 8 heads,
vocab 32000; ~58M parameters).
"""

from __future__ import annotations

import io
import json
import sysconfig
from pathlib import Path

import sentencepiece as spm
from safetensors.torch import save_file
from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors

from dualpace.demo_model import DemoSpec, llama_config, random_llama_weights

PEER_SPEC = DemoSpec(hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=8,
                     intermediate_size=1376, max_position_embeddings=4096)
UNK, BOS, EOS = "<unk>", "<s>", "</s>"

# Strings the two tokenizers must split alike: spaces in runs, digits, code, tabs and
# newlines, accents, CJK and an emoji (byte fallback). ("<s>" inside a text is left out on
# purpose: Hugging Face tokenizers, DualPace and vLLM read it as the special token.)
AGREEMENT_TEXTS = [
    "Hello world, 123 and 4567.89!",
    "  two leading spaces and   three inside",
    "def f(x):\n    return x * 2\n\n\tindented\ttabs",
    "naïve café — déjà vu; 東京タワー; 🙂👍",
    "",
    " ",
    "The quick brown fox jumps over the lazy dog. " * 4,
]


def corpus_lines() -> list[str]:
    """Non-empty lines of the standard library's top-level modules, in file-name order."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    lines: list[str] = []
    for path in sorted(stdlib.glob("*.py")):
        lines += [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    if not lines:
        raise RuntimeError(f"no training text under {stdlib}")
    return lines


def train_sentencepiece(vocab_size: int) -> bytes:
    """A serialized sentencepiece BPE model; same bytes for the same Python and vocab size."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines()), model_writer=out, vocab_size=vocab_size,
        model_type="bpe", byte_fallback=True, character_coverage=1.0, split_digits=True,
        normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        unk_piece=UNK, bos_piece=BOS, eos_piece=EOS,
        num_threads=1, input_sentence_size=0, shuffle_input_sentence=False,
        max_sentence_length=16384, minloglevel=2)
    return out.getvalue()


def hf_tokenizer_from_sentencepiece(proto: bytes) -> Tokenizer:
    """The sentencepiece BPE model as a Hugging Face tokenizer (tokenizer.json)."""
    sp = spm.SentencePieceProcessor(model_proto=proto)
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    normal = {p for p, i in vocab.items()
              if not (sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i))}
    # sentencepiece BPE applies the highest-scoring merge first; in a BPE model the score
    # falls with the id, so a merge's rank is its result's id (then its left part's id).
    merges = sorted(
        (vocab[p], vocab[p[:k]], p[:k], p[k:]) for p in normal for k in range(1, len(p))
        if p[:k] in normal and p[k:] in normal)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[(a, b) for _, _, a, b in merges],
                               unk_token=UNK, fuse_unk=True, byte_fallback=True))
    # sentencepiece's dummy prefix is unconditional ("  a" -> "▁▁▁a"), as in llama.cpp's SPM
    # tokenizer; a Metaspace pre-tokenizer would skip it before a leading space.
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"),
                                           normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(content=" ", left=1)])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, vocab[BOS])])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in (UNK, BOS, EOS)])
    return tok


def check_tokenizers_agree(model_dir: Path, texts: list[str] = AGREEMENT_TEXTS) -> None:
    """Raise unless tokenizer.model and tokenizer.json give the same ids for ``texts`` and
    for every 97th line of the training text."""
    sp = spm.SentencePieceProcessor(model_file=str(model_dir / "tokenizer.model"))
    hf = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    for text in [*texts, *corpus_lines()[::97]]:
        a, b = sp.encode(text), hf.encode(text, add_special_tokens=False).ids
        if a != b:
            raise AssertionError(f"tokenizers disagree on {text!r}: sentencepiece {a}, "
                                 f"tokenizer.json {b}")


def make_peer_model(out_dir: str | Path, spec: DemoSpec = PEER_SPEC,
                    vocab_size: int = 32000) -> Path:
    """Write the checkpoint to ``out_dir`` (created) and check its two tokenizers agree."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    proto = train_sentencepiece(vocab_size)
    (out / "tokenizer.model").write_bytes(proto)
    hf_tokenizer_from_sentencepiece(proto).save(str(out / "tokenizer.json"))
    check_tokenizers_agree(out)
    config = llama_config(spec, vocab_size, bos=1, eos=2, rope_theta=10000.0)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 1, "eos_token_id": 2}, indent=2))
    (out / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": BOS, "eos_token": EOS, "unk_token": UNK, "add_bos_token": True,
        "model_max_length": spec.max_position_embeddings,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                          "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"),
    }, indent=2))
    tmp = out / "model.safetensors.tmp"
    save_file(random_llama_weights(spec, vocab_size), str(tmp), metadata={"format": "pt"})
    tmp.replace(out / "model.safetensors")  # last: a complete file marks a complete model
    return out
