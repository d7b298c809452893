#!/usr/bin/env bash
# Keeps the README and docs/ runnable: every command line they show for one of our programs (device-model,
# udriver, testbed, kernel-irdma, hfi1-user, hfi1-user-host) or scripts (ci/*.sh) uses only flags that the
# program's or script's --help lists (the subcommand's, for a program with subcommands); docs/README.md indexes
# every page of docs/; every relative link, anchors included, leads somewhere; and no tracked file carries git
# conflict markers. ci/test.sh runs it.
#
#   ci/check-docs.sh [--no-build] [FILE.md]...
#
#   --no-build   use the binaries already in target/debug (default: cargo build them first)
#   FILE.md      check these files (default: README.md, docs/*.md and every crate's README.md)
#
# A failure names the file and line, the command, the flag and the --help it is missing from.
source "$(dirname "$0")/lib.sh"
cd "$REPO_ROOT"

usage() { sed -n '2,12s/^# \{0,1\}//p' "$0" >&2; exit "${1:-2}"; }
BUILD=1 FILES=()
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) BUILD=0; shift ;;
        -h|--help) usage 0 ;;
        -*) log "unknown argument: $1"; usage ;;
        *) FILES+=("$1"); shift ;;
    esac
done
if [ ${#FILES[@]} -eq 0 ]; then
    FILES=(README.md docs/*.md)
    for f in */README.md testing/*/README.md; do FILES+=("$f"); done
fi
command -v python3 >/dev/null || apt_install python3

# A merge left half done: git's conflict markers in any tracked file (a line starting with seven of <, = or >
# and, for the outer two, a space).
markers=$(git grep -nE '^(<{7} |={7}$|>{7} )' -- . ':!*.rej' || true)
[ -z "$markers" ] || die "git conflict markers in tracked files:
$markers"

TARGET_DIR=${CARGO_TARGET_DIR:-$REPO_ROOT/target}
if [ "$BUILD" = 1 ]; then
    log "cargo build (the binaries whose --help the docs are checked against)"
    cargo build -q -p device-model -p udriver -p testbed -p hfi1-kernel-check -p kernel-conformance --bins >&2
fi

python3 - "$TARGET_DIR/debug" "${FILES[@]}" <<'EOF'
import os, re, subprocess, sys

bindir, files = sys.argv[1], sys.argv[2:]
PROGRAMS = {"device-model", "udriver", "testbed", "kernel-irdma", "hfi1-user", "hfi1-user-host"}
SCRIPT = re.compile(r"(?:^|/)(ci/[\w.-]+\.sh)$")
FLAG = re.compile(r"^(--?[A-Za-z][\w-]*)(?:=.*)?$")
# Scripts that hand the options they do not know to another: their flags may be either's.
PASSES_TO = {"ci/e2e.sh": "ci/run-qemu.sh"}
problems = []
helps = {}


def run_help(argv):
    """The --help text of a program (argv without --help), or an error string starting with '!'."""
    key = tuple(argv)
    if key in helps:
        return helps[key]
    prog = argv[0]
    if prog.startswith("ci/"):
        text = open(prog).read()
        if not re.search(r"(^|[|\s(])--help\)", text, re.M):
            helps[key] = f"!{prog} has no --help: add one (a `-h|--help) usage 0 ;;` arm)"
            return helps[key]
        cmd = ["bash", prog, "--help"]
    else:
        path = os.path.join(bindir, prog)
        if not os.access(path, os.X_OK):
            helps[key] = f"!no {path}: build it (cargo build --bins) or run without --no-build"
            return helps[key]
        cmd = [path] + argv[1:] + ["--help"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
        out = p.stdout + p.stderr
        if p.returncode != 0 or not out.strip():
            out = f"!`{' '.join(cmd)}` printed no help (exit {p.returncode}): {out.strip()[:200]}"
    except subprocess.TimeoutExpired:
        out = f"!`{' '.join(cmd)}` did not finish in 60 s"
    helps[key] = out
    return out


def subcommands(help_text):
    """The names in a clap help's 'Commands:' list."""
    m = re.search(r"^Commands:\n((?:  \S.*\n)+)", help_text, re.M)
    return {line.split()[0] for line in m.group(1).splitlines()} if m else set()


def tokens(text):
    """Shell-like words: (word, quoted). Separators (a pipe between spaces, ;, &, &&, >, <) become None; a
    comment ends the line. Brackets of usage lines ([--a | --b]) stay, so a bar inside them is no pipe."""
    out, cur, quoted, q, depth, i = [], "", False, None, 0, 0
    def flush():
        nonlocal cur, quoted
        if cur or quoted:
            out.append((cur, quoted))
        cur, quoted = "", False
    while i < len(text):
        c = text[i]
        if q:
            if c == q:
                q = None
            else:
                cur += c
        elif c in "'\"":
            q, quoted = c, True
        elif c.isspace():
            flush()
        elif c == "#" and not cur:
            break
        elif c in ";&<>" or (c == "|" and depth == 0 and not cur and (i + 1 == len(text) or text[i + 1].isspace())):
            flush()
            out.append((None, False))
        else:
            if c == "[":
                depth += 1
            elif c == "]":
                depth = max(0, depth - 1)
            cur += c
        i += 1
    flush()
    return out


def program_of(word):
    base = word.strip("[]()")
    if os.path.basename(base) in PROGRAMS:
        return os.path.basename(base)
    m = SCRIPT.search(base)
    return m.group(1) if m and os.path.exists(m.group(1)) else None


def check_command(where, text):
    toks = tokens(text)
    prog, ctx, top, prev_flag, pending_bin = None, None, None, False, None
    subs = set()
    for word, quoted in toks + [(None, False)]:
        if word is None:
            prog, pending_bin, prev_flag = None, None, False
            continue
        bare = word.strip("[]().,;").rstrip(":")
        if not bare or quoted:
            prev_flag = False
            continue
        if bare == "--":
            if pending_bin:  # cargo run --bin NAME -- ARGS: the rest is NAME's
                prog, ctx, top, subs = pending_bin, [pending_bin], [pending_bin], set()
                pending_bin = None
            else:
                prog = None  # what follows is another program's (QEMU's, libFuzzer's)
            prev_flag = False
            continue
        flag = FLAG.match(bare)
        if flag:
            if prog:
                name = flag.group(1)
                ok = False
                for argv in [ctx] + ([[PASSES_TO[prog]]] if PASSES_TO.get(prog) else []):
                    h = run_help(argv)
                    if h.startswith("!"):
                        problems.append(f"{where}: {h[1:]}")
                        ok = True  # reported once per command
                        break
                    if not argv[0].startswith("ci/"):
                        # A clap help: only its option lines (its examples may show other commands' flags).
                        h = "\n".join(l for l in h.splitlines() if l.lstrip().startswith("-"))
                    if re.search(r"(?<![\w-])" + re.escape(name) + r"(?![\w-])", h):
                        ok = True
                        break
                if not ok:
                    problems.append(f"{where}: `{text.strip()}`: {name} is not in `{' '.join(ctx)} --help`")
            prev_flag = "bin" if bare == "--bin" else True
            continue
        p = program_of(bare)
        if p and prev_flag == "bin":
            pending_bin = p
        elif p and not prev_flag:
            prog, ctx, top = p, [p], [p]
            h = run_help([p])
            subs = set() if h.startswith("!") else subcommands(h)
        elif prog and bare in subs and ctx == top:
            ctx = top + [bare]
        prev_flag = False


def slug(heading):
    s = heading.strip().lower()
    s = re.sub(r"[`*_]", "", s)
    s = re.sub(r"[^\w\- ]", "", s)
    return s.replace(" ", "-")


anchors_cache = {}
def anchors(path):
    if path not in anchors_cache:
        found, seen = set(), {}
        in_code = False
        for line in open(path):
            if line.startswith("```"):
                in_code = not in_code
            elif not in_code and line.startswith("#"):
                s = slug(line.lstrip("#"))
                n = seen.get(s, 0)
                seen[s] = n + 1
                found.add(s if n == 0 else f"{s}-{n}")
        anchors_cache[path] = found
    return anchors_cache[path]


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
for f in files:
    in_code, pending, start = False, "", 0
    for n, line in enumerate(open(f), 1):
        if line.startswith("```"):
            in_code = not in_code
            continue
        if in_code:
            text = line.rstrip("\n")
            if not pending:
                start = n
            if text.endswith("\\"):
                pending += text[:-1] + " "
                continue
            text, pending = pending + text, ""
            check_command(f"{f}:{start}", re.sub(r"^\s*\$ ", "", text))
            continue
        for span in re.findall(r"`([^`]+)`", line):
            check_command(f"{f}:{n}", span.replace("\\|", "|"))
        for target in LINK.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(f), path)) if path else f
            if not os.path.exists(dest):
                problems.append(f"{f}:{n}: the link {target} leads nowhere ({dest} does not exist)")
            elif anchor and dest.endswith(".md") and anchor not in anchors(dest):
                problems.append(f"{f}:{n}: the link {target}: {dest} has no heading #{anchor}")

# docs/README.md indexes every page.
index = open("docs/README.md").read()
for page in sorted(os.listdir("docs")):
    if page.endswith(".md") and page != "README.md" and f"]({page}" not in index:
        problems.append(f"docs/README.md: docs/{page} is not in the index")

problems = list(dict.fromkeys(problems))
if problems:
    print("\n".join(problems), file=sys.stderr)
    sys.exit(f"{len(problems)} problem(s) in the docs' command lines and links")
print(f"docs: every command line's flags are in its --help, every link leads somewhere ({len(files)} files, "
      f"{len(helps)} --help texts)", file=sys.stderr)
EOF
