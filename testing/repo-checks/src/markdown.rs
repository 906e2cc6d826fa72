//! Just enough Markdown to check references: headings and their GitHub anchors, relative
//! links, fenced code blocks (skipped), tables and Mermaid blocks.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Component, Path, PathBuf};

/// Each line of `text` with fenced code blocks (``` or ~~~) blanked out, so that nothing
/// inside them reads as a heading or a link. Line numbers stay as they were.
pub fn without_fences(text: &str) -> Vec<&str> {
    let mut fence: Option<&str> = None;
    text.lines()
        .map(|line| {
            let t = line.trim_start();
            match fence {
                Some(f) => {
                    if t.starts_with(f) {
                        fence = None;
                    }
                    ""
                }
                None if t.starts_with("```") || t.starts_with("~~~") => {
                    fence = Some(&t[..3]);
                    ""
                }
                None => line,
            }
        })
        .collect()
}

/// The text of every ATX heading (`## Title`) outside code blocks, in order.
pub fn headings(text: &str) -> Vec<String> {
    without_fences(text)
        .into_iter()
        .filter_map(|line| {
            let hashes = line.len() - line.trim_start_matches('#').len();
            let rest = &line[hashes..];
            ((1..=6).contains(&hashes) && rest.starts_with(' '))
                .then(|| rest.trim().trim_end_matches('#').trim().to_string())
        })
        .collect()
}

/// The anchor GitHub gives a heading: the rendered text (code spans and links reduced to
/// their text, emphasis markers dropped), lower-cased, every character but letters,
/// digits, spaces, `-` and `_` removed, spaces turned into `-`.
pub fn anchor(heading: &str) -> String {
    let rendered = link_texts(heading);
    rendered
        .chars()
        .filter(|c| !matches!(c, '`' | '*'))
        .flat_map(char::to_lowercase)
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// `[text](target)` → `text`, everything else as it is.
fn link_texts(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|i| open + i) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|i| close + i) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Every anchor the headings of `text` define, with GitHub's `-1`, `-2`… for repeats.
pub fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for h in headings(text) {
        let base = anchor(&h);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// A link found in a document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// 1-based line number.
    pub line: usize,
    /// The target as written (`docs/x.md#part`, `#part`, `https://…`).
    pub target: String,
}

/// `line` with every code span blanked (its backticks too), so that a `[x](y)` written as
/// code is not taken for a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].len() - rest[start..].trim_start_matches('`').len();
        let delim = &rest[start..start + ticks];
        out.push_str(&rest[..start]);
        match rest[start + ticks..].find(delim) {
            Some(len) => {
                out.extend(std::iter::repeat_n(' ', ticks * 2 + len));
                rest = &rest[start + ticks * 2 + len..];
            }
            None => {
                out.push_str(&rest[start..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    out
}

/// Every inline link and image (`[text](target)`, `![alt](target)`) outside code.
pub fn links(text: &str) -> Vec<Link> {
    let mut out = Vec::new();
    for (i, line) in without_fences(text).into_iter().enumerate() {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].trim();
            let target = target.split_whitespace().next().unwrap_or_default();
            out.push(Link {
                line: i + 1,
                target: target.trim_matches(|c| c == '<' || c == '>').to_string(),
            });
            rest = &after[end.min(after.len())..];
        }
    }
    out
}

/// Whether a link leaves the repository (a web address or a mail address).
pub fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|p| target.starts_with(p))
}

/// `base/../x` → `x`, without touching the file system; `None` when the path climbs
/// above its start or is absolute.
fn normalize(path: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                if !out.pop() {
                    return None;
                }
            }
            Component::CurDir => {}
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::Prefix(_) => return None,
        }
    }
    Some(out)
}

/// What is wrong with the relative links of `doc` (a path under `root`): a file or
/// directory that does not exist, an anchor the target's headings do not define, a
/// target outside the repository. Empty when every link resolves.
pub fn broken_links(root: &Path, doc: &Path, text: &str) -> Vec<String> {
    let dir = doc.parent().unwrap_or(Path::new(""));
    let mut problems = Vec::new();
    for link in links(text) {
        if link.target.is_empty() || is_external(&link.target) {
            if link.target.is_empty() {
                problems.push(format!(
                    "{}:{}: empty link target",
                    doc.display(),
                    link.line
                ));
            }
            continue;
        }
        let (path, fragment) = match link.target.split_once('#') {
            Some((p, f)) => (p, Some(f)),
            None => (link.target.as_str(), None),
        };
        let shown = format!("{}:{}: {}", doc.display(), link.line, link.target);
        let target = if path.is_empty() {
            doc.to_path_buf()
        } else {
            match normalize(&dir.join(path)) {
                Some(t) if !t.as_os_str().is_empty() => t,
                _ => {
                    problems.push(format!("{shown}: points outside the repository"));
                    continue;
                }
            }
        };
        let full = root.join(&target);
        if !path.is_empty() && !full.exists() {
            problems.push(format!("{shown}: {} does not exist", target.display()));
            continue;
        }
        if let Some(fragment) = fragment {
            let is_md = target.extension().is_some_and(|e| e == "md");
            let defined = is_md
                && if path.is_empty() {
                    anchors(text).contains(fragment)
                } else {
                    std::fs::read_to_string(&full)
                        .map(|t| anchors(&t).contains(fragment))
                        .unwrap_or(false)
                };
            if !defined {
                problems.push(format!(
                    "{shown}: {} has no heading with the anchor #{fragment}",
                    target.display()
                ));
            }
        }
    }
    problems
}

