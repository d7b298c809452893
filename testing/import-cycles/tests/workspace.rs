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

/// The checker itself, on a crate written for it: a cycle through a re-export is found, a parent that only
/// re-exports its children is not one.
#[test]
fn the_checker_finds_a_cycle_and_ignores_re_exports() {
    let dir = std::env::temp_dir().join(format!("import-cycles-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("eng")).unwrap();
    let files = [
        ("lib.rs", "pub mod eng;\npub mod util;\n"),
        ("util.rs", "pub fn help() {}\n"),
        ("eng/mod.rs", "mod a;\nmod b;\npub use a::A;\npub use b::B;\npub struct Err;\n"),
        ("eng/a.rs", "use super::Err;\npub struct A;\nfn f() { let _ = super::B; crate::util::help(); }\n"),
        ("eng/b.rs", "pub struct B;\nfn g() -> super::A { super::A }\n"),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let g = Graph::read(&dir.join("lib.rs")).unwrap();
    assert_eq!(g.cycles(), vec![vec!["eng::a".to_string(), "eng::b".to_string()]]);
    std::fs::write(dir.join("eng/b.rs"), "pub struct B;\nfn g() -> super::Err { super::Err }\n").unwrap();
    let g = Graph::read(&dir.join("lib.rs")).unwrap();
    assert!(g.cycles().is_empty(), "{:?}", g.cycles());
    let _ = std::fs::remove_dir_all(&dir);
}
