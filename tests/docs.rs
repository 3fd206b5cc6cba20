//! The documentation keeps up with the code: every setting in
//! `config/default.toml` is documented in `docs/settings.md`, and README.md
//! stays a front page (the reference lives in `docs/`).
//!
//! `cargo test --test docs`. Reads files only; starts no server.

use std::path::{Path, PathBuf};

/// README.md is the front door: what switchboard is, the quick start, the
/// headline figures and links. Past this it is turning into the reference
/// again, which belongs in `docs/`.
const README_MAX_LINES: usize = 300;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Every `section.key` of a TOML file of `[section]` headers and
/// `key = value` lines, in file order. Comments, blank lines and anything
/// else are skipped: `config/default.toml` has no arrays of tables, inline
/// tables or multi-line values, and a key given only as a commented example
/// is not a setting of the default layer.
fn settings(toml: &str) -> Vec<String> {
    let mut section: Option<String> = None;
    let mut keys = Vec::new();
    for line in toml.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = Some(name.trim().to_owned());
            continue;
        }
        let Some((key, _value)) = line.split_once('=') else {
            continue;
        };
        let key = key.trim();
        let bare = !key.is_empty()
            && key
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !bare {
            continue;
        }
        match &section {
            Some(section) => keys.push(format!("{section}.{key}")),
            None => keys.push(key.to_owned()),
        }
    }
    keys
}

#[test]
fn the_line_rules_read_sections_and_keys() {
    let toml = "# top comment\n\
                [server]\n\
                host = \"127.0.0.1\" # trailing comment\n\
                # port = 1 (an example, not a key)\n\
                \n\
                [log]\n\
                level=\"info\"\n";
    assert_eq!(settings(toml), ["server.host", "log.level"]);
}

#[test]
fn every_setting_is_documented() {
    let toml = read(&root().join("config/default.toml"));
    let keys = settings(&toml);
    // A parser that silently found nothing would pass everything.
    assert!(
        keys.len() >= 20,
        "only {} keys found in config/default.toml: {keys:?}",
        keys.len()
    );
    let doc = read(&root().join("docs/settings.md"));
    let missing: Vec<&String> = keys
        .iter()
        .filter(|key| !doc.contains(&format!("`{key}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "{} of the {} keys in config/default.toml are not named (as `section.key`) \
         in docs/settings.md; document them there (their meaning is in \
         config/default.toml's comments): {missing:?}",
        missing.len(),
        keys.len()
    );
}

#[test]
fn readme_stays_a_front_page() {
    let readme = read(&root().join("README.md"));
    let lines = readme.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md is {lines} lines (the limit is under {README_MAX_LINES}): keep it to what \
         switchboard is, the quick start, the headline figures and links; the reference \
         goes in docs/"
    );
}