/// The part of `text` under the heading `## title` (up to the next heading of level 2 or
/// less), or `None` when there is no such heading.
pub fn section<'a>(text: &'a str, title: &str) -> Option<&'a str> {
    let marker = format!("\n## {title}\n");
    let start = text.find(&marker)? + marker.len();
    let rest = &text[start..];
    let end = rest
        .match_indices("\n#")
        .find(|(i, _)| {
            let h = &rest[i + 1..];
            h.starts_with("# ") || h.starts_with("## ")
        })
        .map_or(rest.len(), |(i, _)| i);
    Some(&rest[..end])
}

/// The contents of every ```` ```mermaid ```` block in `text`.
pub fn mermaid_blocks(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<Vec<&str>> = None;
    for line in text.lines() {
        match &mut current {
            None if line.trim() == "```mermaid" => current = Some(Vec::new()),
            None => {}
            Some(lines) if line.trim() == "```" => {
                out.push(lines.join("\n"));
                current = None;
            }
            Some(lines) => lines.push(line),
        }
    }
    out
}

/// The body rows of the first table in `text`, each as its trimmed cells.
pub fn first_table(text: &str) -> Vec<Vec<String>> {
    let rows: Vec<&str> = without_fences(text)
        .into_iter()
        .skip_while(|l| !l.trim_start().starts_with('|'))
        .take_while(|l| l.trim_start().starts_with('|'))
        .collect();
    rows.iter()
        .skip(2)
        .map(|r| {
            r.trim()
                .trim_matches('|')
                .split(" | ")
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchors_follow_github() {
        assert_eq!(anchor("`interlock check` (node)"), "interlock-check-node");
        assert_eq!(anchor("Settings (`--set`)"), "settings---set");
        assert_eq!(anchor("The agent's privileges"), "the-agents-privileges");
        assert_eq!(
            anchor("The agent socket protocol (version 1)"),
            "the-agent-socket-protocol-version-1"
        );
        assert_eq!(anchor("See [the docs](docs/x.md) now"), "see-the-docs-now");
        assert_eq!(anchor("snake_case **bold**"), "snake_case-bold");
        let doc = "# A\n## Same\n```\n## not a heading\n```\n## Same\n";
        let got: Vec<_> = anchors(doc).into_iter().collect();
        assert_eq!(got, ["a", "same", "same-1"]);
    }

    #[test]
    fn links_skip_code_and_keep_line_numbers() {
        let doc = "see [a](a.md) and `[b](b.md)`\n```\n[c](c.md)\n```\n![i](img.png#x) [w](https://x.y/z)";
        let got: Vec<_> = links(doc).into_iter().map(|l| (l.line, l.target)).collect();
        assert_eq!(
            got,
            [
                (1, "a.md".to_string()),
                (5, "img.png#x".to_string()),
                (5, "https://x.y/z".to_string())
            ]
        );
    }

    #[test]
    fn broken_links_are_named_and_good_ones_pass() {
        let root = std::env::temp_dir().join(format!("repo-checks-links-{}", std::process::id()));
        std::fs::create_dir_all(root.join("docs")).unwrap();
        std::fs::write(root.join("docs/a.md"), "# A\n## Part one\n").unwrap();
        std::fs::write(root.join("LICENSE"), "x").unwrap();
        let doc = Path::new("docs/b.md");
        let text = "[ok](a.md#part-one) [ok](../LICENSE) [self](#top)\n# Top\n\
                    [gone](c.md) [bad](a.md#part-two) [out](../../etc/passwd) [web](https://example.com/x)";
        let problems = broken_links(&root, doc, text);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(
            problems[0].contains("docs/c.md does not exist"),
            "{}",
            problems[0]
        );
        assert!(
            problems[1].contains("no heading with the anchor #part-two"),
            "{}",
            problems[1]
        );
        assert!(
            problems[2].contains("outside the repository"),
            "{}",
            problems[2]
        );
    }

    #[test]
    fn sections_tables_and_mermaid_blocks() {
        let doc = "# T\n## One\ntext\n| a | b |\n|---|---|\n| `x` | y |\n| z | w |\n\
                   ```mermaid\nflowchart TD\n  a --> b\n```\n### Sub\nmore\n## Two\nrest\n";
        let one = section(doc, "One").unwrap();
        assert!(one.contains("### Sub") && !one.contains("rest"));
        assert_eq!(
            first_table(one),
            [
                vec!["`x`".to_string(), "y".into()],
                vec!["z".into(), "w".into()]
            ]
        );
        assert_eq!(mermaid_blocks(one), ["flowchart TD\n  a --> b"]);
        assert!(section(doc, "Three").is_none());
    }
}
