"""Tokenizers rebuilt from GGUF metadata (a tiny hand-made byte-level BPE, and the embedded SmolLM2's), loaded
from a model folder's tokenizer.json, and refused when the metadata is bad or unsupported."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logos_ir.errors import TokenizerError
from logos_ir.spec import ModelSpec
from logos_ir.testing import save_gguf
from logos_ir.tokenizer import Tokenizer
from logos_ir.weights import RandomWeights, SafetensorsStore, open_model, save_model

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "1 2", "12 3"]


def byte_alphabet() -> list[str]:
    """GPT-2's bytes_to_unicode: the printable stand-in of each byte, in byte order."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def tiny_tokens() -> tuple[list[str], list[int]]:
    tokens = SPECIALS + byte_alphabet()
    for merge in MERGES:
        tokens.append(merge.replace(" ", ""))
    types = [3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS))
    return tokens, types


def write_tokenizer_gguf(path: Path, **overrides) -> Path:
    """A GGUF holding only tokenizer metadata; `overrides` replace or (with None) drop `tokenizer.ggml.*`
    keys."""
    tokens, types = tiny_tokens()
    fields = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "smollm",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": MERGES,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.chat_template": "{{ messages }}",
    }
    fields.update({k.replace("__", "."): v for k, v in overrides.items()})
    w = gguf.GGUFWriter(str(path), "llama")
    for key, value in fields.items():
        if value is None:
            continue
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            w.add_array(key, value)
    save_gguf(w)
    return path


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Tokenizer:
    return Tokenizer.from_gguf(write_tokenizer_gguf(tmp_path_factory.mktemp("tok") / "t.gguf"))


# -- a tiny byte-level BPE -----------------------------------------------------------------------------------


def test_tiny_tokenizer_merges_and_specials(tiny):
    tokens, _ = tiny_tokens()
    assert tiny.vocab_size == len(tokens)
    assert tiny.encode("hello") == [tokens.index("hello")]
    assert tiny.encode("hello world") == [tokens.index("hello"), tokens.index("Ġworld")]
    assert tiny.encode("<|im_start|>hello<|im_end|>") == [1, tokens.index("hello"), 2]
    assert tiny.bos_id == 1 and tiny.eos_id == 2 and tiny.chat_template == "{{ messages }}"
    assert tiny.token(tokens.index("Ġworld")) == "Ġworld"


def test_smollm_pre_tokenizer_splits_digits_one_by_one(tiny):
    tokens, _ = tiny_tokens()
    assert tiny.encode("123") == [tokens.index(c) for c in "123"]  # the "1 2" merge never applies


def test_default_pre_tokenizer_keeps_digit_runs(tmp_path):
    tokenizer = Tokenizer.from_gguf(write_tokenizer_gguf(tmp_path / "d.gguf", tokenizer__ggml__pre=None))
    tokens, _ = tiny_tokens()
    assert tokenizer.encode("123") == [tokens.index("123")]


def test_llama3_pre_tokenizer_groups_digits_by_three_and_adds_bos(tmp_path):
    path = write_tokenizer_gguf(tmp_path / "l.gguf", tokenizer__ggml__pre="llama-bpe")
    tokenizer = Tokenizer.from_gguf(path)
    tokens, _ = tiny_tokens()
    ids = tokenizer.encode("12345")
    assert ids[0] == tokenizer.bos_id == 1
    assert ids[1:] == [tokens.index("123"), tokens.index("4"), tokens.index("5")]


def test_add_bos_token_is_honoured(tmp_path):
    path = write_tokenizer_gguf(tmp_path / "b.gguf", tokenizer__ggml__add_bos_token=True)
    tokenizer = Tokenizer.from_gguf(path)
    assert tokenizer.encode("hello")[0] == 1
    assert tokenizer.decode(tokenizer.encode("hello")) == "<|im_start|>hello"


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=40))
def test_byte_level_round_trip(tiny, text):
    ids = tiny.encode(text)
    assert all(0 <= i < tiny.vocab_size for i in ids)
    assert tiny.decode(ids) == text


def test_decode_refuses_ids_outside_the_vocabulary(tiny):
    for bad in (-1, tiny.vocab_size, 2.0):
        with pytest.raises(TokenizerError):
            tiny.decode([5, bad])


