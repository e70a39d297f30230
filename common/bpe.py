"""BPE tokenization for the tokenizer_bound demo: one vocabulary and merge table, two tokenizers
that give the same ids. python_encode is the classic slow tokenizer (GPT-2's bpe(), the
algorithm behind Hugging Face's "slow" Python tokenizers) run per request; rust_tokenizer loads
the same tables into Hugging Face `tokenizers` (Rust), whose encode_batch the fixed variant calls.

The request texts are synthetic (corpus): English-like, made here from a fixed word stock, so
nothing is downloaded. The vocabulary is trained in-process on such texts (train).
Imports no torch: the harness pads the ids into tensors (harness.serve_texts).
"""
from __future__ import annotations

import json
import random
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from itertools import accumulate

try:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
except ModuleNotFoundError:  # an interpreter of its own (PYTHON=...) may lack it: one line, exit 2
    print("error: tokenizer_bound needs Hugging Face tokenizers: pip install tokenizers",
          file=sys.stderr)
    sys.exit(2)

PAD_TOKEN = "[PAD]"  # id 0 (first special token): padding is what a batch holds most of
UNK_TOKEN = "[UNK]"  # id 1: a character the training texts never had
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN)  # the trainer numbers them first, in this order

# The `tokenizers` Whitespace pre-tokenizer is the regex \w+|[^\w\s]+ (Unicode classes, Oniguruma).
# Python's \s also counts the ASCII separators \x1c-\x1f as space; Oniguruma does not, so they
# are put back among the punctuation. With that, the splits are the same for every ASCII
# character (tests/test_bpe.py checks all 128). Outside ASCII the two \w differ: Python's takes
# superscript digits and fractions (²,½), Oniguruma's takes combining marks (U+0300...).
# Precomposed letters (é) and CJK agree. The request texts are ASCII.
WORDS_AND_PUNCTUATION = re.compile(r"\w+|(?:[^\w\s]|[\x1c-\x1f])+")

# --- The synthetic requests -----------------------------------------------------------------
# Frequent English words head the Zipf ranking, as they do in real reviews and queries; made-up
# words (syllables) form the long tail, rare enough that a corpus from another seed holds words
# the vocabulary never saw, which BPE then splits into smaller pieces.
COMMON_WORDS = (
    "the of and to a in is it you that he was for on are with as I his they be at one have this "
    "from or had by not but what some we can out other were all there when up use your how said "
    "an each she which do their time if will way about many then them would like so these her "
    "long make thing see him two has look more day could go come did my no most who over know "
    "than call first people may down side been now find any new work part take get place made "
    "live where after back little only round man year came show every good me give our under "
    "very just think much before too same tell why ask went men read need land different "
    "home us move try kind hand picture again change off play spell air away animal house point "
    "page letter mother answer found study still learn should world high product service price "
    "quality order delivery battery screen phone great easy fast slow broken return refund help "
    "works worked bought recommend love hate problem issue customer support account password"
).split()
ONSETS = ("", "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w",
          "br", "ch", "cl", "cr", "dr", "fl", "gr", "pl", "pr", "sh", "sl", "sp", "st", "str",
          "th", "tr")
VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oa", "ou", "oo")
CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "nt", "ng", "ck", "st", "rt", "ll")
TAIL_WORDS = 4000  # made-up words after the common ones: a vocabulary of a few thousand words
# Words of one to three syllables, mostly two: lengths like those of common English words.
SYLLABLE_COUNTS = (1, 2, 3)
SYLLABLE_COUNT_WEIGHTS = (0.3, 0.5, 0.2)
WORD_STOCK_SEED = 0  # the stock is the same for every corpus seed: only the draws differ
ZIPF_EXPONENT = 1.0  # word frequency ~ 1 / rank: Zipf's law for natural text
ZIPF_OFFSET = 2.7  # Mandelbrot's shift: the top words are less dominant than a pure 1/rank says

WORDS_PER_TEXT = (20, 200)  # a short query up to a long review
WORDS_PER_SENTENCE = (4, 20)
COMMA_AFTER_WORD = 0.07  # a comma after about one word in fourteen, never at a sentence's end
NUMBER_INSTEAD_OF_WORD = 0.02  # prices, years, counts: digits go through BPE too
LARGEST_NUMBER = 2025
SENTENCE_ENDS = (".", "?", "!")
SENTENCE_END_WEIGHTS = (0.8, 0.15, 0.05)  # statements mostly; some questions


@cache
def word_stock() -> tuple[tuple[str, ...], tuple[float, ...]]:
    """The words in Zipf rank order and their cumulative weights (for Random.choices)."""
    rng = random.Random(WORD_STOCK_SEED)
    words = list(dict.fromkeys(COMMON_WORDS))
    seen = set(words)
    target = len(words) + TAIL_WORDS
    while len(words) < target:
        syllables = rng.choices(SYLLABLE_COUNTS, weights=SYLLABLE_COUNT_WEIGHTS)[0]
        word = "".join(rng.choice(ONSETS) + rng.choice(VOWELS) + rng.choice(CODAS)
                       for _ in range(syllables))
        if word not in seen:
            seen.add(word)
            words.append(word)
    weights = [1.0 / (rank + ZIPF_OFFSET) ** ZIPF_EXPONENT for rank in range(len(words))]
    cumulative = tuple(accumulate(weights))
    return tuple(words), cumulative


