"""How much harder the KJV recipe's held-out text is than the rest of the Bible, measured with a
model that has no training budget to speak of: an interpolated absolute-discounting character
n-gram model (discount 0.75, backing off to a uniform distribution over the 256 bytes), counted
on everything but a held-out tenth and scored on that tenth in bits per character, for two
held-out tenths of data/kjv/kjv.txt (tools/data/kjv.sh):

    last    the last 10 % of the text, the recipe's held-out part (Acts 22:5 to Revelation 22:21)
    middle  the 10 % that starts halfway through the text (Psalms 62 to Isaiah 52)

Developer tool (numpy not needed; a few minutes per order on one core):

    python3 tools/reference/kjv_ngram_split.py data/kjv/kjv.txt 3 5 7

Measured on 2026-12-05 (docs/TRAINING.md, "KJV character GPT"):

    order 3: last 2.6925, middle 2.5963
    order 5: last 1.9780, middle 1.8170
    order 7: last 2.0211, middle 1.7653   (order 7 overfits this smoothing on the last tenth)
"""
import collections
import math
import sys


def bits_per_char(train: bytes, test: bytes, order: int, discount: float = 0.75) -> float:
    counts = [collections.Counter() for _ in range(order + 1)]  # counts[n][n-gram]
    for n in range(1, order + 1):
        c = counts[n]
        for i in range(len(train) - n + 1):
            c[train[i:i + n]] += 1
    context_total = [collections.Counter() for _ in range(order + 1)]
    context_types = [collections.Counter() for _ in range(order + 1)]
    for n in range(1, order + 1):
        for gram, k in counts[n].items():
            context_total[n][gram[:-1]] += k
            context_types[n][gram[:-1]] += 1

    def prob(history: bytes, byte: int) -> float:
        p = 1.0 / 256
        for n in range(1, order + 1):
            if len(history) < n - 1:
                break
            h = history[len(history) - (n - 1):] if n > 1 else b""
            total = context_total[n].get(h, 0)
            if total == 0:
                break
            k = counts[n].get(h + bytes([byte]), 0)
            p = max(k - discount, 0) / total + discount * context_types[n][h] / total * p
        return p

    bits = 0.0
    for i in range(len(test)):
        bits -= math.log2(prob(test[max(0, i - order + 1):i], test[i]))
    return bits / len(test)


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit("usage: kjv_ngram_split.py KJV_TXT ORDER [ORDER ...]")
    text = open(sys.argv[1], "rb").read()
    tenth = len(text) // 10
    middle = len(text) // 2
    splits = {
        "last": (text[:len(text) - tenth], text[len(text) - tenth:]),
        "middle": (text[:middle] + text[middle + tenth:], text[middle:middle + tenth]),
    }
    for order in (int(a) for a in sys.argv[2:]):
        scores = {name: bits_per_char(tr, te, order) for name, (tr, te) in splits.items()}
        print(f"order {order}: " + ", ".join(f"{k} {v:.4f}" for k, v in scores.items()), flush=True)


if __name__ == "__main__":
    main()
