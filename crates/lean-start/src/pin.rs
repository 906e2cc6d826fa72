//! The guard of the lean start-up: it mirrors glibc's own start-up objects line by line,
//! so it is built only against the exact objects it was written from. Used by the build
//! script (and unit-tested here): read the members of `libc.a` the start-up replaces or
//! mirrors, hash them, and look for a pinned glibc build whose hashes all match.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

/// The `libc.a` members the start-up replaces (`libc-start.o`: `__libc_start_main` and the
/// string functions' tuning variables; `dl-origin.o`: `_dl_get_origin`) or mirrors
/// (`init-first.o`: `__libc_init_first`; `dl-support.o`: `_dl_non_dynamic_init`).
pub const MEMBERS: [&str; 4] = [
    "libc-start.o",
    "dl-origin.o",
    "init-first.o",
    "dl-support.o",
];

/// A glibc build the start-up was checked against: a label and the SHA-256 of each member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pin {
    /// What it is, e.g. `glibc 2.36-9+deb12u14 amd64 (Debian 12)`.
    pub label: String,
    /// Member name → lower-case hex SHA-256.
    pub members: BTreeMap<String, String>,
}

/// Parses a pin file: `[label]` starts a glibc build, then one `member sha256` per line;
/// `#` starts a comment.
pub fn parse_pins(text: &str) -> Result<Vec<Pin>, String> {
    let mut pins: Vec<Pin> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        if let Some(label) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            pins.push(Pin {
                label: label.trim().to_string(),
                members: BTreeMap::new(),
            });
            continue;
        }
        let mut words = line.split_whitespace();
        let (Some(member), Some(hash), None) = (words.next(), words.next(), words.next()) else {
            return Err(format!("line {}: expected `member sha256`: {raw:?}", i + 1));
        };
        if hash.len() != 64 || !hash.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!("line {}: {hash:?} is not a SHA-256", i + 1));
        }
        let Some(pin) = pins.last_mut() else {
            return Err(format!("line {}: a hash before any [glibc build]", i + 1));
        };
        pin.members
            .insert(member.to_string(), hash.to_ascii_lowercase());
    }
    Ok(pins)
}

/// The SHA-256 of each of `wanted` in the `ar` archive `archive` (System V / GNU format,
/// long names included). A member that is not there is left out.
pub fn member_hashes(archive: &[u8], wanted: &[&str]) -> Result<BTreeMap<String, String>, String> {
    let body = archive
        .strip_prefix(b"!<arch>\n")
        .ok_or("not an ar archive (no !<arch> magic)")?;
    let mut out = BTreeMap::new();
    let mut long_names: &[u8] = &[];
    let mut at = 0;
    while at + 60 <= body.len() {
        let header = &body[at..at + 60];
        let size: usize = std::str::from_utf8(&header[48..58])
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| format!("a member header at byte {} has no size", at + 8))?;
        let data = body
            .get(at + 60..at + 60 + size)
            .ok_or("a member runs past the end of the archive")?;
        let raw_name = std::str::from_utf8(&header[..16])
            .unwrap_or_default()
            .trim_end();
        let name = if raw_name == "//" {
            long_names = data;
            None
        } else if let Some(offset) = raw_name
            .strip_prefix('/')
            .and_then(|o| o.parse::<usize>().ok())
        {
            let rest = long_names.get(offset..).unwrap_or_default();
            let end = rest.iter().position(|&b| b == b'\n').unwrap_or(rest.len());
            Some(
                String::from_utf8_lossy(&rest[..end])
                    .trim_end_matches('/')
                    .to_string(),
            )
        } else if raw_name == "/" || raw_name.starts_with("/SYM64/") {
            None // the symbol table
        } else {
            Some(raw_name.trim_end_matches('/').to_string())
        };
        if let Some(name) = name.filter(|n| wanted.contains(&n.as_str())) {
            out.entry(name)
                .or_insert_with(|| hex(&Sha256::digest(data)));
        }
        at += 60 + size + (size % 2);
    }
    Ok(out)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The label of the pinned glibc build whose every member hash is `found`, or why none is:
