//! Compiles the kernel's irdma control path, unmodified, against the shim headers in `shim/include`.
//!
//! The kernel source is never in the repository: `ci/kernel-source.sh` fetches Debian's linux-source
//! package at the guest kernel's version, extracts what is needed under the cache directory, and prints
//! the tree's path. This script finds it through `RDMA_EMU_KERNEL_SRC`, else at the script's default
//! cache path. Set explicitly, `RDMA_EMU_KERNEL_SRC` must hold the files (ci/test.sh relies on that). Found
//! at neither, the crate builds without the kernel (no `kernel_source` cfg: an empty library, tests that
//! compile to nothing, a binary that says why) and a one-line warning says how to get the source, so a fresh
//! clone's `cargo build` and `cargo test` work.

use std::path::{Path, PathBuf};

/// The kernel files compiled: ctrl.c (through shim/src/kc_irdma.c, which includes it whole), and what
/// it cannot link without: the GEN2/GEN1 register tables its dev init selects (icrdma_hw.c, i40iw_hw.c),
/// and the user-kernel queue and UDA helpers its QP/CQ/AH paths call (uk.c, uda.c).
const KERNEL_FILES: &[&str] = &["icrdma_hw.c", "i40iw_hw.c", "uk.c", "uda.c"];
/// Files `#include`d by the above; listed so a change to the tree rebuilds.
const KERNEL_HEADERS: &[&str] = &[
    "ctrl.c",
    "osdep.h",
    "type.h",
    "defs.h",
    "hmc.h",
    "user.h",
    "irdma.h",
    "uda.h",
    "uda_d.h",
    "ws.h",
    "protos.h",
    "puda.h",
    "icrdma_hw.h",
    "i40iw_hw.h",
];
const SHIM_FILES: &[&str] = &["shim/src/kc_irdma.c", "shim/src/osdep.c", "shim/src/print.c"];

fn default_cache() -> Option<PathBuf> {
    if let Some(c) = std::env::var_os("RDMA_EMU_CACHE") {
        return Some(PathBuf::from(c));
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME") {
        return Some(PathBuf::from(x).join("rdma-emu"));
    }
    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/rdma-emu"))
}

/// The kernel tree, or `None` (after the warning) when none was asked for and the default path has none.
fn kernel_tree() -> Option<PathBuf> {
    println!("cargo:rerun-if-env-changed=RDMA_EMU_KERNEL_SRC");
    println!("cargo:rerun-if-env-changed=RDMA_EMU_CACHE");
    println!("cargo:rerun-if-env-changed=XDG_CACHE_HOME");
    let has_ctrl = |t: &Path| t.join("drivers/infiniband/hw/irdma/ctrl.c").is_file();
    if let Some(p) = std::env::var_os("RDMA_EMU_KERNEL_SRC") {
        let tree = PathBuf::from(p);
        if has_ctrl(&tree) {
            return Some(tree);
        }
        // Asked for explicitly (ci/test.sh does): its absence is an error, not a skip.
        eprintln!(
            "RDMA_EMU_KERNEL_SRC={} holds no drivers/infiniband/hw/irdma/ctrl.c. Run ci/kernel-source.sh (it \
             fetches and caches Debian's linux-source-6.12 at the guest kernel's version and prints the path), or \
             point RDMA_EMU_KERNEL_SRC at an extracted kernel tree.",
            tree.display()
        );
        std::process::exit(1);
    }
    let Some(tree) = default_cache().map(|c| c.join("kernel-source/current")) else {
        println!(
            "cargo:warning=skipped the kernel's irdma ctrl.c and its tests (no HOME, no \
             RDMA_EMU_KERNEL_SRC); run ci/kernel-source.sh and set RDMA_EMU_KERNEL_SRC to the path it prints"
        );
        return None;
    };
    if has_ctrl(&tree) {
        return Some(tree);
    }
    // Rebuilds once ci/kernel-source.sh has created the tree (the link is what it replaces last).
    println!("cargo:rerun-if-changed={}", tree.display());
    println!(
        "cargo:warning=skipped the kernel's irdma ctrl.c and its tests (no source at {}); \
         run ci/kernel-source.sh to get it",
        tree.display()
    );
    None
}

fn main() {
    println!("cargo:rustc-check-cfg=cfg(kernel_source)");
    let Some(tree) = kernel_tree() else { return };
    println!("cargo:rustc-cfg=kernel_source");
    let irdma = tree.join("drivers/infiniband/hw/irdma");
    let version = std::fs::read_to_string(tree.join("../version"))
        .or_else(|_| std::fs::read_to_string(tree.join("version")))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|_| "unknown (no version file next to the tree)".into());
    println!("cargo:rustc-env=KERNEL_SOURCE_VERSION={version}");
    println!("cargo:rustc-env=KERNEL_SOURCE_TREE={}", tree.display());
    println!("cargo:rerun-if-changed={}", tree.join("../version").display());

    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let shim_inc = manifest.join("shim/include");
    println!("cargo:rerun-if-changed={}", shim_inc.display());
    rerun_dir(&shim_inc);

    let mut build = cc::Build::new();
    build
        .warnings(false)
        .include(&shim_inc)
        .include(&irdma)
        // Self-contained: no libc or host kernel header may change a layout.
        .flag("-nostdinc")
        .flag("-std=gnu11")
        // The kernel's own code-generation assumptions (Makefile: KBUILD_CFLAGS).
        .flag("-fno-strict-aliasing")
        .flag("-fno-strict-overflow")
        .flag("-fno-delete-null-pointer-checks")
        .flag("-fno-common")
        .flag("-Wall")
        // Kernel code takes addresses of __packed struct irdma_dma_mem members; the kernel builds with
        // this warning off too.
        .flag("-Wno-address-of-packed-member")
        // ctrl.c is included whole; its static helpers for QPs, HMC and stats are unused here.
        .flag("-Wno-unused-function")
        .flag("-Werror");
    for f in KERNEL_FILES {
        let p = irdma.join(f);
        println!("cargo:rerun-if-changed={}", p.display());
        build.file(p);
    }
    for f in KERNEL_HEADERS {
        println!("cargo:rerun-if-changed={}", irdma.join(f).display());
    }
    for f in SHIM_FILES {
        let p = manifest.join(f);
        println!("cargo:rerun-if-changed={}", p.display());
        build.file(p);
    }
    build.compile("kernel_irdma");
}

fn rerun_dir(dir: &Path) {
    let Ok(rd) = std::fs::read_dir(dir) else { return };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rerun_dir(&p);
        } else {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
}
