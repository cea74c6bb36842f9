"""Tokenizer, chat template (vs transformers) and incremental detokenization."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dualpace.tokenizer.chat_template import TemplateError
from dualpace.tokenizer.detokenizer import IncrementalDetokenizer
from dualpace.tokenizer.tokenizer import Tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "  Be brief.  "}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "Ünïcödé ✓ 日本"}],
]


@pytest.fixture(scope="module")
def tok(llama_checkpoint):
    return Tokenizer(llama_checkpoint[0])


@pytest.fixture(scope="module")
def hf_tok(llama_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(llama_checkpoint[0]))


def test_encode_adds_bos_and_round_trips(tok):
    ids = tok.encode("héllo")
    assert ids[0] == 256 and ids[1:] == list("héllo".encode())
    assert tok.decode(ids) == "héllo"
    assert tok.encode("hi", add_special_tokens=False) == [104, 105]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(tok, hf_tok, messages, add_generation_prompt):
    ours = tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt)
    theirs = hf_tok.apply_chat_template(messages, add_generation_prompt=add_generation_prompt,
                                        tokenize=False)
    assert ours == theirs
    ids = tok.encode_chat(messages, add_generation_prompt=add_generation_prompt)
    assert ids.count(256) == 1  # BOS from the template only, not added twice


def test_template_is_sandboxed(tmp_path, tok):
    from dualpace.tokenizer.chat_template import ChatTemplate

    evil = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(TemplateError):
        evil.render([{"role": "user", "content": "x"}])
    raising = ChatTemplate("{{ raise_exception('roles must alternate') }}")
    with pytest.raises(TemplateError, match="alternate"):
        raising.render([])


@settings(max_examples=300, deadline=None)
@given(st.one_of(
    st.binary(max_size=60),
    st.text(max_size=30).map(lambda s: s.encode("utf-8")),
    st.lists(st.sampled_from(["a", "é", "✓", "日本", "🙂", " "]), max_size=20)
      .map(lambda parts: "".join(parts).encode("utf-8")),
))
def test_incremental_detokenizer_never_splits_characters(tok, data):
    ids = list(data)  # the byte tokenizer: token id = byte value
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.add(i) for i in ids]
    pieces.append(detok.flush())
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        pass  # invalid bytes decode to U+FFFD both ways; the concatenation still matches
    else:
        assert not any("\ufffd" in p for p in pieces), pieces
    assert "".join(pieces) == tok.decode(ids)
    assert detok.text == tok.decode(ids)


def test_detokenizer_holds_back_a_partial_character(tok):
    detok = IncrementalDetokenizer(tok, prompt_ids=tok.encode("x"))
    snowman = list("☃".encode())
    assert detok.add(snowman[0]) == "" and detok.add(snowman[1]) == ""
    assert detok.add(snowman[2]) == "☃"
    assert detok.add(257) == ""  # a special token produces no text


def test_chat_template_jinja_file_takes_precedence(llama_checkpoint, tmp_path):
    import shutil

    path = tmp_path / "ckpt"
    shutil.copytree(llama_checkpoint[0], path)
    (path / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    )
    tok = Tokenizer(path)
    assert tok.apply_chat_template([{"role": "user", "content": "hi"}]) == "[user] hi\n"