def sentence(rng: random.Random, n_words: int) -> str:
    words, cumulative = word_stock()
    drawn = rng.choices(words, cum_weights=cumulative, k=n_words)
    pieces = []
    for position, word in enumerate(drawn):
        if position == 0:
            word = word.capitalize()  # and no number here: writers spell a number out there
        elif rng.random() < NUMBER_INSTEAD_OF_WORD:
            word = str(rng.randint(1, LARGEST_NUMBER))
        if position < n_words - 1 and rng.random() < COMMA_AFTER_WORD:
            word += ","
        pieces.append(word)
    end = rng.choices(SENTENCE_ENDS, weights=SENTENCE_END_WEIGHTS)[0]
    return " ".join(pieces) + end


def corpus(n_texts: int, seed: int,
           words_per_text: tuple[int, int] = WORDS_PER_TEXT) -> list[str]:
    """n_texts English-like ASCII request texts, the same for the same seed: Zipf-distributed
    words, sentences with capitals, commas, periods and question marks, a few numbers."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n_texts):
        words_left = rng.randint(*words_per_text)
        sentences = []
        while words_left > 0:
            n_words = min(words_left, rng.randint(*WORDS_PER_SENTENCE))
            sentences.append(sentence(rng, n_words))
            words_left -= n_words
        texts.append(" ".join(sentences))
    return texts


# --- The vocabulary ---------------------------------------------------------------------------
@dataclass
class Vocabulary:
    """A trained BPE model as plain tables: both tokenizers are built from these alone."""
    vocab: dict[str, int]  # token -> id
    merges: list[tuple[str, str]]  # rank order: merges[0] is applied first
    # (first, second) -> rank, made once here: a slow tokenizer builds it at load, not per text.
    ranks: dict[tuple[str, str], int] = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        self.ranks = {pair: rank for rank, pair in enumerate(self.merges)}

    @property
    def pad_id(self) -> int:
        return self.vocab[PAD_TOKEN]

    @property
    def unk_id(self) -> int:
        return self.vocab[UNK_TOKEN]


def train(texts: list[str], vocab_size: int) -> Vocabulary:
    """BPE trained by `tokenizers` (Rust) on texts: no subword prefix or end-of-word suffix, so a
    word starts from its bare characters. Deterministic: the trainer breaks ties between pairs of
    equal count by their ids, and gives the alphabet ids in character order."""
    tokenizer = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    # The model's merges are not exposed in Python except through its JSON (in rank order).
    model = json.loads(tokenizer.to_str())["model"]
    return Vocabulary(vocab=dict(model["vocab"]),
                      merges=[(first, second) for first, second in model["merges"]])


# --- The slow tokenizer: pure Python -------------------------------------------------------
def bpe_word(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """GPT-2's bpe() without its cache: from single characters, merge the pair of lowest rank,
    everywhere it occurs (left to right, so "aaa" gives "aa" "a"), until no pair is a merge.
    `tokenizers` merges from a heap ordered by (rank, position) instead; for trained tables (a
    merge's parts are made by earlier merges, so a pair a merge creates ranks after it) the order
    is the same. No cache on purpose: the repetitive request texts would hide the cost the demo
    shows."""
    symbols = list(word)
    while len(symbols) > 1:
        first, second = min(zip(symbols, symbols[1:]),
                             key=lambda pair: ranks.get(pair, len(ranks)))
        if (first, second) not in ranks:
            break
        merged = []
        index = 0
        while index < len(symbols):
            if (index + 1 < len(symbols) and symbols[index] == first
                    and symbols[index + 1] == second):
                merged.append(first + second)
                index += 2
            else:
                merged.append(symbols[index])
                index += 1
        symbols = merged
    return symbols


def python_encode(text: str, vocabulary: Vocabulary) -> list[int]:
    """The token ids of text, in pure Python: split into words and punctuation runs, BPE each.
    A symbol not in the vocabulary (a character never seen in training) is [UNK], one per
    character, as `tokenizers` does without fuse_unk."""
    vocab, ranks, unk_id = vocabulary.vocab, vocabulary.ranks, vocabulary.unk_id
    return [vocab.get(symbol, unk_id)
            for word in WORDS_AND_PUNCTUATION.findall(text)
            for symbol in bpe_word(word, ranks)]


# --- The fast tokenizer: Hugging Face `tokenizers` (Rust) -----------------------------------
def rust_tokenizer(vocabulary: Vocabulary) -> Tokenizer:
    """A `tokenizers` BPE built from the tables alone (not the trained object), with the same
    pre-tokenizer; encode_batch(texts) then .ids gives python_encode's ids. It keeps the BPE
    model's default word cache (10,000 words), as a deployed fast tokenizer does."""
    tokenizer = Tokenizer(models.BPE(vocab=vocabulary.vocab, merges=vocabulary.merges,
                                     unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    return tokenizer


def rust_encode_batch(tokenizer: Tokenizer, texts: list[str]) -> list[list[int]]:
    """The ids of each text, encoded by Rust in parallel across its threads. encode_batch_fast
    skips the character offsets of each token, which a classifier never reads: 10 ms against 16
    ms for 32 texts of ~550 words on the project's 2-core box."""
    return [encoding.ids for encoding in tokenizer.encode_batch_fast(texts)]
