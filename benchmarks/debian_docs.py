"""A large real English corpus for benchmarks/sample_study.py: the prose of 63 Debian packages.

    mkdir debs && (cd debs && apt-get download $(python3 ../benchmarks/debian_docs.py --packages))
    nice -n 10 .venv/bin/python benchmarks/debian_docs.py debs --output debian_docs.txt

pdftotext: `apt-get install poppler-utils`, or without root `apt-get download poppler-utils
libpoppler126 libopenjp2-7`, `dpkg-deb -x` each, and pass --pdftotext a script that sets
LD_LIBRARY_PATH to the unpacked usr/lib/x86_64-linux-gnu. Versions: OUTPUT.json names each .deb.

Each .deb is unpacked (dpkg-deb -x, no root needed) into a scratch folder and read there:
HTML pages or PDF manuals, whichever of the two a package ships more of, so that no manual is
read twice; POD, man pages and dictd dictionaries. One document per page, manual or run of
dictionary entries; one paragraph a line, documents separated by blank lines
(preprocess/text/documents.py). Prose only: code listings (<pre>, verbatim POD, .nf/.EX man
blocks) are left out, and so is any paragraph less than 60% of whose tokens look like words;
a paragraph already seen anywhere earlier (packages by name, files by path) is dropped, which
removes navigation, API boilerplate and manuals shipped twice; a document is kept when what is
left has 50 words, 10% of them English function words (this drops translations). The choice
of rules is ours. The packages' versions and the figures per package go to OUTPUT.json.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import gzip
import hashlib
import html
import json
import os
import re
import shutil
import subprocess
import tempfile

# Debian bookworm (the snapshot this VM's apt points at). Mostly technical documentation: the
# distribution has no large general-prose package (bible-kjv-text is in a binary format).
PACKAGES = """
apache2-doc bacula-doc cppreference-doc-en-html csound-doc debian-handbook debian-policy
debian-reference-en developers-reference dict-devil dict-foldoc dict-gcide dict-jargon dict-wn
erlang-doc exim4-doc-html ffmpeg-doc ghc-doc gimp-help-en git-doc gnucash-docs
grass-doc libreoffice-help-en-us lilypond-doc-html linux-doc-6.1 manpages manpages-dev
maxima-doc nodejs-doc ns3-doc octave-doc openjdk-17-doc perl-doc postgresql-doc-15 povray-doc
python-astropy-doc python-biopython-doc python-dask-doc python-django-doc python-pandas-doc
python-scipy-doc python-skimage-doc python-sklearn-doc python-statsmodels-doc python-sympy-doc
python3.11-doc qtbase5-doc-html racket-doc rust-doc sagemath-doc sphinx-doc texlive-bibtex-extra
texlive-fonts-extra-doc texlive-games texlive-humanities-doc texlive-lang-english
texlive-latex-base-doc texlive-latex-extra-doc texlive-latex-recommended-doc texlive-luatex
texlive-metapost-doc texlive-music texlive-pictures-doc texlive-plain-generic
""".split()

_MIN_WORDS = 50
_MIN_WORDLIKE = 0.6
_MIN_FUNCTION_WORDS = 0.1
_FUNCTION_WORDS = frozenset(
    "the of and to a in is that for it as with be on by this are or an not from at which can if "
    "you your we its has have was but all will may their they these there when one more".split())
_WORDLIKE = re.compile(r"^[(\"'\[]*[A-Za-z]+(?:['’-][A-Za-z]+)*[)\"'\],.;:!?]*$")

_SKIPPED_HTML = re.compile(r"<(script|style|pre|head|nav|textarea)\b.*?</\1\s*>|<!--.*?-->", re.S | re.I)
_BLOCK_TAG = re.compile(r"</?(?:p|div|li|ul|ol|dl|dd|dt|td|th|tr|table|h[1-6]|blockquote|section|article|"
                        r"header|footer|aside|main|body|br|hr|figure|figcaption|caption|form|center)\b[^>]*>", re.I)
_TAG = re.compile(r"<[^>]*>")


def html_paragraphs(data: bytes) -> list[str]:
    """Text between block-level tags, with code listings, scripts and the <head> dropped."""
    text = _SKIPPED_HTML.sub(" ", data.decode("utf-8", errors="replace"))
    return [html.unescape(_TAG.sub("", block)) for block in _BLOCK_TAG.split(text)]


def pdf_paragraphs(path: str, pdftotext: str) -> list[str]:
    """pdftotext's blank-line-separated blocks; a word hyphenated at a line end is rejoined."""
    done = subprocess.run([pdftotext, "-q", "-enc", "UTF-8", "-nopgbrk", path, "-"], capture_output=True, timeout=300)
    text = re.sub(r"(?<=[a-z])-\n(?=[a-z])", "", done.stdout.decode("utf-8", errors="replace"))
    return re.split(r"\n\s*\n", text)


