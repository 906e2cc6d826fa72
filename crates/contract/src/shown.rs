//! File names made safe to print in messages, logs and JSON: a conf dir or a state dir is
//! written by others, and a name may carry terminal escape sequences or bytes that are not
//! UTF-8.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// A file name made safe to print: control characters (terminal escape sequences) and
/// bytes that are not UTF-8 are written as `\x..` escapes, a backslash as `\\`.
pub fn shown_os(name: &OsStr) -> String {
    let bytes = name.as_bytes();
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let mut b = [0u8; 4];
                    for byte in c.encode_utf8(&mut b).bytes() {
                        out.push_str(&format!("\\x{byte:02x}"));
                    }
                }
                c => out.push(c),
            }
        }
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    out
}

/// [`shown_os`] for a name already in a `String`.
pub fn shown(name: &str) -> String {
    shown_os(OsStr::new(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_and_invalid_bytes_are_escaped() {
        assert_eq!(shown("05-\x1b[31mRED.conflist"), "05-\\x1b[31mRED.conflist");
        assert_eq!(shown("a\\b"), "a\\\\b");
        assert_eq!(shown("plain-ü.conf"), "plain-ü.conf");
        let raw = OsStr::from_bytes(b"10-\xff.conflist");
        assert_eq!(shown_os(raw), "10-\\xff.conflist");
    }
}
