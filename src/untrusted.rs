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
    // Unicode's default-ignorable code points (DerivedCoreProperties.txt:
    // drawn as nothing; among them every variation selector, and the tag
    // characters, which spell ASCII no one sees) and its other format
    // characters (category Cf: prepended marks and interlinear annotation),
    // which change how a line reads or hide text.
    matches!(c,
        '\u{2028}' | '\u{2029}'
        | '\u{00ad}'
        | '\u{034f}'
        | '\u{0600}'..='\u{0605}'
        | '\u{061c}'
        | '\u{06dd}'
        | '\u{070f}'
        | '\u{0890}'..='\u{0891}'
        | '\u{08e2}'
        | '\u{115f}'..='\u{1160}'
        | '\u{17b4}'..='\u{17b5}'
        | '\u{180b}'..='\u{180f}'
        | '\u{200b}'..='\u{200f}'
        | '\u{202a}'..='\u{202e}'
        | '\u{2060}'..='\u{206f}'
        | '\u{3164}'
        | '\u{fe00}'..='\u{fe0f}'
        | '\u{feff}'
        | '\u{ffa0}'
        | '\u{fff0}'..='\u{fffb}'
        | '\u{110bd}'
        | '\u{110cd}'
        | '\u{13430}'..='\u{1345f}'
        | '\u{1bca0}'..='\u{1bca3}'
        | '\u{1d173}'..='\u{1d17a}'
        | '\u{e0000}'..='\u{e0fff}')
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
        // Every block of them, not only the first.
        assert_eq!(
            one_line("a\u{e0100}b\u{180b}c\u{1bca0}d\u{13430}e\u{034f}f", 100),
            "a b c d e f"
        );
        // Visible text of those scripts stays.
        assert_eq!(one_line("\u{1820}\u{13000}", 100), "\u{1820}\u{13000}");
    }
}
