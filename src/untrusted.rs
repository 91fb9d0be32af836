//! Text that came from a pod (or from a parser quoting it) on its way into an
//! error message: kubelet shows the message as the container's event, and the
//! hook's runtime prints it as one line, so no control character (a `\r` or `\n`
//! decoded from a JSON escape) may reach them, and its length is bounded.

/// `text` with every control character replaced by a space, cut after `max`
/// characters. So are the line and paragraph separators (U+2028, U+2029),
/// which some readers break lines at, and the bidirectional and zero-width
/// formatting characters, which make a message read other than it is.
pub fn one_line(text: &str, max: usize) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() || is_format(c) {
                ' '
            } else {
                c
            }
        })
        .take(max)
        .collect()
}

fn is_format(c: char) -> bool {
    // Unicode's format characters (category Cf) that change how a line reads
    // or hide text (the Arabic letter mark is a bidirectional mark too; tag
    // characters spell ASCII no one sees), and the variation selectors.
    matches!(c,
        '\u{2028}' | '\u{2029}'
        | '\u{00ad}'
        | '\u{061c}'
        | '\u{180e}'
        | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}'
        | '\u{fe00}'..='\u{fe0f}'
        | '\u{feff}'
        | '\u{fff9}'..='\u{fffb}'
        | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0000}'..='\u{e007f}')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_spaces_and_length_is_bounded() {
        assert_eq!(one_line("a\rb\nc\0d\u{1b}[2J", 100), "a b c d [2J");
        assert_eq!(one_line("ééé", 2), "éé");
        assert_eq!(
            one_line("a\u{2028}b\u{202e}c\u{200b}d\u{2066}e", 100),
            "a b c d e"
        );
        assert_eq!(one_line("a\u{061c}b\u{00ad}c\u{206f}d", 100), "a b c d");
        // Tag characters spell hidden ASCII; variation selectors hide too.
        assert_eq!(one_line("a\u{e0041}b\u{fe0f}c", 100), "a b c");
    }
}
