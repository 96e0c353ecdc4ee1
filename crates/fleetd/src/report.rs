//! How fleetd prints an error: each cause once. Some sources (zbus's, std's I/O errors with a
//! message) already include their own source's text in their message, so anyhow's `{:#}`
//! would print it twice ("…: No such file or directory (os error 2): No such file or
//! directory (os error 2)").

/// `e` and its causes joined by `: `, leaving out a cause whose text is already printed.
pub fn chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if text.is_empty() || out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::chain;
    use anyhow::Context;

    /// A source that repeats its own source's text, as zbus's transport error does.
    #[derive(Debug)]
    struct Transport(std::io::Error);

    impl std::fmt::Display for Transport {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "failed to connect to the bus: {}", self.0)
        }
    }

    impl std::error::Error for Transport {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn prints_each_cause_once() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let text = io.to_string();
        let e = anyhow::Error::new(Transport(io)).context("connecting to systemd");
        assert_eq!(
            chain(&e),
            format!("connecting to systemd: failed to connect to the bus: {text}")
        );
        let e: anyhow::Result<()> = Err(anyhow::anyhow!("inner")).context("outer");
        assert_eq!(chain(&e.unwrap_err()), "outer: inner");
    }
}
