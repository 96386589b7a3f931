#!/usr/bin/env python3
"""Encode throughput of ganglion's tokenizer against the Python `tokenizers` package, in the
same run, on the same corpus, one thread each; and a check that both give identical ids.

  tokenizer-throughput.py --tok-bench BUILD/tests/tok-bench [--tokenizers DIR]
                          [--mb 2] [--repeats 5] [--json OUT.json]

The corpus (about --mb MB, built deterministically, seed 11, from files every Debian 12
machine has): English prose (/usr/share/common-licenses, with case and number variations),
Python code (/usr/lib/python3.11/*.py, sorted), multilingual text (sentences in 16 scripts,
mixed with seeded words drawn from the alphabets of those scripts, so that not every word
repeats) and whitespace-heavy documents (space/tab/newline runs, aligned tables, indented
code), cut into documents of at most 8 KiB; its SHA-256 is printed so runs can be compared.

For each tokenizer of DIR (scripts/fetch-test-models.sh: smollm2.json, smollm2-l3.json,
mistral-v1.json), each repeat runs both sides one after the other, never at once
(ganglion first, then tokenizers; repeats interleaved):
* ganglion: the C helper tok-bench (tests/tokenizer/tok-bench.c) encodes every document once
  untimed (warm-up; it writes the ids), then once more timing only the encode calls;
* tokenizers: Tokenizer.from_file(...).encode(doc, add_special_tokens=False) per document,
  timed per call (RAYON_NUM_THREADS=1, TOKENIZERS_PARALLELISM=false), after one untimed
  pass; encode_batch over all documents is timed too, for information.
Special tokens are not added on either side. Reported: MB/s and tokens/s of both and the
ratio ganglion / tokenizers, medians of the repeats (min-max in the JSON), and whether
every document's ids were identical. Exit 1 when they are not."""
import argparse
import hashlib
import json
import os
import random
import struct
import subprocess
import sys
import tempfile
import time

# Before tokenizers is imported: one thread for encode_batch too.
os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
from tokenizers import Tokenizer  # noqa: E402

TOKENIZERS = ["smollm2.json", "smollm2-l3.json", "mistral-v1.json"]
DOC_MAX = 8192

# Short sentences of our own, one or two per script, for the multilingual part.
SENTENCES = [
    "The committee will meet again on Thursday to review the budget.",
    "Le train de 8 h 15 est annulé ; prenez le suivant, s'il vous plaît.",
    "Die Straßenbahn fährt heute wegen Bauarbeiten nur bis zum Hauptbahnhof.",
    "El mercado abre a las nueve y cierra cuando se acaba el pan.",
    "Ela disse que não sabia nada sobre a reunião de amanhã.",
    "Сегодня вечером в библиотеке будет лекция о северных птицах.",
    "Το λιμάνι ήταν γεμάτο βάρκες που περίμεναν τον καλό καιρό.",
    "הספרייה פתוחה עד השעה שמונה בערב בימי חמישי.",
    "سيصل القطار إلى المحطة بعد عشر دقائق تقريبا.",
    "我们明天早上八点在学校门口集合，然后一起去博物馆。",
    "この町には古い寺が三つあり、春には桜がとてもきれいです。",
    "오늘 오후에는 비가 오니까 우산을 꼭 챙기세요.",
    "कल सुबह बाज़ार में ताज़ी सब्ज़ियाँ बहुत सस्ती थीं।",
    "ฝนตกหนักมากเมื่อคืนนี้ถนนหลายสายจึงมีน้ำท่วม",
    "Hôm nay trời đẹp nên chúng tôi đi dạo quanh hồ.",
    "Yarın sabah erkenden yola çıkmamız gerekiyor.",
    "Pociąg do Krakowa odjeżdża z peronu trzeciego.",
    "emoji 😀 👍🏽 👨‍👩‍👧 🇫🇷 ❤️ — prices: €12.50, ¥300, ½ off, 3×4=12",
]
ALPHABETS = [
    (0x61, 0x7A), (0xE0, 0xFF), (0x430, 0x44F), (0x3B1, 0x3C9), (0x5D0, 0x5EA),
    (0x627, 0x64A), (0x4E00, 0x4FFF), (0x3041, 0x3093), (0x30A1, 0x30F3), (0xAC00, 0xAD00),
    (0x915, 0x939), (0xE01, 0xE2E), (0x10D0, 0x10F0), (0x531, 0x556), (0x1F600, 0x1F64F),
]