/// which member differs from the closest pin, with the hashes found, and what to do.
pub fn matching(pins: &[Pin], found: &BTreeMap<String, String>) -> Result<String, String> {
    for pin in pins {
        if MEMBERS.iter().all(|m| {
            pin.members
                .get(*m)
                .is_some_and(|h| found.get(*m) == Some(h))
        }) {
            return Ok(pin.label.clone());
        }
    }
    let mut why = Vec::new();
    for m in MEMBERS {
        match found.get(m) {
            None => why.push(format!("{m} is not in libc.a")),
            Some(h) if pins.iter().any(|p| p.members.get(m) == Some(h)) => {}
            Some(h) => why.push(format!("{m} has sha256 {h}, which no pin lists")),
        }
    }
    if why.is_empty() {
        why.push("the members match different pinned builds, none all of them".into());
    }
    Err(format!(
        "this glibc is not one the lean start-up was checked against ({}; pinned: {}). \
         To use it, check crates/lean-start/c/lean_start.c against that glibc's \
         csu/libc-start.c, csu/init-first.c and elf/dl-support.c, then add its hashes to \
         crates/lean-start/glibc.pin",
        why.join("; "),
        pins.iter()
            .map(|p| p.label.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An `ar` archive of `members`, with a GNU long-name table for names over 15 bytes.
    fn archive(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut table = Vec::new();
        let mut entries = Vec::new();
        for (name, data) in members {
            let field = if name.len() > 15 {
                let f = format!("/{}", table.len());
                table.extend_from_slice(format!("{name}/\n").as_bytes());
                f
            } else {
                format!("{name}/")
            };
            entries.push((field, data.to_vec()));
        }
        let mut out = b"!<arch>\n".to_vec();
        let mut push = |name: &str, data: &[u8]| {
            out.extend_from_slice(
                format!(
                    "{name:<16}{:<12}{:<6}{:<6}{:<8}{:<10}`\n",
                    0,
                    0,
                    0,
                    644,
                    data.len()
                )
                .as_bytes(),
            );
            out.extend_from_slice(data);
            if data.len() % 2 == 1 {
                out.push(b'\n');
            }
        };
        push("/", b"\0\0\0\0");
        if !table.is_empty() {
            push("//", &table);
        }
        for (name, data) in &entries {
            push(name, data);
        }
        out
    }

    fn sha(data: &[u8]) -> String {
        hex(&Sha256::digest(data))
    }

    #[test]
    fn members_are_found_by_short_and_long_names() {
        let a = archive(&[
            ("libc-start.o", b"start"),
            ("a-very-long-member-name.o", b"long"),
            ("dl-origin.o", b"origin!"),
        ]);
        let got = member_hashes(
            &a,
            &["libc-start.o", "dl-origin.o", "a-very-long-member-name.o"],
        )
        .unwrap();
        assert_eq!(got["libc-start.o"], sha(b"start"));
        assert_eq!(got["dl-origin.o"], sha(b"origin!"));
        assert_eq!(got["a-very-long-member-name.o"], sha(b"long"));
        assert!(member_hashes(b"not an archive", &MEMBERS).is_err());
    }

    #[test]
    fn only_a_build_whose_every_member_matches_is_accepted() {
        let found: BTreeMap<String, String> = MEMBERS
            .iter()
            .map(|m| (m.to_string(), sha(m.as_bytes())))
            .collect();
        let mut text = String::from("# comment\n[glibc A]\n");
        for m in MEMBERS {
            text.push_str(&format!("{m} {}\n", sha(m.as_bytes())));
        }
        let pins = parse_pins(&text).unwrap();
        assert_eq!(matching(&pins, &found).unwrap(), "glibc A");

        // One member rebuilt differently: refused, naming it and what to do.
        let mut changed = found.clone();
        changed.insert("init-first.o".into(), sha(b"other"));
        let e = matching(&pins, &changed).unwrap_err();
        assert!(
            e.contains("init-first.o has sha256") && e.contains(&sha(b"other")),
            "{e}"
        );
        assert!(
            e.contains("glibc.pin") && e.contains("pinned: glibc A"),
            "{e}"
        );
        // A member missing from libc.a: refused.
        let mut missing = found.clone();
        missing.remove("dl-origin.o");
        assert!(matching(&pins, &missing)
            .unwrap_err()
            .contains("dl-origin.o is not in libc.a"));
        // No pins at all: refused.
        assert!(matching(&[], &found).is_err());
    }

    #[test]
    fn malformed_pin_files_are_refused() {
        assert!(parse_pins("libc-start.o 00\n").is_err());
        assert!(parse_pins(&format!("libc-start.o {}\n", "a".repeat(64))).is_err());
        assert!(parse_pins("[x]\nlibc-start.o\n").is_err());
    }

    /// The pin file in this crate parses and covers every member.
    #[test]
    fn the_pin_file_names_every_member() {
        let pins = parse_pins(include_str!("../glibc.pin")).unwrap();
        assert!(!pins.is_empty());
        for p in &pins {
            for m in MEMBERS {
                assert!(p.members.contains_key(m), "{}: no {m}", p.label);
            }
        }
    }
}
