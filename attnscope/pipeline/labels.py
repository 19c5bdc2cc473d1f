"""How a window's tokens and words are named: each token's exact text, its label as tables and pictures show it,
and the words the tokens make (from the marks each vocabulary puts on word starts: byte-level `Ġ`, SentencePiece
`▁`, WordPiece `##`). Reads only the tokenizer; no model, no torch.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE writes each byte as one printable character (Radford et al. 2019, `encoder.py`):
    character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = [byte for byte in range(256) if byte not in printable]
    return {
        **{chr(byte): byte for byte in printable},
        **{chr(256 + index): byte for index, byte in enumerate(shifted)},
    }


BYTE_LEVEL_ALPHABET = _byte_level_alphabet()


def token_labels(tokenizer: Any, ids: Sequence[int]) -> list[str]:
    """Each token's exact text, as the JSON gives it (`tokens`): each token decoded alone, newlines and tabs made
    visible, the BOS token shortened to `<bos>` (GPT-2's `<|endoftext|>` would take the room of five words). A
    byte-level token that holds part of a character (one of the 3 bytes of 日) shows its bytes (`\\xe6\\x97`), not
    `�`. Tables, pictures and errors show tokens as `label_window` does (word boundaries visible)."""
    labels = []
    for token_id in ids:
        if token_id == tokenizer.bos_token_id:
            labels.append("<bos>")
            continue
        text = tokenizer.decode([token_id])
        piece = tokenizer.convert_ids_to_tokens(token_id)
        if "\ufffd" in text and isinstance(piece, str) and all(char in BYTE_LEVEL_ALPHABET for char in piece):
            text = bytes(BYTE_LEVEL_ALPHABET[char] for char in piece).decode("utf-8", errors="backslashreplace")
        labels.append(text.replace("\n", "\\n").replace("\t", "\\t") or repr(text))
    return labels


# ------------------------------------------------------------------------------------------------------ words
# How the vocabularies the project supports mark where a word starts (see `group_words`).
BYTE_LEVEL = "byte-level"  # GPT-2, Llama 3, Qwen, RoBERTa: a leading space is part of the piece, written `Ġ`
SENTENCEPIECE = "sentencepiece"  # Llama 2, Gemma, Mistral: a leading space is written `▁`; bytes as `<0x0A>`
WORDPIECE = "wordpiece"  # BERT: words split on spaces and punctuation; a piece continuing a word starts with `##`
CONTINUED = "##"  # how a piece that continues the word before it is shown: WordPiece's own mark, known from BERT
SPACE = "␣"  # how a space is shown where it would be invisible (a token of spaces)
_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte-fallback pieces


def vocabulary_style(tokenizer: Any) -> str:
    """How `tokenizer` marks word starts, from how it writes "a b": `Ġb` byte-level, `▁b` SentencePiece, else
    WordPiece (a word needs no mark; its continuation pieces start with `##`)."""
    ids = tokenizer("a b", add_special_tokens=False)["input_ids"]
    pieces = [str(piece) for piece in tokenizer.convert_ids_to_tokens(ids)]
    if any(piece.startswith("Ġ") for piece in pieces):
        return BYTE_LEVEL
    if any(piece.startswith("▁") for piece in pieces):
        return SENTENCEPIECE
    return WORDPIECE


def piece_bytes(piece: str, style: str) -> tuple[bytes, bool]:
    """The bytes of the text a vocabulary piece stands for, a leading space included, and whether the piece says
    itself that it continues the word before it (WordPiece's `##`)."""
    if style == BYTE_LEVEL and all(char in BYTE_LEVEL_ALPHABET for char in piece):
        return bytes(BYTE_LEVEL_ALPHABET[char] for char in piece), False
    if style == SENTENCEPIECE:
        byte = _BYTE_FALLBACK.fullmatch(piece)
        if byte:
            return bytes([int(byte.group(1), 16)]), False
        return piece.replace("▁", " ").encode("utf-8"), False
    if style == WORDPIECE and piece.startswith(CONTINUED) and len(piece) > len(CONTINUED):
        return piece[len(CONTINUED) :].encode("utf-8"), True
    return piece.encode("utf-8"), False


def _text(data: bytes) -> str:
    """Bytes as text; bytes that are part of a character not whole here (one of the 3 bytes of 日) as `\\xe6`."""
    return data.decode("utf-8", errors="backslashreplace")


def _stands_alone(text: str) -> bool:
    """A token of only whitespace, punctuation and symbols (`.`, `,`, ` (`, `\\n`, `␣␣`, `—`, `=`): a word of its
    own."""
    return all(char.isspace() or unicodedata.category(char)[0] in "PS" for char in text)


def group_words(pieces: Sequence[str], special: Sequence[bool], style: str) -> list[range]:
    """The words of a window, as spans of token positions (consecutive, covering every token once, in order).

    `pieces` are the vocabulary's own strings (`tokenizer.convert_ids_to_tokens`), `special[i]` says whether token
    i is a special token (BOS, EOS, [CLS], [SEP], <pad>, <unk>), `style` is `vocabulary_style`. Token i starts a new
    word when

    1. it is the window's first token, a special token, or comes right after one: BOS, [CLS] and [SEP] are words of
       their own, and the text after BOS starts a word even without a space ("The" in GPT-2's `<bos> The`);
    2. it is made only of whitespace, punctuation and symbols (`.`, `,`, `(`, a newline, `—`, `=`), or comes right
       after such a token: punctuation is a word of its own, as WordPiece splits it and as readers count words
       ("patient." is the word "patient" and "."), and a newline ends a word whatever follows it;
    3. otherwise, it carries its vocabulary's word-start mark: byte-level and SentencePiece pieces begin with a
       space (`Ġdo`, `▁do`); a WordPiece piece starts a word unless it begins with `##`.

    So "doctor" in the demo model's `Ġdo ct or` is one word of three tokens, "cat's" (`Ġcat 's`) one word, "U.S."
    four. Why this rule: it reads only the marks the tokenizer itself put there, the same in all three styles,
    and needs no language model of words. What it cannot know: a text without spaces between words (Chinese,
    Japanese) is one word up to the next space or punctuation; a word cut by a window's edge is two (each window
    starts a word); a space-marked piece in the middle of a written word never happens in these vocabularies."""
    if not (len(pieces) == len(special)):
        raise ValueError("pieces and special must have one entry per token")
    words: list[range] = []
    start = 0
    alone_before = True  # the token before (none yet) ends a word
    for i, piece in enumerate(pieces):
        data, continued = piece_bytes(piece, style)
        text = _text(data)
        alone = special[i] or _stands_alone(text)
        if style == WORDPIECE:
            marked = not continued
        else:
            marked = text[:1].isspace()
        if i > 0 and (alone or alone_before or marked):
            words.append(range(start, i))
            start = i
        alone_before = alone
    if pieces:
        words.append(range(start, len(pieces)))
    return words


def _visible(text: str) -> str:
    """Whitespace made visible: newlines and tabs escaped (`\\n`), spaces as `␣`."""
    return text.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r").replace(" ", SPACE)


@dataclass(frozen=True)
class Labels:
    """How a window's tokens and words are named.

    tokens: each token's exact text (`token_labels`), what the JSON's `tokens` hold;
    shown: each token as tables, pictures and errors show it: a token that starts a word without its leading space
        (`do`), a piece that continues the word before it marked `##` (`##ct`, `##or`), special tokens as themselves
        (`<bos>`, `[CLS]`), whitespace visible (`\\n`, `␣`);
    words: the token positions of each word (`group_words`);
    word_text: each word as shown (`doctor`, `<bos>`, `.`).
    """

    tokens: list[str]
    shown: list[str]
    words: list[range]
    word_text: list[str]

    @property
    def continued(self) -> bool:
        """Whether some word has several tokens, so that some label is marked `##`."""
        return len(self.words) < len(self.tokens)

    def word_of(self, position: int) -> int:
        """The index of the word holding token `position`."""
        for index, word in enumerate(self.words):
            if position in word:
                return index
        raise IndexError(position)

    def text(self, positions: Sequence[int] | range) -> str:
        """The label of a token (one position: `##ct`) or of the word a span of several positions is (`doctor`)."""
        first, last = positions[0], positions[-1]
        return self.shown[first] if first == last else self.word_text[self.word_of(first)]

    def describe(self, positions: Sequence[int] | range) -> str:
        """A token or a word as tables and errors name it: `she@8`, `doctor@2-4` (its label, `@`, its token
        positions)."""
        first, last = positions[0], positions[-1]
        where = f"{first}" if first == last else f"{first}-{last}"
        return f"{self.text(positions)}@{where}"


def label_pieces(
    pieces: Sequence[str], special: Sequence[str | None], style: str
) -> tuple[list[str], list[range], list[str]]:
    """Shown labels of each token, the words and each word's text, from the vocabulary's pieces; `special[i]` is
    how special token i is shown (`<bos>`, `[CLS]`), None for text tokens. See `Labels`."""
    words = group_words(pieces, [name is not None for name in special], style)
    data = [piece_bytes(piece, style)[0] for piece in pieces]
    shown: list[str] = []
    word_text: list[str] = []
    for word in words:
        if special[word.start] is not None:
            shown.append(special[word.start])
            word_text.append(special[word.start])
            continue
        for position in word:
            text = _text(data[position])
            if position == word.start:
                shown.append(_visible(text.lstrip()) or _visible(text))
            else:
                shown.append(CONTINUED + _visible(text))
        whole = _text(b"".join(data[position] for position in word))
        word_text.append(_visible(whole.strip()) or _visible(whole))
    return shown, words, word_text


def label_window(tokenizer: Any, ids: Sequence[int], style: str | None = None) -> Labels:
    """The labels of a window's tokens and words (see `Labels`); `style` as `vocabulary_style(tokenizer)` gives it
    (found when None)."""
    style = vocabulary_style(tokenizer) if style is None else style
    tokens = token_labels(tokenizer, ids)
    special_ids = set(tokenizer.all_special_ids)
    pieces = [str(piece) for piece in tokenizer.convert_ids_to_tokens(list(ids))]
    special = [tokens[i] if token_id in special_ids else None for i, token_id in enumerate(ids)]
    shown, words, word_text = label_pieces(pieces, special, style)
    return Labels(tokens, shown, words, word_text)