_POD_CODE = re.compile(r"[A-Z]<+\s*([^<>]*?)\s*>+")


def pod_paragraphs(data: bytes) -> list[str]:
    """Ordinary POD paragraphs; commands (=head1 ...) and indented verbatim blocks are dropped."""
    paragraphs = []
    for block in re.split(r"\n\s*\n", data.decode("utf-8", errors="replace")):
        if block and not block[0].isspace() and not block.startswith("="):
            for _ in range(3):  # nested codes: B<L<...>>
                block = _POD_CODE.sub(lambda m: m.group(1).split("|")[0], block)
            paragraphs.append(block)
    return paragraphs


_ROFF_ESCAPE = re.compile(r"\\(?:f(?:\[[^\]]*\]|\(..|.)|\(..|\[[^\]]*\]|\*(?:\(..|\[[^\]]*\]|.)|s[-+]?\d+|[&|^%:])")
_ROFF_TEXT_MACROS = {"B", "I", "SM", "SB"}  # arguments joined by spaces
_ROFF_ALTERNATING = {"BR", "IR", "RB", "RI", "BI", "IB"}  # arguments joined without
_ROFF_BREAKS = {"PP", "LP", "P", "TP", "IP", "HP", "SH", "SS", "sp", "br", "RS", "RE"}


def man_paragraphs(data: bytes) -> list[str]:
    """Running text of a man page; .nf/.EX blocks (examples) and headings are dropped."""
    paragraphs, current, verbatim = [], [], False
    for line in data.decode("utf-8", errors="replace").splitlines():
        if line.startswith((".", "'")):
            macro, _, rest = line[1:].strip().partition(" ")
            verbatim = (verbatim or macro in ("nf", "EX")) and macro not in ("fi", "EE")
            if macro in _ROFF_TEXT_MACROS | _ROFF_ALTERNATING and not verbatim:
                args = [quoted or bare for quoted, bare in re.findall(r'"([^"]*)"|(\S+)', rest)]
                current.append((" " if macro in _ROFF_TEXT_MACROS else "").join(args))
            elif macro in _ROFF_BREAKS and current:
                paragraphs.append(" ".join(current))
                current = []
        elif not verbatim:
            current.append(line)
    paragraphs.append(" ".join(current))
    return [_ROFF_ESCAPE.sub("", p).replace("\\-", "-").replace("\\e", "\\") for p in paragraphs]


def dict_documents(data_path: str, index_path: str) -> list[list[str]]:
    """dictd entries in file order, one paragraph each (source tags like [1913 Webster] dropped),
    grouped into documents of at least _MIN_WORDS * 4 words."""
    with gzip.open(data_path, "rb") as f:
        data = f.read()
    spans = set()
    with open(index_path, encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) == 3:
                spans.add((_b64(parts[1]), _b64(parts[2])))
    documents, current, words = [], [], 0
    for start, length in sorted(spans):
        entry = data[start:start + length].decode("utf-8", errors="replace")
        if entry.lstrip().startswith(("00-database", "00database")):  # the dictionary's own metadata
            continue
        entry = re.sub(r"^\s*\[[^\]\n]*\]\s*$", " ", entry, flags=re.M)
        current.append(entry)
        words += len(entry.split())
        if words >= _MIN_WORDS * 4:
            documents.append(current)
            current, words = [], 0
    return documents + [current]


def _b64(digits: str) -> int:
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    value = 0
    for c in digits:
        value = value * 64 + alphabet.index(c)
    return value


def read_file(task: tuple[str, str, str]) -> list[list[str]]:
    """The raw documents (lists of paragraphs) of one file, by its kind."""
    kind, path, pdftotext = task
    try:
        if kind == "pdf":
            return [pdf_paragraphs(path, pdftotext)]
        if kind == "dict":
            return dict_documents(path, path[:-len(".dict.dz")] + ".index")
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, subprocess.TimeoutExpired, EOFError):
        return []
    return [{"html": html_paragraphs, "pod": pod_paragraphs, "man": man_paragraphs}[kind](data)]


