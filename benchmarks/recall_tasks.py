"""Seeded long-range recall tasks: synthetic training documents and RULER-style retrieval probes.

The small checkpoints of issue 50 must need their recurrent state, so their
training text is mixed with documents in which a token can only be predicted
by remembering something seen far back, and they are scored on retrieval
tasks at several context lengths. Both are built here from the checkpoints'
own tokenizer, as token sequences, with nothing but the standard library
(and numpy or torch arrays for the filler text).

Every document is a haystack of real text (a contiguous slice of a token
stream: the train split for training documents, held-out text for probes)
with short Python-like lines inserted into it. A *key* is two words of the
tokenizer's vocabulary joined by an underscore (``sel_urn``), a *value* a
number from 1000 to 9999. The lines are built from separately encoded pieces
(``\\nmemo.``, the key, `` =``, the value with its leading space, ...), each
cut at the tokenizer's pre-token boundaries, so that a key or a value is
always the same tokens wherever it appears and the sequence decodes to the
text shown. The formats:

* a fact: ``\\nmemo.KEY = VALUE\\n``;
* a multi-value fact (one per value, in order): ``\\nmemo.KEY.append( VALUE)\\n``;
* a query of a fact: ``\\nassert memo.KEY ==`` followed by the answer
  `` VALUE``;
* a query of a multi-value key: ``\\nassert memo.KEY == [`` followed by the
  answer `` V1, V2, V3, V4]``;
* a span to copy: ``\\n# span memo.KEY:\\n`` + SPAN + ``\\n# end span\\n``, and
  far later ``\\n# again memo.KEY:\\n`` + the same SPAN + ``\\n# end span\\n``
  (SPAN: 16 to 64 tokens of the filler stream taken from elsewhere).

Training documents (:func:`training_document`, exactly ``length`` tokens,
every token scored like text) are of three kinds, drawn with equal odds:

* ``kv``: 2 to 8 facts (some keys multi-valued, 2 to 4 values) scattered
  over the whole document; each key is queried once, with its answer and a
  newline, at a random point after its last fact;
* ``copy``: 1 to 3 spans, each repeated at a random point after it;
* ``mqar`` (multi-query associative recall): 8 to 32 facts (fewer in
  documents too short for them) in one block in the first 40% of the document, then, after a gap of filler, a block of
  queries of all of them in a random order, each followed by its answer.

Probes (:func:`probe`, RULER's niah tasks in this syntax) have a prompt of
exactly ``context`` tokens that ends where the answer starts; the answer is
scored by exact match (every answer token the model's first choice, which is
what greedy decoding would produce):

* ``needle``: one fact at a uniformly random depth, then its query;
* ``multikey``: four facts with different keys at random depths, the query
  of one of them (the other three are distractors);
* ``multivalue``: four multi-value facts of one key at random depths, in
  order, then the list query: all four values, in order.

Determinism: every document and probe comes from ``random.Random`` seeded
with a string (``f"{seed}:{task}:{context}:{index}"`` and the like), which
Python hashes with SHA-512, so the same seed gives the same tokens on any
machine and interpreter run. The key words depend only on the tokenizer.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

#: Probe tasks, in report order.
PROBE_TASKS = ("needle", "multikey", "multivalue")
#: Training document kinds.
TRAINING_KINDS = ("kv", "copy", "mqar")
#: Context lengths the quality harness probes by default.
PROBE_CONTEXTS = (512, 1024, 2048, 4096)
#: Changing any format above changes this; recorded with results.
FORMAT_VERSION = 1

_WORD = re.compile(r"[a-z]{3,7}")
_VALUE_RANGE = (1000, 9999)


class TaskVocab:
    """The pieces tasks are made of, encoded once with the checkpoints' tokenizer.

    ``tokenizer`` is a ``tokenizers.Tokenizer`` or a Hugging Face tokenizer:
    anything whose ``encode(text)`` gives an object with ``.ids`` or a list
    of ids without special tokens added, and which ``decode``s a list of ids.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self._cache: dict[str, list[int]] = {}
        size = len(tokenizer.get_vocab()) if hasattr(tokenizer, "get_vocab") else tokenizer.get_vocab_size()
        # Key words: lowercase vocabulary entries that encode back to themselves,
        # so a key's tokens are fixed whatever surrounds them.
        words = []
        for i in range(size):
            text = self.decode([i])
            if _WORD.fullmatch(text) and self.encode(text) == [i]:
                words.append(text)
        if len(words) < 16:
            raise ValueError(f"the tokenizer has only {len(words)} usable key words")
        self.words = words

    @classmethod
    def from_file(cls, path) -> TaskVocab:
        """The vocabulary of a ``tokenizer.json`` file (``train_small.py prepare`` writes one)."""
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_file(str(path)))

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (no special tokens), cached."""
        ids = self._cache.get(text)
        if ids is None:
            try:
                out = self.tokenizer.encode(text, add_special_tokens=False)
            except TypeError:
                out = self.tokenizer.encode(text)
            ids = list(out.ids if hasattr(out, "ids") else out)
            self._cache[text] = ids
        return list(ids)

    def decode(self, ids) -> str:
        return self.tokenizer.decode(list(ids))

    def pieces(self, *texts: str) -> list[int]:
        """The concatenated encodings of ``texts``, each encoded on its own."""
        out: list[int] = []
        for text in texts:
            out.extend(self.encode(text))
        return out


# --------------------------------------------------------------------------
# the lines


def fact(vocab: TaskVocab, key: str, value: int) -> list[int]:
    return vocab.pieces("\nmemo.", key, " =", f" {value}", "\n")


def append_fact(vocab: TaskVocab, key: str, value: int) -> list[int]:
    return vocab.pieces("\nmemo.", key, ".append(", f" {value}", ")\n")


def query(vocab: TaskVocab, key: str) -> list[int]:
    return vocab.pieces("\nassert memo.", key, " ==")


def list_query(vocab: TaskVocab, key: str) -> list[int]:
    return vocab.pieces("\nassert memo.", key, " == [")


def answer(vocab: TaskVocab, value: int) -> list[int]:
    return vocab.pieces(f" {value}")


def list_answer(vocab: TaskVocab, values: list[int]) -> list[int]:
    texts = []
    for i, v in enumerate(values):
        texts.append(f" {v}")
        texts.append("," if i + 1 < len(values) else "]")
    return vocab.pieces(*texts)


def _keys(vocab: TaskVocab, rng: random.Random, count: int) -> list[str]:
    """``count`` distinct keys."""
    keys: list[str] = []
    while len(keys) < count:
        key = f"{rng.choice(vocab.words)}_{rng.choice(vocab.words)}"
        if key not in keys:
            keys.append(key)
    return keys


def _values(rng: random.Random, count: int) -> list[int]:
    """``count`` distinct values."""
    return rng.sample(range(_VALUE_RANGE[0], _VALUE_RANGE[1] + 1), count)


def _filler(stream, start: int, count: int) -> list[int]:
    return [int(t) for t in stream[start : start + count]]


def _slice(stream, rng: random.Random, count: int) -> list[int]:
    """A random contiguous slice of ``count`` tokens of ``stream``."""
    if count <= 0:
        return []
    if len(stream) < count:
        raise ValueError(f"the filler stream has {len(stream)} tokens, {count} needed")
    start = rng.randrange(0, len(stream) - count + 1)
    return _filler(stream, start, count)


def _assemble(items: list[tuple[float, int, list[int], list[bool]]], haystack: list[int]) -> tuple[list[int], list[bool]]:
    """Insert ``items`` (fraction of the haystack, order, tokens, answer flags) into ``haystack`` in place
    order; returns the tokens and their answer flags (the haystack's are False)."""
    out: list[int] = []
    flags: list[bool] = []
    cursor = 0
    for where, _, tokens, answers in sorted(items, key=lambda item: (item[0], item[1])):
        cut = min(len(haystack), max(cursor, round(where * len(haystack))))
        out.extend(haystack[cursor:cut])
        flags.extend([False] * (cut - cursor))
        out.extend(tokens)
        flags.extend(answers)
        cursor = cut
    out.extend(haystack[cursor:])
    flags.extend([False] * (len(haystack) - cursor))
    return out, flags


def _line(tokens: list[int]) -> tuple[list[int], list[bool]]:
    """A line no token of which is an answer."""
    return tokens, [False] * len(tokens)


def _asked(ask: list[int], answer_tokens: list[int], tail: list[int]) -> tuple[list[int], list[bool]]:
    """A query line: ``ask``, then its answer (flagged), then ``tail``."""
    return ask + answer_tokens + tail, [False] * len(ask) + [True] * len(answer_tokens) + [False] * len(tail)


# --------------------------------------------------------------------------
# probes


@dataclass
class Probe:
    """One retrieval probe: ``ids`` is the prompt followed by the answer.

    ``keys``, ``values`` and ``depths`` (fraction of the haystack before
    each line) describe the inserted lines in the order they appear;
    ``asked`` is the index of the queried key in ``keys``.
    """

    task: str
    context: int
    ids: list[int]
    answer_start: int
    keys: list[str] = field(default_factory=list)
    values: list[int] = field(default_factory=list)
    depths: list[float] = field(default_factory=list)
    asked: int = 0

    @property
    def prompt(self) -> list[int]:
        return self.ids[: self.answer_start]

    @property
    def answer(self) -> list[int]:
        return self.ids[self.answer_start :]


def probe(vocab: TaskVocab, filler, task: str, context: int, rng: random.Random) -> Probe:
    """One probe of ``task`` whose prompt is exactly ``context`` tokens, from ``filler`` text."""
    asked = 0
    if task == "needle":
        keys, values = _keys(vocab, rng, 1), _values(rng, 1)
        lines = [fact(vocab, keys[0], values[0])]
        ask, gold = query(vocab, keys[0]), answer(vocab, values[0])
    elif task == "multikey":
        keys, values = _keys(vocab, rng, 4), _values(rng, 4)
        lines = [fact(vocab, k, v) for k, v in zip(keys, values)]
        asked = rng.randrange(4)
        ask, gold = query(vocab, keys[asked]), answer(vocab, values[asked])
    elif task == "multivalue":
        keys, values = _keys(vocab, rng, 1), _values(rng, 4)
        lines = [append_fact(vocab, keys[0], v) for v in values]
        ask, gold = list_query(vocab, keys[0]), list_answer(vocab, values)
    else:
        raise ValueError(f"unknown probe task {task!r}; known: {', '.join(PROBE_TASKS)}")
    room = context - len(ask) - sum(len(line) for line in lines)
    if room < 16:
        raise ValueError(f"context {context} is too short for {task}")
    depths = sorted(rng.random() for _ in lines)
    haystack = _slice(filler, rng, room)
    prompt = _assemble([(d, i, *_line(line)) for i, (d, line) in enumerate(zip(depths, lines))], haystack)[0] + ask
    assert len(prompt) == context
    if task == "multivalue":  # one key, so one depth per value
        keys = keys * len(values)
    return Probe(task, context, prompt + gold, len(prompt), keys, values, depths, asked)


def probe_set(vocab: TaskVocab, filler, task: str, context: int, count: int, seed: int = 0) -> list[Probe]:
    """``count`` probes of ``task`` at ``context``: probe ``i`` is seeded with ``f"{seed}:{task}:{context}:{i}"``."""
    return [probe(vocab, filler, task, context, random.Random(f"{seed}:{task}:{context}:{i}")) for i in range(count)]


# --------------------------------------------------------------------------
# training documents


def training_document(vocab: TaskVocab, filler, length: int, rng: random.Random, kind: str | None = None) -> list[int]:
    """A synthetic document of exactly ``length`` tokens (kind drawn from :data:`TRAINING_KINDS` if not given)."""
    return training_document_and_answers(vocab, filler, length, rng, kind)[0]


def training_document_and_answers(
    vocab: TaskVocab, filler, length: int, rng: random.Random, kind: str | None = None
) -> tuple[list[int], list[bool]]:
    """:func:`training_document` and, per token, whether it is an answer: a value after a query (and the
    list's separators), or a repeated span's token after its ``# again`` line. The same ``rng`` gives the
    same document either way."""
    kind = kind or rng.choice(TRAINING_KINDS)
    items: list[tuple[float, int, list[int], list[bool]]] = []
    if kind == "kv":
        count = rng.randint(2, 8)
        keys = _keys(vocab, rng, count)
        order = 0
        for key in keys:
            if rng.random() < 0.3:
                values = _values(rng, rng.randint(2, 4))
                places = sorted(rng.random() * 0.9 for _ in values)
                for place, value in zip(places, values):
                    items.append((place, order, *_line(append_fact(vocab, key, value))))
                    order += 1
                line = _asked(list_query(vocab, key), list_answer(vocab, values), vocab.encode("\n"))
            else:
                values = _values(rng, 1)
                places = [rng.random() * 0.9]
                items.append((places[0], order, *_line(fact(vocab, key, values[0]))))
                order += 1
                line = _asked(query(vocab, key), answer(vocab, values[0]), vocab.encode("\n"))
            items.append((rng.uniform(places[-1], 1.0), order, *line))
            order += 1
    elif kind == "copy":
        for i, key in enumerate(_keys(vocab, rng, rng.randint(1, 3))):
            span = _slice(filler, rng, rng.randint(16, 64))
            first = vocab.pieces("\n# span memo.", key, ":\n") + span + vocab.encode("\n# end span\n")
            again = _asked(vocab.pieces("\n# again memo.", key, ":\n"), span, vocab.encode("\n# end span\n"))
            place = rng.random() * 0.7
            items.append((place, 2 * i, *_line(first)))
            items.append((rng.uniform(place, 1.0), 2 * i + 1, *again))
    elif kind == "mqar":
        # Each pair costs about 20 tokens (its fact and its query): at most
        # 60% of the document, so that both blocks always fit.
        count = min(rng.randint(8, 32), max(1, int(0.6 * length) // 20))
        keys, values = _keys(vocab, rng, count), _values(rng, count)
        block = [t for k, v in zip(keys, values) for t in fact(vocab, k, v)]
        asked = list(range(count))
        rng.shuffle(asked)
        queries: tuple[list[int], list[bool]] = ([], [])
        for i in asked:
            tokens, answers = _asked(query(vocab, keys[i]), answer(vocab, values[i]), [])
            queries[0].extend(tokens)
            queries[1].extend(answers)
        queries[0].extend(vocab.encode("\n"))
        queries[1].extend([False] * len(vocab.encode("\n")))
        start = rng.random() * 0.4
        items.append((start, 0, *_line(block)))
        items.append((rng.uniform(start, 1.0), 1, *queries))
    else:
        raise ValueError(f"unknown training document kind {kind!r}; known: {', '.join(TRAINING_KINDS)}")
    room = length - sum(len(item[2]) for item in items)
    # Too many lines for this length: drop the last-placed ones. A query is
    # placed after its facts and a repeat after its span, so none is left
    # without what it refers to.
    while room < 0:
        items.sort(key=lambda item: (item[0], item[1]))
        room += len(items.pop()[2])
    doc, answers = _assemble(items, _slice(filler, rng, room))
    assert len(doc) == len(answers) == length
    return doc, answers


def mix_batch(vocab: TaskVocab, filler, rows, fraction: float, seed: int, step: int, answers=None):
    """Replace a seeded ``fraction`` of the rows of ``rows`` (a (B, L) int tensor) by training documents, in place.

    Row ``r`` of step ``step`` is replaced when ``random.Random(f"{seed}:mix:{step}:{r}")``
    draws below ``fraction``; the document comes from the same generator.
    ``answers`` (a (B, L) bool tensor, optional) gets each row's answer flags
    (:func:`training_document_and_answers`; False in rows left as text).
    Returns the indices of the rows replaced.
    """
    import torch

    replaced = []
    if answers is not None:
        answers.zero_()
    for r in range(rows.shape[0]):
        rng = random.Random(f"{seed}:mix:{step}:{r}")
        if rng.random() < fraction:
            doc, flags = training_document_and_answers(vocab, filler, rows.shape[1], rng)
            rows[r] = torch.tensor(doc, dtype=rows.dtype)
            if answers is not None:
                answers[r] = torch.tensor(flags)
            replaced.append(r)
    return replaced


# --------------------------------------------------------------------------
# scoring with one forward


def answer_scores(model, probes: list[Probe], device, batch: int = 8, pad_id: int = 0) -> list[tuple[bool, int]]:
    """Per probe: (exact match, answer tokens that are the first choice), teacher-forced, one full forward per batch.

    Exact match equals that of greedy decoding: greedy decoding reproduces the
    answer exactly when every answer token is the first choice given the
    answer tokens before it. The token count is the finer signal while a
    model is still learning the tasks (a 4-digit value is several tokens).
    """
    import torch

    out: list[tuple[bool, int]] = []
    for s in range(0, len(probes), batch):
        group = probes[s : s + batch]
        width = max(len(p.ids) for p in group)
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        for i, p in enumerate(group):
            ids[i, : len(p.ids)] = torch.tensor(p.ids)
        with torch.no_grad():
            logits = model(input_ids=ids.to(device), use_cache=False).logits
        first = logits.argmax(-1).cpu()
        for i, p in enumerate(group):
            # the logits at position t predict token t + 1
            right = first[i, p.answer_start - 1 : len(p.ids) - 1] == torch.tensor(p.answer)
            out.append((bool(right.all()), int(right.sum())))
    return out


def exact_match(model, probes: list[Probe], device, batch: int = 8, pad_id: int = 0) -> list[bool]:
    """Whether the model's first choice is every answer token (:func:`answer_scores`)."""
    return [exact for exact, _ in answer_scores(model, probes, device, batch, pad_id)]
