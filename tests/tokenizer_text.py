#!/usr/bin/env python3
"""Writes the varied text the GPT-2 tokenizer test compares on (about 300 KB, deterministic):
the default corpus (fortunes), licenses, non-ASCII scripts, every kind of whitespace JavaScript's
\\s knows (and some it does not), contractions in both cases, digits of several scripts, emoji,
combining marks and <|endoftext|>. usage: tokenizer_text.py OUT [CORPUS_FILE...]"""
import random
import sys

out, corpora = sys.argv[1], sys.argv[2:]
rng = random.Random(11)
parts = []
budget = 200000
for path in corpora:
    try:
        text = open(path, encoding="utf-8", errors="replace").read()
    except OSError:
        continue
    take = text[: budget // max(1, len(corpora))]
    parts.append(take)

spaces = [" ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\x0b", "\x0c", "\u00a0", "\u1680",
          "\u2000", "\u2005", "\u200a", "\u2028", "\u2029", "\u202f", "\u205f", "\u3000", "\ufeff",
          "\u0085", "\u180e", "\u200b", " \n ", "\n \n", "  \t "]
words = ["Hello", "world", "naïve", "café", "Straße", "東京", "日本語のテキスト", "Ελληνικά",
         "русский", "עברית", "العربية", "हिन्दी", "한국어", "ไทย", "e\u0301", "x\u0308y",
         "ǅemal", "Ⅻ", "ⅷ", "²³", "½", "١٢٣", "०१२", "12345", "3.14159", "1,000,000", "0x1F",
         "it's", "IT'S", "they're", "we'll", "I'd", "you've", "I'm", "don't", "'s", "'", "''",
         "'tis", "rock'n'roll", "🙂", "🚀", "👩‍💻", "🇫🇷", "—", "…", "«»", "$%^&*", "#!", "::",
         "<|endoftext|>", "<|endoftext", "|>", "<|", "a<|endoftext|>b", "\\", "()[]{}", "_x_",
         "\u00ad", "\u0000", "\x7f", "\x01", "ʰ", "ꞵ", "𝔘𝔫𝔦", "𝟘𝟙", "ß", "ﬁ"]
mixed = []
for _ in range(12000):
    mixed.append(rng.choice(words))
    mixed.append(rng.choice(spaces) if rng.random() < 0.6 else " ")
parts.append("".join(mixed))
parts.append(" " * 50 + "x" + "\n" * 30 + "y" + "\t \t \t" + "z" + "9" * 80 + "a" * 200 + " ")
parts.append("It's they're we'll I'd 12345 3.14159 <|endoftext|> x\u00a0y\n" * 20)
open(out, "w", encoding="utf-8").write("\n".join(parts))