def file_kind(path: str, pages: str) -> str | None:
    name = os.path.basename(path)
    if name.endswith((".html", ".htm")):
        return "html" if pages == "html" else None
    if name.endswith(".pdf"):
        return "pdf" if pages == "pdf" else None
    if name.endswith(".pod"):
        return "pod"
    if "/share/man/man" in path and re.search(r"\.\d\w*(\.gz)?$", name):
        return "man"
    if name.endswith(".dict.dz"):
        return "dict"
    return None


class Corpus:
    """Writes kept documents; remembers every paragraph written, so each is written once."""

    def __init__(self, out):
        self.out, self.seen = out, set()

    def add(self, paragraphs: list[str]) -> dict[str, int]:
        kept, duplicates = [], 0
        for p in paragraphs:
            tokens = p.split()
            if not tokens or sum(bool(_WORDLIKE.match(t)) for t in tokens) < _MIN_WORDLIKE * len(tokens):
                continue
            key = hashlib.blake2b(" ".join(tokens).encode(), digest_size=8).digest()
            if key in self.seen:
                duplicates += len(tokens)
                continue
            self.seen.add(key)
            kept.append(tokens)
        words = sum(map(len, kept))
        function_words = sum(t.lower() in _FUNCTION_WORDS for tokens in kept for t in tokens)
        if words < _MIN_WORDS or function_words < _MIN_FUNCTION_WORDS * words:
            return {"documents": 0, "words": 0, "duplicate_words": duplicates}
        self.out.write("\n".join(" ".join(tokens) for tokens in kept) + "\n\n")
        return {"documents": 1, "words": words, "duplicate_words": duplicates}


def read_package(deb: str, corpus: Corpus, pdftotext: str, pool) -> dict:
    with tempfile.TemporaryDirectory(prefix="debian_docs-") as root:
        subprocess.run(["dpkg-deb", "-x", deb, root], check=True)
        paths = sorted(os.path.join(d, n) for d, _, names in os.walk(root) for n in names)
        html_pages = sum(p.endswith((".html", ".htm")) for p in paths)
        pages = "pdf" if sum(p.endswith(".pdf") for p in paths) > html_pages else "html"
        tasks = [(kind, p, pdftotext) for p in paths if (kind := file_kind(p, pages))]
        totals = {"files": len(tasks), "documents": 0, "words": 0, "duplicate_words": 0}
        for documents in pool.map(read_file, tasks, chunksize=8):
            for paragraphs in documents:
                for key, value in corpus.add(paragraphs).items():
                    totals[key] += value
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("debs", nargs="?", help="the folder apt-get download filled")
    parser.add_argument("--output")
    parser.add_argument("--packages", action="store_true", help="print the package names and exit")
    parser.add_argument("--pdftotext", default=shutil.which("pdftotext") or "pdftotext")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    if args.packages:
        print(" ".join(PACKAGES))
        return
    debs = {name.split("_")[0]: name for name in os.listdir(args.debs) if name.endswith(".deb")}
    missing = sorted(set(PACKAGES) - set(debs))
    if missing or not args.output:
        parser.error(f"missing in {args.debs}: {' '.join(missing)}" if missing else "--output is required")
    manifest = {"packages": {}}
    with open(args.output + ".tmp", "w", encoding="utf-8") as out, \
            concurrent.futures.ProcessPoolExecutor(args.workers) as pool:
        corpus = Corpus(out)
        for package in PACKAGES:
            totals = read_package(os.path.join(args.debs, debs[package]), corpus, args.pdftotext, pool)
            manifest["packages"][package] = {"deb": debs[package], **totals}
            print(json.dumps({package: manifest["packages"][package]}), flush=True)
    manifest["documents"] = sum(p["documents"] for p in manifest["packages"].values())
    manifest["words"] = sum(p["words"] for p in manifest["packages"].values())
    with open(args.output + ".json.tmp", "w") as f:
        json.dump(manifest, f, indent=1)
    os.replace(args.output + ".tmp", args.output)
    os.replace(args.output + ".json.tmp", args.output + ".json")
    print(f"{manifest['documents']:,} documents, {manifest['words']:,} whitespace words -> {args.output}")


if __name__ == "__main__":
    main()