def cut_docs(text, rng):
    """text in documents of 1..DOC_MAX bytes, cut at line ends where possible."""
    docs = []
    while text:
        want = rng.randrange(DOC_MAX // 4, DOC_MAX)
        piece = text[:want]
        while len(piece.encode("utf-8")) > DOC_MAX:
            piece = piece[:len(piece) * 3 // 4]
        nl = piece.rfind("\n")
        if 0 < nl and len(piece) < len(text) and nl > len(piece) // 2:
            piece = piece[:nl + 1]
        docs.append(piece)
        text = text[len(piece):]
    return docs


def read_files(paths):
    seen, out = set(), []
    for p in sorted(paths):
        real = os.path.realpath(p)
        if real in seen or not os.path.isfile(real):
            continue
        seen.add(real)
        with open(real, encoding="utf-8", errors="replace") as f:
            out.append(f.read().replace("\0", ""))
    return out


def prose(rng, budget):
    lic = "/usr/share/common-licenses"
    texts = read_files(os.path.join(lic, n) for n in os.listdir(lic)) if os.path.isdir(lic) else []
    texts = texts or [" ".join(SENTENCES[:1]) * 50]
    out, size, k = [], 0, 0
    while size < budget:
        t = texts[k % len(texts)]
        if k >= len(texts):  # variations once every file was used as is
            words = t.split(" ")
            for i in range(0, len(words), rng.randrange(5, 30)):
                w = words[i]
                words[i] = rng.choice([w.upper(), w.title(), w + str(rng.randrange(10000)),
                                       w + ",", "(" + w + ")"])
            t = " ".join(words)
        out += cut_docs(t, rng)
        size += len(t.encode("utf-8"))
        k += 1
    return out


def code(rng, budget):
    d = "/usr/lib/python3.11"
    files = ([os.path.join(d, n) for n in os.listdir(d) if n.endswith(".py")]
             if os.path.isdir(d) else [])
    out, size = [], 0
    for t in read_files(files):
        if size >= budget:
            break
        out += cut_docs(t, rng)
        size += len(t.encode("utf-8"))
    return out


def multilingual(rng, budget):
    out, size = [], 0
    while size < budget:
        parts = []
        for _ in range(rng.randrange(10, 80)):
            if rng.random() < 0.5:
                parts.append(rng.choice(SENTENCES))
            else:
                lo, hi = rng.choice(ALPHABETS)
                words = ["".join(chr(rng.randrange(lo, hi + 1)) for _ in range(rng.randrange(1, 9)))
                         for _ in range(rng.randrange(3, 12))]
                parts.append(" ".join(words) + rng.choice([".", "!", "?", "。", "،", ""]))
            parts.append(rng.choice([" ", " ", "\n", "\n\n"]))
        doc = "".join(parts)
        out += cut_docs(doc, rng)
        size += len(doc.encode("utf-8"))
    return out


def whitespace(rng, budget):
    out, size = [], 0
    while size < budget:
        lines = []
        for _ in range(rng.randrange(20, 120)):
            kind = rng.randrange(4)
            if kind == 0:  # aligned table
                lines.append("".join(str(rng.randrange(10 ** rng.randrange(1, 7))).ljust(12)
                                     for _ in range(rng.randrange(2, 7))))
            elif kind == 1:  # indented code, tabs or spaces
                ind = ("\t" * rng.randrange(0, 5) if rng.random() < 0.5
                       else " " * rng.randrange(0, 17))
                lines.append(ind + rng.choice(["if (x) {", "return y;", "}", "x += 1  # note",
                                               "for i in range(n):", "end"]))
            elif kind == 2:  # runs
                lines.append(rng.choice([" ", "\t", "\n", "\r\n", " \t"]) * rng.randrange(1, 200))
            else:
                lines.append("word " * rng.randrange(1, 12) + " " * rng.randrange(0, 30))
        doc = "\n".join(lines)
        out += cut_docs(doc, rng)
        size += len(doc.encode("utf-8"))
    return out


def build_corpus(mb):
    """(documents, sha256 of the corpus file) for about mb MB."""
    total = int(mb * 1e6)
    rng = random.Random(11)
    docs = (prose(rng, total * 0.3) + code(rng, total * 0.35) + multilingual(rng, total * 0.25)
            + whitespace(rng, total * 0.1))
    docs = [d for d in docs if d]
    return docs


def read_ids(path, ndocs):
    with open(path, "rb") as f:
        data = f.read()
    out, off = [], 0
    for _ in range(ndocs):
        (n,) = struct.unpack_from("<i", data, off)
        off += 4
        out.append(list(struct.unpack_from("<%di" % n, data, off)))
        off += 4 * n
    if off != len(data):
        raise RuntimeError("tok-bench wrote %d bytes, %d expected" % (len(data), off))
    return out


def run_ganglion(helper, tpath, cpath, ipath):
    r = subprocess.run([helper, tpath, cpath, ipath, "1"], capture_output=True, text=True,
                       timeout=600)
    if r.returncode != 0:
        raise RuntimeError("tok-bench %s exited %d: %s" % (tpath, r.returncode, r.stderr.strip()))
    return json.loads(r.stdout.strip().splitlines()[-1])


def run_tokenizers(hf, docs):
    sec, toks = 0.0, 0
    for d in docs:
        t0 = time.perf_counter()
        e = hf.encode(d, add_special_tokens=False)
        sec += time.perf_counter() - t0
        toks += len(e.ids)
    t0 = time.perf_counter()
    hf.encode_batch(docs, add_special_tokens=False)
    return sec, toks, time.perf_counter() - t0


def med(xs):
    s = sorted(xs)
    return s[len(s) // 2] if len(s) % 2 else (s[len(s) // 2 - 1] + s[len(s) // 2]) / 2


def default_dir():
    r = subprocess.run(["bash", os.path.join(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__))), "scripts", "fetch-test-models.sh")],
        capture_output=True, text=True)
    if r.returncode != 0 or not r.stdout.strip():
        sys.exit("fetch-test-models.sh failed: %s" % r.stderr.strip()[-300:])
    return r.stdout.strip().splitlines()[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tok-bench", required=True,
                    help="the tok-bench binary (build/tests/tok-bench)")
    ap.add_argument("--tokenizers", help="directory of the tokenizer.json files "
                    "(default: what scripts/fetch-test-models.sh prints)")
    ap.add_argument("--mb", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    tdir = a.tokenizers or default_dir()
    docs = build_corpus(a.mb)
    blob = "\0".join(docs).encode("utf-8")
    nbytes = sum(len(d.encode("utf-8")) for d in docs)
    digest = hashlib.sha256(blob).hexdigest()[:16]
    print("corpus: %d documents, %.2f MB, sha256 %s; %d repeats, one thread each side"
          % (len(docs), nbytes / 1e6, digest, a.repeats), flush=True)
    res, failed = {}, 0
    with tempfile.TemporaryDirectory() as tmp:
        cpath = os.path.join(tmp, "corpus.bin")
        with open(cpath, "wb") as f:
            f.write(blob)
        hfs = {}
        for name in TOKENIZERS:
            tpath = os.path.join(tdir, name)
            hfs[name] = Tokenizer.from_file(tpath)
            ipath = os.path.join(tmp, name + ".ids")
            run_ganglion(a.tok_bench, tpath, cpath, ipath)
            ours = read_ids(ipath, len(docs))
            diff = [i for i, d in enumerate(docs)
                    if hfs[name].encode(d, add_special_tokens=False).ids != ours[i]]
            res[name] = {"ids_identical": not diff, "docs_differing": len(diff),
                         "tokens": sum(len(x) for x in ours), "ganglion_s": [],
                         "tokenizers_s": [], "tokenizers_batch_s": []}
            if diff:
                failed += 1
                print("  %s: ids differ on %d of %d documents, first: %r"
                      % (name, len(diff), len(docs), docs[diff[0]][:80]))
        for rep in range(a.repeats):
            for name in TOKENIZERS:
                g = run_ganglion(a.tok_bench, os.path.join(tdir, name), cpath,
                                 os.path.join(tmp, "ids"))
                sec, toks, bsec = run_tokenizers(hfs[name], docs)
                r = res[name]
                if g["tokens"] != r["tokens"] or toks != r["tokens"] or g["bytes"] != nbytes:
                    raise RuntimeError("%s: token or byte counts disagree" % name)
                r["ganglion_s"].append(g["encode_s"])
                r["tokenizers_s"].append(sec)
                r["tokenizers_batch_s"].append(bsec)
                print("  repeat %d %-16s ganglion %.3f s, tokenizers %.3f s (encode_batch %.3f s)"
                      % (rep + 1, name, g["encode_s"], sec, bsec), flush=True)
    print()
    print("| tokenizer | tokens | ganglion MB/s | tokenizers MB/s | ratio | ganglion Mtok/s "
          "| tokenizers Mtok/s | tokenizers encode_batch MB/s | ids identical |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name in TOKENIZERS:
        r = res[name]
        g, t, b = med(r["ganglion_s"]), med(r["tokenizers_s"]), med(r["tokenizers_batch_s"])
        r.update({"ganglion_MBps": nbytes / g / 1e6, "tokenizers_MBps": nbytes / t / 1e6,
                  "tokenizers_batch_MBps": nbytes / b / 1e6, "ratio": t / g,
                  "ganglion_tokps": r["tokens"] / g, "tokenizers_tokps": r["tokens"] / t})
        print("| %s | %d | %.2f | %.2f | %.2f | %.3f | %.3f | %.2f | %s |"
              % (name, r["tokens"], r["ganglion_MBps"], r["tokenizers_MBps"], r["ratio"],
                 r["ganglion_tokps"] / 1e6, r["tokenizers_tokps"] / 1e6,
                 r["tokenizers_batch_MBps"], "yes" if r["ids_identical"] else
                 "NO (%d docs)" % r["docs_differing"]))
    import tokenizers
    out = {"corpus": {"documents": len(docs), "bytes": nbytes, "sha256_16": digest, "mb": a.mb},
           "repeats": a.repeats, "tokenizers_version": tokenizers.__version__,
           "results": res}
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
