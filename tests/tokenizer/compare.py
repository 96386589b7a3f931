#!/usr/bin/env python3
"""Compares ganglion's tokenizer (through tok-driver) with the Python `tokenizers` package
on a corpus written here: ids with and without special tokens, and the decoded text with
and without them (ganglion decodes one id at a time, tokenizers all at once).

  compare.py DRIVER TOKENIZER.json [TOKENIZER.json ...]

A TOKENIZER may also be FILE.gguf=REFERENCE.json: ganglion loads the GGUF file's own
tokenizer (gang_gguf_tokenizer_load), `tokenizers` the reference tokenizer.json made
from the same file (tests/tokenizer/gguf-spm-ref.py).

Prints one line per tokenizer and a JSON line with the encode throughput of both in the
same run (median of rounds over the whole corpus, one thread). Exit 1 on any difference."""
import json
import os
import random
import subprocess
import sys
import tempfile
import time

from tokenizers import Tokenizer

ROUNDS = 5


def corpus():
    c = [
        "Hello world", "Hello, world! How are you today?", "", " ", "a",
        "The quick brown fox jumps over the lazy dog.",
        "Bonjour, ça va ? Où est la bibliothèque ?", "Grüße aus München, Straße 5ß",
        "Привет, как дела? Москва 2024", "Γειά σου Κόσμε", "שלום עולם", "مرحبا بالعالم",
        "你好，世界！今天天气很好。", "日本語のテキスト、カタカナとひらがな。", "한국어 텍스트입니다",
        "हिन्दी पाठ का उदाहरण", "ภาษาไทยไม่มีช่องว่าง", "Tiếng Việt có dấu",
        "emoji: 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇫🇷🇯🇵 ❤️ 🤖", "🦀" * 40, "a😀b😀c",
        " " * 10000, "\t" * 500 + "x", "\n" * 300, " \n \n\t\t  \r\n", "x" + " " * 5000 + "y",
        "   leading and trailing   ", "\u00a0nbsp\u00a0and\u2003em\u2028ls\u180emvs\u3000ideo",
        "def f(x):\n    return x ** 2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n",
        "int main(void) { for (int i = 0; i < 10; i++) printf(\"%d\\n\", i); return 0; }",
        "<div class=\"a\">&amp; &lt;tag&gt;</div>", "SELECT * FROM t WHERE id IN (1,2,3);",
        "0 1 12 123 1234 12345 3.14159 -42 1e10 0xFF 1,000,000 ٣٤٥ ½ ² ⅷ",
        "2024-01-15T12:34:56Z", "I'm you're they've we'll she'd it's DON'T I'M",
        "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>",
        "text<|endoftext|>more text<|endoftext|><|endoftext|>",
        "<|im_start|<|im_end <|im_start|>> <|<|im_end|>|>", "<0xFF> <unk> <s> </s>",
        "use <tool> here", "a  <tool>  b", "<tool><tool>", "  <tool>", "x<tool>y",
        "\u0301\u0301 combining marks e\u0301", "\ufffd replacement \ufffd",
        "control \x01\x02\x1b[31mred\x1b[0m \x7f", "\u200b\u200c\u200d zero widths \ufeff",
        "a" * 50000, "ab" * 20000, "!" * 3000, "🙂" * 3000, "1" * 5000,
        "mixed" + "é" * 1000 + "z", "\U0001F600\U000E0001\U0010FFFD private use \ue000",
        "𝕳𝖊𝖑𝖑𝖔 𝓦𝓸𝓻𝓵𝓭", "ｆｕｌｌｗｉｄｔｈ ＡＢＣ １２３",
    ]
    words = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod".split()
    c.append(" ".join(words[(i * 7) % len(words)] for i in range(20000)))
    return c


def main():
    driver, toks = sys.argv[1], sys.argv[2:]
    texts = corpus()
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        cpath = os.path.join(tmp, "corpus.json")
        with open(cpath, "w", encoding="utf-8") as f:
            json.dump(texts, f, ensure_ascii=False)
        for tpath in toks:
            ours_path, _, ref_path = tpath.partition("=")
            tpath = ref_path or ours_path
            name = os.path.basename(ours_path)
            hf = Tokenizer.from_file(tpath)
            # Random id sequences, decoded only: invalid UTF-8 across tokens, byte-fallback
            # runs cut by other tokens, special tokens anywhere.
            rng = random.Random(11)
            nv = hf.get_vocab_size(with_added_tokens=True)
            idseqs = [[rng.randrange(300) if rng.random() < 0.6 else rng.randrange(nv)
                       for _ in range(rng.randrange(1, 40))] for _ in range(300)]
            with open(cpath, "w", encoding="utf-8") as f:
                json.dump(texts + idseqs, f, ensure_ascii=False)
            opath = os.path.join(tmp, "out.json")
            run = subprocess.run([driver, ours_path, cpath, opath, str(ROUNDS)],
                                 capture_output=True, text=True, timeout=120)
            if run.returncode != 0:
                print(f"FAIL {name}: driver exit {run.returncode}: {run.stderr.strip()}")
                failed += 1
                continue
            with open(opath, encoding="utf-8") as f:
                got = json.load(f)
            for g in got:  # the driver writes decoded text in hex (it may hold NULs)
                for k in ("text", "text_skip"):
                    g[k] = bytes.fromhex(g[k]).decode("utf-8")
            bad = 0
            for ids, g in zip(idseqs, got[len(texts):]):
                for what, skip in (("text", False), ("text_skip", True)):
                    want = hf.decode(ids, skip_special_tokens=skip)
                    if want != g[what]:
                        bad += 1
                        if bad <= 5:
                            print(f"  {name} decode {what} differs on ids {ids[:20]}:\n"
                                  f"    tokenizers {want[:100]!r}\n"
                                  f"    ganglion   {g[what][:100]!r}")
            nids = 0
            for text, g in zip(texts, got):
                ids = hf.encode(text, add_special_tokens=False).ids
                ids_sp = hf.encode(text, add_special_tokens=True).ids
                nids += len(ids)
                checks = [("ids", ids, g["ids"]), ("ids_special", ids_sp, g["ids_special"]),
                          ("text", hf.decode(ids, skip_special_tokens=False), g["text"]),
                          ("text_skip", hf.decode(ids, skip_special_tokens=True),
                           g["text_skip"])]
                for what, want, have in checks:
                    if want != have:
                        bad += 1
                        if bad <= 5:
                            print(f"  {name} {what} differs on {text[:40]!r}:\n"
                                  f"    tokenizers {str(want)[:200]}\n"
                                  f"    ganglion   {str(have)[:200]}")
            print(f"{'FAIL' if bad else 'ok'} {name}: {len(texts)} texts, {nids} ids, "
                  f"{len(idseqs)} random id sequences decoded, {bad} differences")
            failed += bad > 0
            secs = []
            for _ in range(ROUNDS):
                t0 = time.perf_counter()
                for text in texts:
                    hf.encode(text, add_special_tokens=False)
                secs.append(time.perf_counter() - t0)
            secs.sort()
            nbytes = sum(len(t.encode("utf-8")) for t in texts)
            ours = json.loads(run.stdout.strip().splitlines()[-1])
            print(json.dumps({"tokenizer": name, "bytes": nbytes, "rounds": ROUNDS,
                              "ganglion_median_s": ours["median_s"],
                              "tokenizers_median_s": round(secs[ROUNDS // 2], 6),
                              "ganglion_MBps": round(nbytes / ours["median_s"] / 1e6, 2),
                              "tokenizers_MBps": round(nbytes / secs[ROUNDS // 2] / 1e6, 2)}))
    print(f"{len(toks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
