//! Every metric the workspace emits has a description (`# HELP`) in `describe_metrics`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

fn sources(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(std::fs::read_to_string(&path).unwrap());
        }
    }
}

#[test]
fn every_emitted_metric_is_described() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for c in std::fs::read_dir(crates).unwrap() {
        let src = c.unwrap().path().join("src");
        if src.is_dir() {
            sources(&src, &mut files);
        }
    }
    let described =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    let mut missing = Vec::new();
    for text in &files {
        for macro_name in ["counter!(", "gauge!(", "histogram!("] {
            for (i, _) in text.match_indices(macro_name) {
                let rest = text[i + macro_name.len()..].trim_start();
                let Some(name) = rest.strip_prefix('"').and_then(|r| r.split('"').next()) else {
                    continue;
                };
                if !name.starts_with("sundial_") {
                    continue;
                }
                let describe = format!("\"{name}\",");
                let described_here = described
                    .match_indices(&describe)
                    .any(|(j, _)| described[..j].trim_end().ends_with("!("));
                if !described_here && !missing.contains(&name.to_string()) {
                    missing.push(name.to_string());
                }
            }
        }
    }
    assert!(missing.is_empty(), "no HELP for {missing:?}");
}
