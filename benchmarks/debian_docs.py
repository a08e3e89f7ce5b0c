"""A larger real English corpus for benchmarks/sample_study.py: the prose of Debian's documentation
packages, one document per HTML page, as blank-line-separated text (preprocess/text/documents.py).

    mkdir debs && cd debs && apt-get download linux-doc-6.1 python3.11-doc postgresql-doc-15
    for f in *.deb; do dpkg-deb -x $f root; done          # no root needed
    .venv/bin/python benchmarks/debian_docs.py debs/root --output debian_docs.txt

Text inside <script>, <style> and <pre> (code listings) is left out, as are pages of under 50
words (indexes, redirects). Technical English, as the demo corpus is; python3.11-doc overlaps the
demo corpus's stdlib part, so a study of either alone keeps them independent.
"""
from __future__ import annotations

import argparse
import html.parser
import os

_SKIP = {"script", "style", "pre"}
_MIN_WORDS = 50


class _Prose(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.words: list[str] = []
        self._skipping = 0

    def handle_starttag(self, tag, attrs):
        self._skipping += tag in _SKIP

    def handle_endtag(self, tag):
        self._skipping -= tag in _SKIP and self._skipping > 0

    def handle_data(self, data):
        if not self._skipping:
            self.words += data.split()


def page_text(path: str) -> str:
    parser = _Prose()
    with open(path, encoding="utf-8", errors="replace") as f:
        parser.feed(f.read())
    return " ".join(parser.words)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="where the packages were extracted (dpkg-deb -x)")
    parser.add_argument("--output", required=True)
    args = parser.parse_args()
    pages = sorted(os.path.join(d, n) for d, _, names in os.walk(args.root) for n in names if n.endswith(".html"))
    documents = words = 0
    with open(args.output + ".tmp", "w", encoding="utf-8") as out:
        for path in pages:
            text = page_text(path)
            if len(text.split()) >= _MIN_WORDS:
                out.write(text + "\n\n")
                documents, words = documents + 1, words + len(text.split())
    os.replace(args.output + ".tmp", args.output)
    print(f"{len(pages)} pages, {documents} documents, {words:,} whitespace words -> {args.output}")


if __name__ == "__main__":
    main()
