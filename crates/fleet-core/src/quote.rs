//! Go's `%q` quoting (`strconv.Quote`, `strconv.QuoteRune`), so error texts such as
//! `invalid character ' ' in unit name` or `peer "a.service" matches conflict "a*"` are
//! byte-for-byte fleet's.
//!
//! Rust's `{:?}` agrees with Go on printable text but not on control or invisible characters
//! (`'\u{1}'` against `'\x01'`), and those are exactly the ones an error message must show.

/// `s` as Go's `%q` prints a string: in double quotes, with `"` and `\` escaped.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        push_escaped(&mut out, c, '"');
    }
    out.push('"');
    out
}

/// `c` as Go's `%q` prints a rune: in single quotes, with `'` and `\` escaped.
pub fn quote_char(c: char) -> String {
    let mut out = String::with_capacity(8);
    out.push('\'');
    push_escaped(&mut out, c, '\'');
    out.push('\'');
    out
}

fn push_escaped(out: &mut String, c: char, quote: char) {
    if c == quote || c == '\\' {
        out.push('\\');
        out.push(c);
        return;
    }
    if is_print(c) {
        out.push(c);
        return;
    }
    let escaped = match c {
        '\u{7}' => "\\a".to_owned(),
        '\u{8}' => "\\b".to_owned(),
        '\u{c}' => "\\f".to_owned(),
        '\n' => "\\n".to_owned(),
        '\r' => "\\r".to_owned(),
        '\t' => "\\t".to_owned(),
        '\u{b}' => "\\v".to_owned(),
        c if (c as u32) < 0x20 || c == '\u{7f}' => format!("\\x{:02x}", c as u32),
        c if (c as u32) < 0x10000 => format!("\\u{:04x}", c as u32),
        c => format!("\\U{:08x}", c as u32),
    };
    out.push_str(&escaped);
}

/// Go's `unicode.IsPrint`: graphic characters and the ASCII space. Rust's standard library has
/// no general categories, so this rules out what matters in names and file text (controls,
/// spaces other than ' ', the common format characters, private use, non-characters) and
/// treats the rest as printable.
fn is_print(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    let u = c as u32;
    let format = matches!(
        u,
        0xad | 0x600..=0x605
            | 0x61c
            | 0x6dd
            | 0x70f
            | 0x180e
            | 0x200b..=0x200f
            | 0x202a..=0x202e
            | 0x2060..=0x2064
            | 0x2066..=0x206f
            | 0xfeff
            | 0xfff9..=0xfffb
            | 0xe0001
            | 0xe0020..=0xe007f
    );
    let private_use = matches!(u, 0xe000..=0xf8ff | 0xf0000..=0x10ffff);
    let non_character = (0xfdd0..=0xfdef).contains(&u) || u & 0xfffe == 0xfffe;
    !(format || private_use || non_character)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_printable_text_as_is() {
        assert_eq!(quote("a.service"), r#""a.service""#);
        assert_eq!(quote("héllo wörld"), r#""héllo wörld""#);
        assert_eq!(quote_char(' '), "' '");
        assert_eq!(quote_char('é'), "'é'");
    }

    #[test]
    fn escapes_the_quote_and_backslash_only_in_their_own_kind() {
        assert_eq!(quote(r#"a"b'c\d"#), r#""a\"b'c\\d""#);
        assert_eq!(quote_char('\''), r"'\''");
        assert_eq!(quote_char('"'), "'\"'");
        assert_eq!(quote_char('\\'), r"'\\'");
    }

    #[test]
    fn escapes_control_and_invisible_characters_like_go() {
        let table = [
            ('\n', r"'\n'"),
            ('\t', r"'\t'"),
            ('\r', r"'\r'"),
            ('\u{7}', r"'\a'"),
            ('\u{8}', r"'\b'"),
            ('\u{b}', r"'\v'"),
            ('\u{c}', r"'\f'"),
            ('\0', r"'\x00'"),
            ('\u{1}', r"'\x01'"),
            ('\u{1b}', r"'\x1b'"),
            ('\u{7f}', r"'\x7f'"),
            ('\u{85}', r"'\u0085'"),
            ('\u{a0}', r"'\u00a0'"),
            ('\u{200b}', r"'\u200b'"),
            ('\u{feff}', r"'\ufeff'"),
            ('\u{e000}', r"'\ue000'"),
            ('\u{10ffff}', r"'\U0010ffff'"),
        ];
        for (c, want) in table {
            assert_eq!(quote_char(c), want, "{c:?}");
        }
        assert_eq!(quote("a\u{0}b\nc"), r#""a\x00b\nc""#);
    }
}
