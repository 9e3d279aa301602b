"""Make the SentencePiece tokenizer goldens from SentencePiece itself (a script, not a test: it needs the
`sentencepiece` package; the suite reads what it wrote and needs none of it).

    python3 tools/tokenizer_goldens.py [--out test/unit/tokenizers/sentencepiece.json]

Two small byte-fallback BPE models are trained on a fixed text, one adding a space before the text as Llama 2's and
Mistral's tokenizers do (`add_dummy_prefix`), one not, as Gemma's; each is written as llama.cpp's converter writes
a SentencePiece vocabulary into a GGUF (`_create_vocab_sentencepiece`: each piece, its score, its token type), with
SentencePiece's own ids for a set of texts (no beginning-of-sequence id) and its decoding of them.
"""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

CORPUS = """The quick brown fox jumps over the lazy dog. The dog sleeps; the fox runs away.
Once upon a time, in a small village far away, there lived an old man who told stories.
def fibonacci(n):
    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)
The capital of France is Paris. The capital of Italy is Rome. Numbers: 12345, 3.14159, 2026.
Tokenizers split text into pieces; pieces they do not know fall back to bytes.
"""

TEXTS = [
    "The quick brown fox",
    "Hello, world!",
    "  two leading spaces and a tab\there",
    "line one\nline two",
    "déjà vu, naïve café",
    "emoji 🙂 and 漢字",
    "fibonacci(n - 1)",
    "",
]

# llama.cpp's SentencePiece token types (gguf-py's SentencePieceTokenTypes)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def model(dummy_prefix: bool) -> dict[str, Any]:
    import sentencepiece as spm

    written = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS.splitlines() * 8),
        model_writer=written,
        vocab_size=400,
        model_type="bpe",
        byte_fallback=True,
        add_dummy_prefix=dummy_prefix,
        character_coverage=1.0,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        split_digits=True,
        allow_whitespace_only_pieces=True,
    )
    sp = spm.SentencePieceProcessor(model_proto=written.getvalue())
    pieces, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        pieces.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        kind = NORMAL
        if sp.is_unknown(i):
            kind = UNKNOWN
        elif sp.is_control(i):
            kind = CONTROL
        elif sp.is_unused(i):
            kind = UNUSED
        elif sp.is_byte(i):
            kind = BYTE
        types.append(kind)
    runs = [{"text": text, "ids": sp.encode(text), "decoded": sp.decode(sp.encode(text))} for text in TEXTS]
    return {
        "add_space_prefix": dummy_prefix,
        "tokens": pieces,
        "scores": scores,
        "token_type": types,
        "bos_token_id": sp.bos_id(),
        "eos_token_id": sp.eos_id(),
        "unknown_token_id": sp.unk_id(),
        "runs": runs,
    }


def main() -> int:
    import sentencepiece as spm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parent.parent / "test" / "unit" / "tokenizers" / "sentencepiece.json"
    parser.add_argument("--out", default=str(default))
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    made = {
        "made_by": "tools/tokenizer_goldens.py",
        "sentencepiece": spm.__version__,
        "models": {"llama": model(True), "gemma": model(False)},
    }
    out.write_text(json.dumps(made, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    for name, m in made["models"].items():
        print(name, len(m["tokens"]), [run["ids"][:8] for run in m["runs"]])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