# -- refusing bad metadata -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"tokenizer__ggml__model": "bert"}, ["'bert'", "not supported"]),
        ({"tokenizer__ggml__model": "llama"}, ["'tokenizer.ggml.scores' must list one number per token"]),
        ({"tokenizer__ggml__model": None}, ["no 'tokenizer.ggml.model'"]),
        ({"tokenizer__ggml__pre": "falcon"}, ["'falcon'"]),
        ({"tokenizer__ggml__tokens": None}, ["tokenizer.ggml.tokens"]),
        ({"tokenizer__ggml__merges": ["h e", "q zz"]}, ["merge 1", "'q zz'"]),
        ({"tokenizer__ggml__merges": ["h  e"]}, ["merge 0"]),
        ({"tokenizer__ggml__token_type": [1, 1, 1]}, ["token_type"]),
        ({"tokenizer__ggml__bos_token_id": 100000}, ["bos_token_id"]),
        (
            {
                "tokenizer__ggml__tokens": ["a", "b", "a"],
                "tokenizer__ggml__token_type": None,
                "tokenizer__ggml__merges": None,
            },
            ["'a' appears twice"],
        ),
    ],
)
def test_bad_metadata_is_a_tokenizer_error(tmp_path, overrides, words):
    path = write_tokenizer_gguf(tmp_path / "bad.gguf", **overrides)
    with pytest.raises(TokenizerError) as error:
        Tokenizer.from_gguf(path)
    for word in [*words, "bad.gguf"]:
        assert word in str(error.value)


# -- tokenizers of weight stores -----------------------------------------------------------------------------


def test_random_weights_and_bare_folders_have_no_tokenizer(tmp_path):
    tiny_spec = ModelSpec.preset("tiny")
    assert Tokenizer.from_store(RandomWeights(tiny_spec)) is None
    save_model(RandomWeights(tiny_spec), tmp_path)
    assert Tokenizer.from_store(SafetensorsStore(tmp_path)) is None


def test_folder_with_tokenizer_json(tmp_path, tiny):
    save_model(RandomWeights(ModelSpec.preset("tiny")), tmp_path)
    tiny.backend.save(str(tmp_path / "tokenizer.json"))
    config = {"eos_token": {"content": "<|im_end|>"}, "bos_token": "<|im_start|>", "chat_template": "{{ x }}"}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = Tokenizer.from_store(SafetensorsStore(tmp_path))
    assert tokenizer is not None
    assert tokenizer.encode("<|im_start|>hello world") == tiny.encode("<|im_start|>hello world")
    assert tokenizer.eos_id == 2 and tokenizer.bos_id == 1 and tokenizer.chat_template == "{{ x }}"
    (tmp_path / "tokenizer.json").write_text("{ not json")
    with pytest.raises(TokenizerError):
        Tokenizer.from_store(SafetensorsStore(tmp_path))


def test_a_folders_chat_template_is_found_where_transformers_finds_it(tmp_path, tiny):
    save_model(RandomWeights(ModelSpec.preset("tiny")), tmp_path)
    tiny.backend.save(str(tmp_path / "tokenizer.json"))
    named = [{"name": "tool_use", "template": "{{ tools }}"}, {"name": "default", "template": "{{ messages }}"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": named}))
    assert Tokenizer.from_store(SafetensorsStore(tmp_path)).chat_template == "{{ messages }}"  # the default one
    (tmp_path / "chat_template.jinja").write_text("{% for m in messages %}{{ m.content }}{% endfor %}")
    assert Tokenizer.from_store(SafetensorsStore(tmp_path)).chat_template.startswith("{% for m in messages %}")


# -- the embedded SmolLM2 tokenizer --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def smollm() -> Tokenizer:
    tokenizer = Tokenizer.from_store(open_model("embedded"))
    assert tokenizer is not None
    return tokenizer


def test_embedded_tokenizer_round_trips(smollm):
    text = "Hello, world! The capital of France is"
    ids = smollm.encode(text)
    assert ids[:4] == [
        19556,
        28,
        905,
        17,
    ]  # "Hello" "," " world" "!" as SmolLM2's own tokenizer.json has them
    assert smollm.decode(ids) == text
    assert smollm.encode("<|im_start|>") == [1]
    assert smollm.decode([1]) == "<|im_start|>"
    assert smollm.encode("<|im_start|>user\nHi<|im_end|>") == [1, 4093, 198, 26843, 2]


def test_embedded_tokenizer_facts(smollm):
    assert smollm.vocab_size == 49152
    assert smollm.bos_id == 1 and smollm.eos_id == 2
    assert smollm.encode("2024") == [smollm.encode(d)[0] for d in "2024"]
    assert smollm.chat_template is not None and "<|im_start|>" in smollm.chat_template
    text = "Ünïcödé, emoji 😀, tabs\tand\n\nnewlines"
    assert smollm.decode(smollm.encode(text)) == text
