//! No module of the workspace's crates imports a module that imports it back (issue 14).

use std::path::Path;

use import_cycles::Graph;

/// Every crate root of the workspace (and of fuzz/, its own workspace).
const ROOTS: [&str; 12] = [
    "vfio-user-proto/src/lib.rs",
    "emu-abi/src/lib.rs",
    "device-model/src/lib.rs",
    "device-model/src/main.rs",
    "udriver/src/lib.rs",
    "udriver/src/main.rs",
    "testing/testbed/src/lib.rs",
    "testing/testbed/src/main.rs",
    "testing/kernel-conformance/src/lib.rs",
    "testing/hfi1-kernel-check/src/lib.rs",
    "testing/import-cycles/src/lib.rs",
    "fuzz/src/lib.rs",
];

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut problems = Vec::new();
    for root in ROOTS {
        let g = Graph::read(&ws.join(root)).unwrap_or_else(|e| panic!("{root}: {e}"));
        for cycle in g.cycles() {
            problems.push(format!("{root}: {}", cycle.join(" <-> ")));
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
