//! Each check with a doc snippet that must pass and one that must fail. The --help texts and the files are a
//! fake: what a program's help lists is the test's premise.

use super::*;

/// `udriver`'s help lists --json and has a subcommand `stress` with --seconds; `ci/run-qemu.sh` lists
/// --accel; `ci/e2e.sh` lists --mode and passes the rest to run-qemu.sh; `ci/nohelp.sh` has no --help arm.
struct Fake;

impl Helps for Fake {
    fn help(&mut self, argv: &[String]) -> Result<String, String> {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        match argv.as_slice() {
            ["udriver"] => {
                Ok("Usage: udriver [OPTIONS] <COMMAND>\n\nCommands:\n  stress  Stress\n  hfi1-demo  Demo\n\n\
                               Options:\n      --json  JSON\n  -h, --help  Help\n\nExample: udriver --not-an-option\n"
                    .into())
            }
            ["udriver", "stress"] => {
                Ok("Usage: udriver stress\n\nOptions:\n      --seconds <S>\n  -h, --help\n".into())
            }
            ["ci/run-qemu.sh"] => Ok("ci/run-qemu.sh [--accel tcg|kvm]\n".into()),
            ["ci/e2e.sh"] => Ok("ci/e2e.sh [--mode MODE]\n".into()),
            ["ci/nohelp.sh"] => Err("ci/nohelp.sh has no --help: add one (a `-h|--help) usage 0 ;;` arm)".into()),
            _ => Err(format!("no help for {argv:?}")),
        }
    }

    fn script_exists(&self, path: &str) -> bool {
        ["ci/run-qemu.sh", "ci/e2e.sh", "ci/nohelp.sh"].contains(&path)
    }

    fn exists(&self, path: &str) -> bool {
        ["docs/a.md", "docs/b.md", "README.md", "ci"].contains(&path)
    }

    fn read(&self, path: &str) -> Option<String> {
        (path == "docs/b.md").then(|| "# B page\n## Run it\n```\n# not a heading\n```\n## Run it\n".to_string())
    }
}

fn problems_of(name: &str, doc: &str) -> Vec<String> {
    let mut c = Checker::new(Fake);
    c.check_file(name, doc);
    c.problems()
}

#[test]
fn each_check_passes_a_good_snippet_and_fails_a_bad_one() {
    // (what, file, doc, the problem it must give or None)
    let cases: &[(&str, &str, &str, Option<&str>)] = &[
        ("a flag in the program's help", "docs/a.md", "`udriver --json hfi1-demo`\n", None),
        (
            "a flag not in the program's help",
            "docs/a.md",
            "`udriver --jsn`\n",
            Some("docs/a.md:1: `udriver --jsn`: --jsn is not in `udriver --help`"),
        ),
        (
            "a flag of an example line is not an option line",
            "docs/a.md",
            "`udriver --not-an-option`\n",
            Some("--not-an-option is not in"),
        ),
        ("a subcommand's flag in its help", "docs/a.md", "`udriver stress --seconds 5`\n", None),
        (
            "a subcommand's flag against the subcommand's help",
            "docs/a.md",
            "`udriver stress --json`\n",
            Some("--json is not in `udriver stress --help`"),
        ),
        ("a code block's continued line", "docs/a.md", "```\n$ udriver \\\n  --json\n```\n", None),
        (
            "a code block's continued line, a bad flag",
            "docs/a.md",
            "text\n```\n$ udriver \\\n  --bad\n```\n",
            Some("docs/a.md:3: `udriver    --bad`: --bad is not in `udriver --help`"),
        ),
        ("a script's flag", "docs/a.md", "`ci/run-qemu.sh --accel kvm`\n", None),
        ("a script passing flags on", "docs/a.md", "`ci/e2e.sh --mode all --accel tcg`\n", None),
        ("a flag neither script has", "docs/a.md", "`ci/e2e.sh --nope`\n", Some("--nope is not in `ci/e2e.sh --help`")),
        (
            "a script without --help",
            "docs/a.md",
            "`ci/nohelp.sh --x`\n",
            Some("docs/a.md:1: ci/nohelp.sh has no --help"),
        ),
        ("after --, another program's flags", "docs/a.md", "`ci/run-qemu.sh -- -qmp unix:x`\n", None),
        (
            "cargo run --bin: the flags after -- are the binary's",
            "docs/a.md",
            "`cargo run --bin udriver -- --json`\n",
            None,
        ),
        (
            "cargo run --bin: a bad flag after --",
            "docs/a.md",
            "`cargo run --bin udriver -- --bad`\n",
            Some("--bad is not in `udriver --help`"),
        ),
        ("a pipe ends the command", "docs/a.md", "`udriver --json | jq --raw`\n", None),
        (
            "a bar inside a usage bracket is no pipe",
            "docs/a.md",
            "`udriver [--json | --jsn]`\n",
            Some("--jsn is not in"),
        ),
        ("a quoted word is not a flag", "docs/a.md", "`udriver '--quoted'`\n", None),
        ("a comment ends the line", "docs/a.md", "```\nudriver --json # --bad\n```\n", None),
        ("a link to a file", "docs/a.md", "[b](b.md)\n", None),
        (
            "a link to no file",
            "docs/a.md",
            "see [c](c.md)\n",
            Some("docs/a.md:1: the link c.md leads nowhere (docs/c.md does not exist)"),
        ),
        ("a link up and back down", "docs/a.md", "[r](../README.md)\n", None),
        ("a link to a heading", "docs/a.md", "[b](b.md#run-it) and [again](b.md#run-it-1)\n", None),
        (
            "a link to a missing heading (a code block's # is none)",
            "docs/a.md",
            "[b](b.md#not-a-heading)\n",
            Some("docs/a.md:1: the link b.md#not-a-heading: docs/b.md has no heading #not-a-heading"),
        ),
        ("a web link is not checked", "docs/a.md", "[w](https://example.org/x.md)\n", None),
    ];
    for (what, file, doc, want) in cases {
        let got = problems_of(file, doc);
        match want {
            None => assert!(got.is_empty(), "{what}: expected no problem, got {got:?}"),
            Some(w) => assert!(
                got.len() == 1 && got[0].contains(w),
                "{what}: expected one problem containing {w:?}, got {got:?}"
            ),
        }
    }
}

