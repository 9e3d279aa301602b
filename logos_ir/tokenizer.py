"""The tokenizer of a model: text to the model's own token ids and back.

A GGUF file carries its tokenizer as metadata (`tokenizer.ggml.*`); this module rebuilds it as a Hugging Face
`tokenizers.Tokenizer`, so encoding runs in the same Rust code the model's own `tokenizer.json` would use. Two
kinds are supported: byte-level BPE (`tokenizer.ggml.model` "gpt2": Llama 3, SmolLM2, Qwen), whose pre-tokenizer,
which GGUF names rather than stores (`tokenizer.ggml.pre`), is picked from the few logos-ir knows; and
SentencePiece's BPE with byte fallback ("llama": Llama 2, Mistral, Gemma, Phi-3), rebuilt as transformers'
`LlamaConverter` and `GemmaConverter` rebuild a `tokenizer.model`: merges from the vocabulary, ranked by the score of
the piece each makes (SentencePiece merges the best-scored piece first), spaces as '▁', a space before the text
where the model adds one (`tokenizer.ggml.add_space_prefix`). A Hugging Face model folder with a `tokenizer.json`
is loaded as it is. Bad or unsupported metadata is a `TokenizerError`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from logos_ir.errors import TokenizerError
from logos_ir.weights import GGUFFile, GGUFStore, SafetensorsStore, WeightStore

# llama.cpp's token types (llama_token_type): 3 marks control tokens such as <|im_start|>, 4 user-defined
# ones.
_CONTROL, _USER_DEFINED = 3, 4

# The regular expression of Llama 3's pre-tokenizer, as in its tokenizer.json and llama.cpp's LLAMA3 type.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
# llama.cpp pre-tokenizer names that split like GPT-2, and those that also split digits one by one first.
_GPT2_STYLE = ("default", "gpt-2", "gpt2")
_DIGIT_STYLE = ("smollm", "starcoder", "refact", "codeshell")
_LLAMA3_STYLE = ("llama-bpe", "llama3")
# Qwen2's: Llama 3's expression with each digit its own pre-token (llama.cpp's QWEN2 type)
_QWEN2_STYLE = ("qwen2",)
_QWEN2_SPLIT = _LLAMA3_SPLIT.replace(r"\p{N}{1,3}", r"\p{N}")
_KNOWN_PRE = _GPT2_STYLE + _DIGIT_STYLE + _LLAMA3_STYLE + _QWEN2_STYLE
# llama.cpp's SentencePiece token types: 2 the unknown piece, 6 a byte (`<0x0A>`)
_UNKNOWN, _BYTE = 2, 6


def _folder_template(folder: Path, config: Mapping[str, Any]) -> str | None:
    """A folder's chat template as transformers finds it: `chat_template.jinja` (what newer versions save) before
    `tokenizer_config.json`'s `chat_template`, which is either the template or a list of named ones (then the one
    named "default")."""
    jinja = folder / "chat_template.jinja"
    if jinja.is_file():
        try:
            return jinja.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            raise TokenizerError(f"{jinja}: cannot read: {error}") from None
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None


class Tokenizer:
    """A model's tokenizer: `encode` gives the model's token ids (from 0), `decode` turns ids back to text."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        source: str,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        chat_template: str | None = None,
    ):
        self.backend = backend
        self.source = source
        self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)
        for name, value in (("bos", bos_id), ("eos", eos_id)):
            if value is not None and not _valid_id(value, self.vocab_size):
                raise TokenizerError(f"{source}: {name} token id {value!r} is outside the vocabulary")
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.chat_template = chat_template

    # -- construction ----------------------------------------------------------------------------------------

    @classmethod
    def from_gguf(cls, path: str | Path) -> Tokenizer:
        """The tokenizer stored in a GGUF file's metadata."""
        file = GGUFFile(path)
        try:
            return cls.from_gguf_metadata(file.metadata, str(file.path))
        finally:
            file.close()

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any], source: str) -> Tokenizer:
        """The tokenizer described by GGUF metadata (`tokenizer.ggml.*`); `source` names the file in
        messages."""
        kind = meta.get("tokenizer.ggml.model")
        if kind is None:
            raise TokenizerError(f"{source}: the GGUF metadata holds no tokenizer (no 'tokenizer.ggml.model')")
        if kind == "llama":
            return cls._from_sentencepiece(meta, source)
        if kind != "gpt2":
            raise TokenizerError(
                f"{source}: tokenizer model '{kind}' is not supported",
                hint="logos-ir rebuilds byte-level BPE ('gpt2') and SentencePiece BPE ('llama') tokenizers",
            )
        pre = meta.get("tokenizer.ggml.pre", "default")
        if pre not in _KNOWN_PRE:
            raise TokenizerError(
                f"{source}: pre-tokenizer '{pre}' is not one logos-ir knows",
                hint=f"known pre-tokenizers: {', '.join(_KNOWN_PRE)}",
            )
        tokens = _string_list(meta, "tokenizer.ggml.tokens", source)
        vocab = _vocab(tokens, source)
        merges = _merges(_string_list(meta, "tokenizer.ggml.merges", source, required=False), vocab, source)
        types = _token_types(meta, len(tokens), source)
        bos = _token_id(meta, "tokenizer.ggml.bos_token_id", len(tokens), source)
        eos = _token_id(meta, "tokenizer.ggml.eos_token_id", len(tokens), source)
        add_bos = meta.get("tokenizer.ggml.add_bos_token", pre in _LLAMA3_STYLE)
        template = meta.get("tokenizer.chat_template")
        try:
            backend = _byte_level_bpe(vocab, merges, pre)
            added = [
                tokenizers.AddedToken(tokens[i], special=t == _CONTROL, normalized=False)
                for i, t in enumerate(types)
                if t in (_CONTROL, _USER_DEFINED)
            ]
            backend.add_tokens(added)
            if add_bos is True and bos is not None:
                backend.post_processor = processors.TemplateProcessing(
                    single=f"{tokens[bos]} $A",
                    pair=f"{tokens[bos]} $A $B",
                    special_tokens=[(tokens[bos], bos)],
                )
        except Exception as error:  # the Rust library reports bad vocabularies as plain Exceptions
            raise TokenizerError(f"{source}: cannot build the tokenizer: {error}") from None
        if backend.get_vocab_size(with_added_tokens=True) != len(tokens):
            raise TokenizerError(f"{source}: the tokenizer's added tokens do not match its vocabulary")
        return cls(
            backend,
            source,
            bos_id=bos,
            eos_id=eos,
            chat_template=template if isinstance(template, str) else None,
        )

    @classmethod
    def _from_sentencepiece(cls, meta: Mapping[str, Any], source: str) -> Tokenizer:
        """A SentencePiece BPE vocabulary (`tokenizer.ggml.model` "llama"): pieces, their scores and types."""
        tokens = _string_list(meta, "tokenizer.ggml.tokens", source)
        vocab = _vocab(tokens, source)
        scores = meta.get("tokenizer.ggml.scores")
        if (
            not isinstance(scores, list)
            or len(scores) != len(tokens)
            or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in scores)
        ):
            raise TokenizerError(f"{source}: GGUF metadata 'tokenizer.ggml.scores' must list one number per token")
        types = _token_types(meta, len(tokens), source)
        bos = _token_id(meta, "tokenizer.ggml.bos_token_id", len(tokens), source)
        eos = _token_id(meta, "tokenizer.ggml.eos_token_id", len(tokens), source)
        unknown = _token_id(meta, "tokenizer.ggml.unknown_token_id", len(tokens), source)
        prefix = meta.get("tokenizer.ggml.add_space_prefix", True)
        add_bos = meta.get("tokenizer.ggml.add_bos_token", True)
        if not isinstance(prefix, bool) or not isinstance(add_bos, bool):
            raise TokenizerError(f"{source}: GGUF metadata 'add_space_prefix' and 'add_bos_token' must be booleans")
        if unknown is None:
            unknown = next((i for i, t in enumerate(types) if t == _UNKNOWN), None)
        template = meta.get("tokenizer.chat_template")
        try:
            backend = _sentencepiece_bpe(tokens, vocab, scores, types, prefix, unknown)
            if add_bos and bos is not None:
                backend.post_processor = processors.TemplateProcessing(
                    single=f"{tokens[bos]} $A", pair=f"{tokens[bos]} $A $B", special_tokens=[(tokens[bos], bos)]
                )
        except Exception as error:  # the Rust library reports bad vocabularies as plain Exceptions
            raise TokenizerError(f"{source}: cannot build the tokenizer: {error}") from None
        if backend.get_vocab_size(with_added_tokens=True) != len(tokens):
            raise TokenizerError(f"{source}: the tokenizer's added tokens do not match its vocabulary")
        return cls(
            backend, source, bos_id=bos, eos_id=eos, chat_template=template if isinstance(template, str) else None
        )

    @classmethod
    def from_file(cls, path: str | Path) -> Tokenizer:
        """A Hugging Face `tokenizer.json`, with bos, eos and chat template from the `tokenizer_config.json`
        and `config.json` beside it when they exist."""
        path = Path(path)
        try:
            backend = tokenizers.Tokenizer.from_file(str(path))
        except Exception as error:  # the Rust library reports every failure as a plain Exception
            raise TokenizerError(f"{path}: cannot load the tokenizer: {error}") from None
        config = _json_object(path.parent / "tokenizer_config.json")
        model_config = _json_object(path.parent / "config.json")
        return cls(
            backend,
            str(path),
            bos_id=_special_id(backend, config.get("bos_token"), model_config.get("bos_token_id")),
            eos_id=_special_id(backend, config.get("eos_token"), model_config.get("eos_token_id")),
            chat_template=_folder_template(path.parent, config),
        )

    @classmethod
    def from_store(cls, store: WeightStore) -> Tokenizer | None:
        """The tokenizer that comes with a weight store, or None when it has none (random weights, a folder
        without `tokenizer.json`)."""
        if isinstance(store, GGUFStore):
            if "tokenizer.ggml.model" not in store.metadata:
                return None
            return cls.from_gguf_metadata(store.metadata, store.source)
        if isinstance(store, SafetensorsStore):
            path = store.directory / "tokenizer.json"
            return cls.from_file(path) if path.is_file() else None
        return None

    # -- use -------------------------------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """The model's token ids for `text`; special tokens written in the text (`<|im_start|>`) are one id
        each, and a beginning-of-sequence id is prepended when the model's tokenizer asks for one."""
        if not isinstance(text, str):
            raise TokenizerError(f"can only encode text, not {type(text).__name__}")
        return list(self.backend.encode(text, add_special_tokens=True).ids)

    def decode(self, ids: Iterable[int]) -> str:
        """The text of token ids, special tokens included."""
        ids = list(ids)
        for token in ids:
            if not _valid_id(token, self.vocab_size):
                raise TokenizerError(
                    f"{self.source}: token id {token!r} is outside the vocabulary of {self.vocab_size}"
                )
        return self.backend.decode(ids, skip_special_tokens=False)

    def token(self, token_id: int) -> str:
        """The vocabulary entry of one id, as stored (byte-level tokens show spaces as 'Ġ')."""
        if not _valid_id(token_id, self.vocab_size):
            raise TokenizerError(f"{self.source}: token id {token_id!r} is outside the vocabulary")
        return self.backend.id_to_token(token_id) or ""

    def __repr__(self) -> str:
        return f"Tokenizer({self.source!r}, vocab_size={self.vocab_size})"


