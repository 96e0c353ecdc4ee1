//! What reaches the operator's terminal from elsewhere (issue 37, item 8): a unit's status
//! text and journal come from the unit's machine, and the unit's own output is in them, so an
//! escape sequence there could rewrite the operator's screen, set the window title or worse.
//! On a terminal, every ASCII control character but newline and tab is shown in caret
//! notation (`ESC` as `^[`, `DEL` as `^?`), as `cat -v` does; piped output is left exact.

use std::borrow::Cow;

/// `bytes` with each control character but `\n` and `\t` in caret notation.
pub fn neutralize(bytes: &[u8]) -> Cow<'_, [u8]> {
    let is_control = |b: u8| (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f;
    if !bytes.iter().any(|&b| is_control(b)) {
        return Cow::Borrowed(bytes);
    }
    let mut out = Vec::with_capacity(bytes.len() + 8);
    for &b in bytes {
        if is_control(b) {
            out.push(b'^');
            out.push(if b == 0x7f { b'?' } else { b + 0x40 });
        } else {
            out.push(b);
        }
    }
    Cow::Owned(out)
}

/// Whether this process's standard output is a terminal.
pub fn stdout_is_terminal() -> bool {
    std::io::IsTerminal::is_terminal(&std::io::stdout())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_sequences_are_shown_not_obeyed_and_text_is_left_alone() {
        assert_eq!(
            neutralize(b"\x1b]0;owned\x07red\x1b[31m\r\x7f").as_ref(),
            b"^[]0;owned^Gred^[[31m^M^?"
        );
        let plain = "line one\n\ttabbed \u{25cf} unicode\n".as_bytes();
        assert!(matches!(neutralize(plain), Cow::Borrowed(_)));
    }
}
