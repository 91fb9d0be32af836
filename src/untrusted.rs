//! Text that came from a pod (or from a parser quoting it) on its way into an
//! error message: kubelet shows the message as the container's event, and the
//! hook's runtime prints it as one line, so no control character (a `\r` or `\n`
//! decoded from a JSON escape) may reach them, and its length is bounded.

/// `text` with every control character replaced by a space, cut after `max` characters.
pub fn one_line(text: &str, max: usize) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(max)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_become_spaces_and_length_is_bounded() {
        assert_eq!(one_line("a\rb\nc\0d\u{1b}[2J", 100), "a b c d [2J");
        assert_eq!(one_line("ééé", 2), "éé");
    }
}
