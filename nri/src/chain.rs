//! An error with its causes on one line, as the runtime shows it to kubelet.

use std::fmt;

/// Displays an error with its `source()` chain, `a: b: c`.
///
/// A cause whose text the line already ends with is not written again: many
/// messages end with their cause (`"read {path}: {source}"`, with `source`
/// also returned by `source()`, as `thiserror` does for a field of that
/// name), and the chain would otherwise read `read /x: denied: denied`.
/// The walk goes on past such a cause, so a deeper one that no message
/// carries still shows.
pub struct ErrorChain<'a>(pub &'a (dyn std::error::Error + 'a));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = self.0.to_string();
        let mut source = self.0.source();
        while let Some(e) = source {
            let text = e.to_string();
            if !line.ends_with(&text) {
                line.push_str(": ");
                line.push_str(&text);
            }
            source = e.source();
        }
        f.write_str(&line)
    }
}

impl ErrorChain<'_> {
    /// Several errors, each with its causes, on one line: `a: b; c`.
    pub fn join<E: std::error::Error>(errors: &[E]) -> String {
        errors
            .iter()
            .map(|e| ErrorChain(e).to_string())
            .collect::<Vec<_>>()
            .join("; ")
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorChain;

    #[derive(Debug, thiserror::Error)]
    enum Inner {
        #[error("read {path}: {source}")]
        Read {
            path: String,
            source: std::io::Error,
        },
        #[error("bad entry")]
        Bad {
            #[source]
            cause: std::io::Error,
        },
    }

    #[derive(Debug, thiserror::Error)]
    enum Outer {
        #[error("refused: {0}")]
        Carries(#[source] Inner),
        #[error("refused")]
        Wraps(#[source] Inner),
    }

    fn denied() -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::PermissionDenied, "denied")
    }

    fn read() -> Inner {
        Inner::Read {
            path: "/x".into(),
            source: denied(),
        }
    }

    #[test]
    fn each_cause_shows_once() {
        let cases: [(&dyn std::error::Error, &str); 5] = [
            (&denied(), "denied"),
            (&read(), "read /x: denied"),
            (&Outer::Carries(read()), "refused: read /x: denied"),
            (&Outer::Wraps(read()), "refused: read /x: denied"),
            (
                &Outer::Carries(Inner::Bad { cause: denied() }),
                "refused: bad entry: denied",
            ),
        ];
        for (err, want) in cases {
            assert_eq!(ErrorChain(err).to_string(), want);
        }
    }

    #[test]
    fn joined_errors_each_keep_their_causes() {
        assert_eq!(ErrorChain::join::<Inner>(&[]), "");
        assert_eq!(
            ErrorChain::join(&[read(), Inner::Bad { cause: denied() }]),
            "read /x: denied; bad entry: denied"
        );
    }
}
