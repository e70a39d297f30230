"""BPE for the tokenizer_bound demo (common/bpe.py): the pure-Python slow tokenizer and
Hugging Face `tokenizers` give the same ids from the same tables; training is deterministic;
merges go by rank; the synthetic requests are what the demo says they are."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tokenizers import pre_tokenizers

from common import bpe
from tests.conftest import ROOT

TRAIN_SEED = 1
REQUEST_SEED = 2  # another seed than training's: the requests hold words training never saw
TRAIN_TEXTS = 1000
REQUEST_TEXTS = 3000
VOCAB_SIZE = 2000  # well under the words in the stock, so common words stay split too

EDGE_TEXTS = [
    "",
    " ",
    "?!...,,;:",
    "12345 2024, 3.14 and 1e9",
    "aaaaaa aaaaaaa a aa",
    "Zebra quiz jazz xylophone",  # z, q, j, x: letters the word stock may not hold
    "caf\u00e9 na\u00efve \u00e9\u00e9",  # precomposed letters outside the training alphabet
    "\u65e5\u672c\u8a9e \u20ac5",  # CJK and a currency sign
    "many   spaces\tand\ttabs",
    "line\nbreak\n\nparagraph\r\n",
    "[PAD] [UNK] <s>",  # special tokens' text is plain text to both tokenizers
    "don't stop-gap e-mail U.S.A. well...really?!",
    "under_score snake_case_name __init__",
]


@pytest.fixture(scope="module")
def vocabulary() -> bpe.Vocabulary:
    return bpe.train(bpe.corpus(TRAIN_TEXTS, seed=TRAIN_SEED), VOCAB_SIZE)


def assert_same_ids(texts: list[str], vocabulary: bpe.Vocabulary) -> None:
    rust = bpe.rust_encode_batch(bpe.rust_tokenizer(vocabulary), texts)
    for text, rust_ids in zip(texts, rust):
        assert bpe.python_encode(text, vocabulary) == rust_ids, repr(text)


def test_same_ids_on_requests_with_unseen_words(vocabulary):
    texts = bpe.corpus(REQUEST_TEXTS, seed=REQUEST_SEED)
    seen = {word for text in bpe.corpus(TRAIN_TEXTS, seed=TRAIN_SEED)
            for word in bpe.WORDS_AND_PUNCTUATION.findall(text)}
    unseen = {word for text in texts for word in bpe.WORDS_AND_PUNCTUATION.findall(text)} - seen
    assert len(unseen) > 100  # else this would not test the splitting of new words
    assert_same_ids(texts, vocabulary)


def test_same_ids_on_edge_texts(vocabulary):
    assert_same_ids(EDGE_TEXTS, vocabulary)
    # Every ASCII character, alone, between letters and repeated.
    ascii_texts = [form.format(chr(code)) for code in range(128)
                   for form in ("{0}", "a{0}b", "{0}{0}{0}", "the {0} end")]
    assert_same_ids(ascii_texts, vocabulary)


def test_pre_tokenizer_splits_like_rust_on_ascii():
    rust = pre_tokenizers.Whitespace()
    for code in range(128):
        for text in (chr(code), f"a{chr(code)}b", f"x {chr(code) * 2} .y"):
            rust_words = [word for word, _ in rust.pre_tokenize_str(text)]
            assert bpe.WORDS_AND_PUNCTUATION.findall(text) == rust_words, repr(text)


def test_unknown_characters_are_one_unk_each(vocabulary):
    assert "\u00e9" not in vocabulary.vocab
    assert bpe.python_encode("\u00e9\u00e9", vocabulary) == [vocabulary.unk_id] * 2
    # "[PAD]" in a request is text, not padding (the harness masks the pad id).
    assert vocabulary.pad_id not in bpe.python_encode("[PAD]", vocabulary)


def test_special_token_ids(vocabulary):
    assert vocabulary.pad_id == 0 and vocabulary.unk_id == 1
    assert len(vocabulary.vocab) == VOCAB_SIZE
    # Every merge's parts and result are tokens: the tables are complete.
    for first, second in vocabulary.merges:
        assert {first, second, first + second} <= vocabulary.vocab.keys()


def vocabulary_json(vocabulary: bpe.Vocabulary) -> str:
    return json.dumps([sorted(vocabulary.vocab.items()), vocabulary.merges])


def test_training_is_deterministic(vocabulary):
    texts = bpe.corpus(TRAIN_TEXTS, seed=TRAIN_SEED)
    assert bpe.train(texts, VOCAB_SIZE) == vocabulary
    # Another process: Rust's hash maps are seeded afresh in each.
    script = (f"from common import bpe; from tests.test_bpe import vocabulary_json;"
              f"print(vocabulary_json(bpe.train(bpe.corpus({TRAIN_TEXTS}, seed={TRAIN_SEED}),"
              f" {VOCAB_SIZE})))")
    other = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                           text=True, check=True)
    assert other.stdout.strip() == vocabulary_json(vocabulary)


def hand_vocabulary() -> bpe.Vocabulary:
    tokens = ["[PAD]", "[UNK]", "a", "b", "c", "bc", "ab", "aa", "bcab"]
    return bpe.Vocabulary(vocab={token: index for index, token in enumerate(tokens)},
                          merges=[("b", "c"), ("a", "b"), ("a", "a"), ("bc", "ab")])


@pytest.mark.parametrize("text, tokens", [
    # Left to right, "ab" would be merged first ("ab" "c"); by rank "bc" goes first.
    ("abc", ["a", "bc"]),
    # Every "bc" first (rank 0); then no "a" "b" is left, so "ab" (rank 1) never applies.
    ("abcabc", ["a", "bc", "a", "bc"]),
    # "bc" first, then the "ab" left over, then "bc" "ab" (rank 3).
    ("abcab", ["a", "bcab"]),
    # Overlapping occurrences of one pair merge from the left.
    ("aaa", ["aa", "a"]),
    ("aaaa", ["aa", "aa"]),
    ("cab", ["c", "ab"]),
])
def test_merges_apply_by_rank(text, tokens):
    vocabulary = hand_vocabulary()
    expected = [vocabulary.vocab[token] for token in tokens]
    assert bpe.python_encode(text, vocabulary) == expected
    assert bpe.rust_encode_batch(bpe.rust_tokenizer(vocabulary), [text]) == [expected]


def test_corpus_is_deterministic_ascii_text():
    texts = bpe.corpus(200, seed=3)
    assert texts == bpe.corpus(200, seed=3)
    assert texts != bpe.corpus(200, seed=4)
    low, high = bpe.WORDS_PER_TEXT
    for text in texts:
        assert text.isascii()
        assert low <= len(text.split()) <= high
        assert text[0].isupper() and text[-1] in bpe.SENTENCE_ENDS
    joined = " ".join(texts)
    for mark in (",", ".", "?"):
        assert mark in joined
    assert any(character.isdigit() for character in joined)
