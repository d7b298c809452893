//! No module of the workspace's crates imports a module that imports it back.

use std::path::{Path, PathBuf};
use std::process::Command;

use import_cycles::Graph;
use serde_json::Value;

/// Every crate root (library, binaries, tests, build scripts) of the workspace and of fuzz/, its own
/// workspace, as `cargo metadata` lists them: a new crate or target is checked without being named here.
fn crate_roots(ws: &Path) -> Vec<PathBuf> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut roots = Vec::new();
    for manifest in [ws.join("Cargo.toml"), ws.join("fuzz/Cargo.toml")] {
        let out = Command::new(&cargo)
            .args(["metadata", "--no-deps", "--format-version", "1", "--offline", "--manifest-path"])
            .arg(&manifest)
            .output()
            .unwrap_or_else(|e| panic!("cargo metadata for {}: {e}", manifest.display()));
        assert!(
            out.status.success(),
            "cargo metadata for {}: {}",
            manifest.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
        for package in meta["packages"].as_array().expect("cargo metadata lists packages") {
            for target in package["targets"].as_array().expect("each package lists its targets") {
                roots.push(PathBuf::from(target["src_path"].as_str().expect("each target has a src_path")));
            }
        }
    }
    roots.sort();
    roots.dedup();
    roots
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap();
    let roots = crate_roots(&ws);
    // Every workspace member has a library or a binary, so a listing without these is not cargo's.
    for expected in ["device-model/src/lib.rs", "udriver/src/main.rs", "fuzz/src/lib.rs"] {
        assert!(roots.contains(&ws.join(expected)), "cargo metadata did not list {expected}: {roots:?}");
    }
    let mut problems = Vec::new();
    for root in &roots {
        let name = root.strip_prefix(&ws).unwrap_or(root).display().to_string();
        let g = Graph::read(root).unwrap_or_else(|e| panic!("{name}: {e}"));
        for cycle in g.cycles() {
            problems.push(format!("{name}: {}", cycle.join(" <-> ")));
        }
        problems.extend(g.cycle_edges().into_iter().map(|e| format!("    {e}")));
    }
    assert!(problems.is_empty(), "module import cycles:\n{}", problems.join("\n"));
}

/// The checker itself, on crates written for it: each a set of files and the cycles it must report.
#[test]
fn the_checker_finds_cycles_through_imports_and_through_a_parent_with_code_that_re_exports() {
    // A layer whose children share its code: eng/mod.rs re-exports its children and holds `Err`.
    const LAYER: &str = "mod a;\nmod b;\npub use a::A;\npub use b::B;\npub struct Err;\n";
    // The same parent as an interface only: the shared type lives in a child.
    const INTERFACE: &str = "mod a;\nmod b;\nmod types;\npub use a::A;\npub use b::B;\npub use types::Err;\n";
    // (what the case shows, its files as (path, text), the cycles the checker must report)
    type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a [&'a [&'a str]]);
    let cases: &[Case] = &[
        (
            "two siblings naming each other, one through the parent's re-export",
            &[
                ("eng/mod.rs", INTERFACE),
                ("eng/a.rs", "pub struct A;\nfn f() { let _ = super::B; crate::util::help(); }\n"),
                ("eng/b.rs", "pub struct B;\nfn g() -> super::A { super::A }\n"),
            ],
            &[&["eng::a", "eng::b"]],
        ),
        (
            "a child importing its parent's own type while the parent re-exports the child",
            &[
                ("eng/mod.rs", LAYER),
                ("eng/a.rs", "use super::Err;\npub struct A;\n"),
                ("eng/b.rs", "pub struct B;\n"),
            ],
            &[&["eng", "eng::a"]],
        ),
        (
            "a module reaching a layer's own item while the layer's child imports that module (fault -> hfi1 -> cable -> fault)",
            &[
                ("eng/mod.rs", LAYER),
                ("eng/a.rs", "pub struct A;\nfn f() { crate::util::help(); }\n"),
                ("eng/b.rs", "pub struct B;\n"),
                ("util.rs", "pub fn help() { let _ = crate::eng::Err; }\n"),
            ],
            &[&["eng", "eng::a", "util"]],
        ),
        (
            "the shared type in a child: children import it through an interface-only parent",
            &[
                ("eng/mod.rs", INTERFACE),
                ("eng/a.rs", "use super::Err;\npub struct A;\n"),
                ("eng/b.rs", "pub struct B;\nfn g() -> super::Err { super::Err }\n"),
            ],
            &[],
        ),
    ];
    for (k, (what, files, want)) in cases.iter().enumerate() {
        let dir = std::env::temp_dir().join(format!("import-cycles-test-{}-{k}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("eng")).unwrap();
        std::fs::write(dir.join("lib.rs"), "pub mod eng;\npub mod util;\n").unwrap();
        std::fs::write(dir.join("util.rs"), "pub fn help() {}\n").unwrap();
        std::fs::write(dir.join("eng/types.rs"), "pub struct Err;\n").unwrap();
        for (name, text) in *files {
            std::fs::write(dir.join(name), text).unwrap();
        }
        let g = Graph::read(&dir.join("lib.rs")).unwrap();
        let want: Vec<Vec<String>> = want.iter().map(|c| c.iter().map(|m| m.to_string()).collect()).collect();
        assert_eq!(g.cycles(), want, "{what}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