#[test]
fn the_index_must_link_every_page_of_docs() {
    let pages = ["README.md".to_string(), "a.md".into(), "b.md".into(), "b.svg".into()];
    let cases: &[(&str, &[&str])] = &[
        ("- [A](a.md)\n- [B](b.md#top)\n", &[]),
        ("- [A](a.md)\n", &["docs/README.md: docs/b.md is not in the index"]),
    ];
    for (index, want) in cases {
        let mut c = Checker::new(Fake);
        c.check_index(index, &pages);
        assert_eq!(c.problems(), *want, "{index}");
    }
}

#[test]
fn a_problem_found_twice_is_reported_once() {
    assert_eq!(problems_of("docs/a.md", "`udriver --bad`\n`udriver --bad`\n").len(), 2, "two lines, two places");
    assert_eq!(problems_of("docs/a.md", "`udriver --bad` `udriver --bad`\n").len(), 1);
}

#[test]
fn words_split_as_the_shell_would_with_usage_brackets_kept() {
    let w = |s: &str, quoted| Token::Word { text: s.into(), quoted };
    let cases: Vec<(&str, Vec<Token>)> = vec![
        ("a 'b c' \"d\"", vec![w("a", false), w("b c", true), w("d", true)]),
        ("a|b | c", vec![w("a|b", false), Token::Separator, w("c", false)]),
        ("a [--x | --y]", vec![w("a", false), w("[--x", false), w("|", false), w("--y]", false)]),
        ("a;b>c", vec![w("a", false), Token::Separator, w("b", false), Token::Separator, w("c", false)]),
        ("a #b", vec![w("a", false)]),
        ("a#b", vec![w("a#b", false)]),
        ("''", vec![w("", true)]),
    ];
    for (text, want) in cases {
        assert_eq!(tokens(text), want, "{text}");
    }
}

#[test]
fn flags_are_dashes_a_letter_and_word_characters_with_an_optional_value() {
    let cases: &[(&str, Option<&str>)] = &[
        ("--json", Some("--json")),
        ("-h", Some("-h")),
        ("--out=DIR", Some("--out")),
        ("--hfi1-id", Some("--hfi1-id")),
        ("--", None),
        ("-1", None),
        ("---x", None),
        ("--a.b", None),
        ("x--y", None),
    ];
    for (word, want) in cases {
        assert_eq!(flag_name(word), *want, "{word}");
    }
}

#[test]
fn a_flag_is_found_in_a_help_only_as_a_whole_word() {
    let cases: &[(&str, &str, bool)] = &[
        ("  --json  JSON", "--json", true),
        ("  --json-lines", "--json", false),
        ("  --x-json", "-json", false),
        ("[--accel tcg|kvm]", "--accel", true),
        ("  -h, --help", "-h", true),
    ];
    for (help, name, want) in cases {
        assert_eq!(mentions(help, name), *want, "{name} in {help:?}");
    }
}

#[test]
fn headings_become_anchors_as_github_makes_them() {
    let cases: &[(&str, &str)] = &[
        (" Run `ci/demo.sh` (TCG) ", "run-cidemosh-tcg"),
        ("What **is** not_there", "what-is-notthere"),
        ("A -- B", "a----b"),
    ];
    for (heading, want) in cases {
        assert_eq!(slug(heading), *want, "{heading}");
    }
}

#[test]
fn a_help_lists_its_subcommands_under_commands() {
    let help = "Usage: x\n\nCommands:\n  bench  B\n  serve-peers  S\n  help  H\n\nOptions:\n  -h\n";
    assert_eq!(subcommands(help), ["bench", "help", "serve-peers"].map(String::from).into());
    assert!(subcommands("Usage: x\n\nOptions:\n  -h\n").is_empty());
}

#[test]
fn a_script_has_a_help_arm_only_as_a_case_pattern() {
    let cases: &[(&str, bool)] = &[
        ("        -h|--help) usage 0 ;;", true),
        ("    --help) usage ;;", true),
        ("echo x--help)", false),
        ("# no arm", false),
    ];
    for (text, want) in cases {
        assert_eq!(script_has_help(text), *want, "{text}");
    }
}

#[test]
fn link_paths_fold_dot_and_dot_dot() {
    let cases: &[(&str, &str)] =
        &[("docs/../README.md", "README.md"), ("docs/./a.md", "docs/a.md"), ("", "."), ("../x", "../x")];
    for (p, want) in cases {
        assert_eq!(normpath(Path::new(p)), *want, "{p}");
    }
}