# -- GGUF metadata -------------------------------------------------------------------------------------------


def _valid_id(value: Any, vocab_size: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < vocab_size


def _string_list(meta: Mapping[str, Any], key: str, source: str, required: bool = True) -> list[str]:
    value = meta.get(key)
    if value is None and not required:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise TokenizerError(f"{source}: GGUF metadata '{key}' must be a list of strings")
    return value


def _vocab(tokens: list[str], source: str) -> dict[str, int]:
    if not tokens:
        raise TokenizerError(f"{source}: the tokenizer's vocabulary is empty")
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        twice = next(token for i, token in enumerate(tokens) if vocab[token] != i)
        raise TokenizerError(f"{source}: token {twice!r} appears twice in the vocabulary")
    # Not every byte need have a token: SmolLM2's vocabulary lacks bytes that never occur in UTF-8 and a few
    # control characters, which its own tokenizer.json drops just as this one does.
    return vocab


def _merges(merges: list[str], vocab: Mapping[str, int], source: str) -> list[tuple[str, str]]:
    pairs: list[tuple[str, str]] = []
    for i, merge in enumerate(merges):
        parts = merge.split(" ")
        if len(parts) != 2 or not all(parts):
            raise TokenizerError(f"{source}: merge {i} ({merge!r}) is not two tokens separated by one space")
        left, right = parts
        if left not in vocab or right not in vocab or left + right not in vocab:
            raise TokenizerError(f"{source}: merge {i} ({merge!r}) uses or makes a token not in the vocabulary")
        pairs.append((left, right))
    return pairs


def _token_types(meta: Mapping[str, Any], count: int, source: str) -> list[int]:
    types = meta.get("tokenizer.ggml.token_type")
    if types is None:
        return [1] * count
    if not isinstance(types, list) or len(types) != count or not all(isinstance(t, int) for t in types):
        raise TokenizerError(f"{source}: GGUF metadata 'tokenizer.ggml.token_type' must list one integer per token")
    return types


def _token_id(meta: Mapping[str, Any], key: str, count: int, source: str) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if not _valid_id(value, count):
        raise TokenizerError(f"{source}: GGUF metadata '{key}' ({value!r}) is not a token id of the vocabulary")
    return value


def _byte_level_bpe(vocab: dict[str, int], merges: list[tuple[str, str]], pre: str) -> tokenizers.Tokenizer:
    regex = {**dict.fromkeys(_LLAMA3_STYLE, _LLAMA3_SPLIT), **dict.fromkeys(_QWEN2_STYLE, _QWEN2_SPLIT)}.get(pre)
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=regex is None)
    pre_tokenizer: pre_tokenizers.PreTokenizer
    if regex is not None:
        split = pre_tokenizers.Split(tokenizers.Regex(regex), behavior="isolated", invert=False)
        pre_tokenizer = pre_tokenizers.Sequence([split, byte_level])
    elif pre in _DIGIT_STYLE:
        pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    else:
        pre_tokenizer = byte_level
    # Llama 3 looks whole pre-tokens up in the vocabulary before merging (llama.cpp's ignore_merges).
    model = models.BPE(vocab, merges, ignore_merges=pre in _LLAMA3_STYLE)
    backend = tokenizers.Tokenizer(model)
    backend.pre_tokenizer = pre_tokenizer
    backend.decoder = decoders.ByteLevel()
    return backend


