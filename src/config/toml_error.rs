//! Config parse errors on one line, without the value.

/// A TOML error of `text` on one line: where (line and column, and the key
/// the line begins with, if it begins with one) and why, without the value
/// (a containerd config may hold registry credentials). toml's own display
/// takes five lines and quotes the line whole.
pub fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let why = without_value(&e.message().lines().collect::<Vec<_>>().join("; "));
    let Some(at) = e.span().map(|s| s.start.min(text.len())) else {
        return why;
    };
    let before = &text.as_bytes()[..at];
    let line = before.iter().filter(|&&b| b == b'\n').count() + 1;
    let start = before
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
    let written = text[start..].lines().next().unwrap_or_default();
    match leading_key(written) {
        Some(key) => format!("line {line}, column {column}, at {key}: {why}"),
        None => format!("line {line}, column {column}: {why}"),
    }
}

/// The key a TOML line begins with (`key =`, dotted, bare or quoted), bounded;
/// `None` for any other line (a value continued from the line before, a
/// table header).
fn leading_key(line: &str) -> Option<&str> {
    let (key, _) = line.split_once('=')?;
    let key = key.trim();
    let bare = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ' ');
    let quoted = key.len() >= 2
        && key.starts_with('"')
        && key.ends_with('"')
        && !key[1..key.len() - 1].contains(['"', '\\']);
    let ok = !key.is_empty() && key.len() <= 64 && (key.chars().all(bare) || quoted);
    ok.then_some(key)
}

/// serde's "invalid type: string \"secret\", expected u64" without the value:
/// "invalid type: string, expected u64". The kind ends where the value's
/// quotes begin ("floating point `1.5`"); what is expected is the last
/// ", expected" (a value may hold the words). An unknown variant keeps its
/// text: the enums are devgate's own, and the text names the entry at fault.
pub(super) fn without_value(why: &str) -> String {
    for lead in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = why.strip_prefix(lead) {
            let kind = rest
                .split(['`', '"', ','])
                .next()
                .unwrap_or_default()
                .trim();
            let expected = rest.rfind(", expected").map_or("", |i| &rest[i..]);
            return format!("{lead}{kind}{expected}");
        }
    }
    why.to_string()
}
