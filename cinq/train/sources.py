"""Where the corpus text comes from: Debian packages this machine can install, read into documents.

* fortune files (``fortunes``, ``fortunes-de`` ...): one document per fortune (``%``-separated entries);
* SWORD bibles (``sword-text-*``), exported with ``diatheke``: one document per chapter, markup stripped;
* the Python standard library (Debian's ``libpython3.X-stdlib``): one document per source file.

Each source is described by a ``Source`` (package, language, kind, how much of it the training split keeps);
file lists come from ``dpkg -L`` so only the package's own files are read, in sorted order. Tests pass
explicit ``files`` instead and need no Debian package.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

FORTUNE_DIR = "/usr/share/games/fortunes"
# ASCII-art collections are not language; "off" holds the offensive Spanish set; "-sk" files are Slovak.
_FORTUNE_SKIP = re.compile(r"(^|/)(art|ascii-art|asciiart|banner)(\.u8)?$|/off/|-sk(\.u8)?$")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TAG = re.compile(r"<[^<>]*>")
# A verse line: [heading + two spaces] Book C:V: text (book names have no double space and no colon).
_VERSE = re.compile(r"^(?:.*\s{2})?(?P<book>[^\s:](?:[^:]*?[^\s:])?) (?P<chapter>\d+):(?P<verse>\d+): ?(?P<text>.*)$")
_DROP_ELEMENTS = re.compile(r"<(title|note)\b[^>]*>.*?</\1>")
_WORD_END = re.compile(r"</w>(?=[\w“‘(\[]|<w[\s>])")
_WORD_START = re.compile(r"(?<=[\w,;:.!?”’)\]])<w(?=[\s>])")
_MODULE_LINE = re.compile(r"^\([A-Za-z0-9]+\)$")


@dataclass(frozen=True, slots=True)
class Document:
    """One unit of text: it is deduplicated, split and capped as a whole."""

    text: str
    lang: str  # ISO 639-1 code, or "code" / "math"
    source: str  # the Source name it came from
    ref: str  # where in the source (file#entry, book chapter), for the manifest and debugging


@dataclass(frozen=True, slots=True)
class Source:
    """A corpus source. ``train_cap`` bounds the bytes its training split keeps (None: all of it)."""

    name: str
    lang: str
    kind: str  # "fortune" | "bible" | "code"
    package: str
    train_cap: int | None = None
    module: str | None = None  # SWORD module name, for kind "bible"
    files: tuple[Path, ...] | None = field(default=None)  # explicit files (tests); default: dpkg -L package


def _stdlib_package() -> str:
    # The system Python's standard library, from Debian (not the interpreter running cinq, which may be a venv).
    for minor in range(20, 8, -1):
        if Path(f"/usr/lib/python3.{minor}/os.py").is_file():
            return f"libpython3.{minor}-stdlib"
    return f"libpython3.{sys.version_info.minor}-stdlib"


def debian_sources() -> list[Source]:
    """The corpus the issue asks for. Low-resource languages (pl, cs, zh) keep ~150 KB of training text each,
    so their held-out perplexity shows what little data does."""
    low = 150_000
    return [
        Source("fortunes-en", "en", "fortune", "fortunes"),
        Source("fortunes-min-en", "en", "fortune", "fortunes-min"),
        Source("fortunes-de", "de", "fortune", "fortunes-de"),
        Source("fortunes-es", "es", "fortune", "fortunes-es"),
        Source("fortunes-it", "it", "fortune", "fortunes-it"),
        Source("fortunes-ru", "ru", "fortune", "fortunes-ru"),
        Source("fortunes-pl", "pl", "fortune", "fortunes-pl", train_cap=low),
        Source("fortunes-cs", "cs", "fortune", "fortunes-cs", train_cap=low),
        Source("fortunes-zh", "zh", "fortune", "fortunes-zh", train_cap=low),
        Source("bible-kjv", "en", "bible", "sword-text-kjv", train_cap=2_000_000, module="engKJV2006eb"),
        Source("bible-web", "en", "bible", "sword-text-web", train_cap=2_000_000, module="engWEB2015eb"),
        Source("bible-sparv", "es", "bible", "sword-text-sparv", train_cap=2_500_000, module="spaRV1909eb"),
        Source("python-stdlib", "code", "code", _stdlib_package(), train_cap=3_000_000),
    ]


def required_packages(sources: list[Source]) -> list[str]:
    """Debian packages the sources read from, plus ``diatheke`` when a bible is exported."""
    pkgs = [s.package for s in sources if s.files is None]
    if any(s.kind == "bible" and s.files is None for s in sources):
        pkgs.append("diatheke")
    return list(dict.fromkeys(pkgs))


def package_version(package: str) -> str | None:
    """The installed Debian version of ``package``, or None when it is not installed."""
    if shutil.which("dpkg-query") is None:
        return None
    r = subprocess.run(["dpkg-query", "-W", "-f=${Status}\t${Version}", package], capture_output=True, text=True)
    if r.returncode != 0 or "install ok installed" not in r.stdout:
        return None
    return r.stdout.split("\t", 1)[1].strip()


def missing_packages(sources: list[Source]) -> list[str]:
    return [p for p in required_packages(sources) if package_version(p) is None]


def install_hint(packages: list[str]) -> str:
    return "apt-get install -y --no-install-recommends " + " ".join(packages)


def install_packages(packages: list[str]) -> None:
    """Install Debian packages with apt-get (needs root); raises RuntimeError when apt-get fails."""
    if not packages:
        return
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    r = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", *packages], env=env)
    if r.returncode != 0:
        raise RuntimeError(f"apt-get install failed (exit {r.returncode}); run: {install_hint(packages)}")


def package_files(package: str) -> list[Path]:
    """Regular files installed by ``package`` (symlinks left out: they point at files listed elsewhere)."""
    r = subprocess.run(["dpkg", "-L", package], capture_output=True, text=True, check=True)
    return sorted(p for p in map(Path, r.stdout.split("\n")) if p.is_file() and not p.is_symlink())


def fortune_files(source: Source) -> list[Path]:
    """The fortune text files of a source: no .dat index, no art, UTF-8 (``.u8``) variants preferred."""
    files = list(source.files) if source.files is not None else [
        p for p in package_files(source.package) if str(p).startswith(FORTUNE_DIR)]
    out = []
    for p in sorted(files):
        if p.suffix == ".dat" or _FORTUNE_SKIP.search(str(p)):
            continue
        twin = p.with_name(p.name + ".u8")
        if p.suffix != ".u8" and twin.is_file() and not twin.is_symlink() and twin.stat().st_size > 0:
            continue  # the .u8 twin is the UTF-8 version of a legacy-encoded file (a symlink twin is this file)
        if p.suffix == ".u8" and p.stat().st_size == 0:
            continue  # fortunes-pl ships empty .u8 twins next to UTF-8 originals
        out.append(p)
    return out


def parse_fortunes(raw: str) -> list[str]:
    """Fortune entries of one file (``%`` lines separate them), colour escapes removed, blanks dropped."""
    raw = _ANSI.sub("", raw.replace("\r\n", "\n"))
    entries = re.split(r"^%[ \t]*$", raw, flags=re.M)
    return [e.strip("\n").rstrip() for e in entries if e.strip()]


def parse_diatheke(raw: str) -> list[tuple[str, str]]:
    """(``book chapter``, chapter text) pairs from ``diatheke -f OSIS`` output, one verse per line.

    Cleaning: headings (text before the verse reference on its line; diatheke repeats some before every later
    verse, e.g. WEB's "A praise psalm by David.") and ``<title>``/``<note>`` contents are dropped; word tags get
    the space some modules leave out between adjacent words (``<w>Yahweh</w><w>has</w>``); every other tag and
    Strong's number goes."""
    chapters: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in raw.replace("\r\n", "\n").split("\n"):
        line = line.strip()
        if not line or _MODULE_LINE.match(line):
            continue
        m = _VERSE.match(line)
        if m:
            current = chapters.setdefault(f"{m['book']} {m['chapter']}", [])
            current.append(_clean_osis(m["text"]))
        elif current is not None:
            current[-1] = (current[-1] + " " + _clean_osis(line)).strip()
    return [(ref, "\n".join(v for v in verses if v)) for ref, verses in chapters.items()]


def _clean_osis(text: str) -> str:
    text = _DROP_ELEMENTS.sub(" ", text)
    text = _WORD_END.sub("</w> ", text)
    text = _WORD_START.sub(" <w", text)
    return " ".join(_TAG.sub("", text).split())


def export_bible(module: str) -> str:
    """The whole module as ``diatheke`` OSIS text (Genesis through Revelation), one verse per line."""
    if shutil.which("diatheke") is None:
        raise RuntimeError(f"diatheke not found; run: {install_hint(['diatheke'])}")
    r = subprocess.run(["diatheke", "-b", module, "-f", "OSIS", "-k", "Gen-Rev"], capture_output=True,
                       check=True)
    return r.stdout.decode("utf-8", errors="replace")


def stdlib_files(source: Source) -> list[Path]:
    """The standard library's .py files, without its test suites."""
    files = list(source.files) if source.files is not None else [
        p for p in package_files(source.package) if p.suffix == ".py"]
    skip = re.compile(r"/(test|tests|idle_test|site-packages|dist-packages)/")
    return sorted(p for p in files if not skip.search(str(p)))


def _read_utf8(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None  # a legacy-encoded file with no UTF-8 twin: skipped rather than guessed


def iter_documents(source: Source) -> Iterator[Document]:
    """The documents of a source, in a fixed order."""
    if source.kind == "fortune":
        for path in fortune_files(source):
            text = _read_utf8(path)
            if text is None:
                continue
            for i, entry in enumerate(parse_fortunes(text)):
                yield Document(entry, source.lang, source.name, f"{path.name}#{i}")
    elif source.kind == "bible":
        if source.files is not None:
            raw = "".join(p.read_text(encoding="utf-8") for p in source.files)
        else:
            raw = export_bible(source.module or "")
        for ref, text in parse_diatheke(raw):
            yield Document(text, source.lang, source.name, ref)
    elif source.kind == "code":
        for path in stdlib_files(source):
            text = _read_utf8(path)
            if text and text.strip():
                yield Document(text.rstrip() + "\n", source.lang, source.name, path.name)
    else:
        raise ValueError(f"source {source.name}: kind must be fortune, bible or code, got {source.kind!r}")