def _sentencepiece_bpe(
    tokens: list[str], vocab: dict[str, int], scores: list[float], types: list[int], prefix: bool, unknown: int | None
) -> tokenizers.Tokenizer:
    """SentencePiece's BPE as transformers' converters rebuild it (`SentencePieceExtractor`): every split of a
    piece into two pieces of the vocabulary is a merge, ranked by the score of the piece it makes (best first;
    ties in the vocabulary's order of the two halves), so merging runs as SentencePiece's encoder does; a piece
    nothing covers falls back to its UTF-8 bytes (`<0x..>`); control and user-defined pieces match whole."""
    merges: list[tuple[float, int, int, str, str]] = []
    for piece, i in vocab.items():
        if types[i] not in (1, _USER_DEFINED):  # normal pieces (and user-defined ones) are made by merges
            continue
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((-scores[i], vocab[left], vocab[right], left, right))
    merges.sort()
    model = models.BPE(
        vocab,
        [(left, right) for *_, left, right in merges],
        unk_token=tokens[unknown] if unknown is not None else None,
        fuse_unk=True,
        byte_fallback=True,
    )
    backend = tokenizers.Tokenizer(model)
    steps = [normalizers.Prepend("▁")] if prefix else []
    backend.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", "▁")])
    readback = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    backend.decoder = decoders.Sequence([*readback, decoders.Strip(" ", 1, 0)] if prefix else readback)
    special = [
        tokenizers.AddedToken(tokens[i], special=t == _CONTROL, normalized=False)
        for i, t in enumerate(types)
        if t in (_CONTROL, _USER_DEFINED)
    ]
    backend.add_special_tokens([a for a in special if a.special])
    backend.add_tokens([a for a in special if not a.special])
    return backend


# -- Hugging Face folders ------------------------------------------------------------------------------------


def _json_object(path: Path) -> dict[str, Any]:
    """A JSON object from a side file, or {} when the file is absent; a broken file is a TokenizerError."""
    if not path.is_file():
        return {}
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as error:  # ValueError: bad UTF-8, bad JSON, a huge integer
        raise TokenizerError(f"{path}: cannot read: {error}") from None
    if not isinstance(value, dict):
        raise TokenizerError(f"{path}: must hold a JSON object")
    return value


def _special_id(backend: tokenizers.Tokenizer, token: Any, fallback: Any) -> int | None:
    """The id of a special token given as text (`"<|eot_id|>"` or `{"content": ...}`), else the config's
    id."""
    if isinstance(token, dict):
        token = token.get("content")
    if isinstance(token, str):
        found = backend.token_to_id(token)
        if found is not None:
            return found
    if isinstance(fallback, list) and fallback:
        fallback = fallback[0]
    if isinstance(fallback, int) and not isinstance(fallback, bool):
        return fallback
    return None
