//! Go's `path.Match`, the glob fleet uses for `Conflicts=` and `Replaces=`: `*` matches any
//! run of characters but `/`, `?` any one character but `/`, `[...]` a class with ranges and
//! `^` negation, `\` escapes the next character. A malformed pattern matches nothing, as fleet
//! ignores `path.ErrBadPattern` and keeps `false`.
//!
//! Matching is by character where Go's star loop steps by byte; the two differ only for
//! non-ASCII names, which unit names never are.

/// The pattern is malformed (`[` unclosed, empty class, range missing an end, `\` at the end).
#[derive(Debug)]
struct BadPattern;

/// Whether `name` matches the glob `pattern` under Go's `path.Match` rules.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    matches(pattern, name).unwrap_or(false)
}

/// Whether `pattern` is well formed, so that Go's `path.Match` would not fail with
/// `ErrBadPattern` (`[` unclosed, an empty class, a range without an end, `\` at the end).
pub fn glob_is_valid(mut pattern: &str) -> bool {
    while !pattern.is_empty() {
        let (_, chunk, rest) = scan_chunk(pattern);
        if match_chunk(chunk, "").is_err() {
            return false;
        }
        pattern = rest;
    }
    true
}

fn matches(mut pattern: &str, mut name: &str) -> Result<bool, BadPattern> {
    'pattern: while !pattern.is_empty() {
        let (star, chunk, rest) = scan_chunk(pattern);
        pattern = rest;
        if star && chunk.is_empty() {
            // A trailing star takes the rest of the name, unless that crosses a `/`.
            return Ok(!name.contains('/'));
        }
        let at_here = match_chunk(chunk, name);
        if let Ok(Some(left)) = at_here {
            // The last chunk must use up the name, or a later star position may still match.
            if left.is_empty() || !pattern.is_empty() {
                name = left;
                continue;
            }
        }
        at_here?;
        if star {
            for (i, c) in name.char_indices() {
                if c == '/' {
                    break;
                }
                let later = match_chunk(chunk, &name[i + c.len_utf8()..])?;
                if let Some(left) = later {
                    if pattern.is_empty() && !left.is_empty() {
                        continue;
                    }
                    name = left;
                    continue 'pattern;
                }
            }
        }
        // No match; the rest of the pattern must still be well formed.
        while !pattern.is_empty() {
            let (_, chunk, rest) = scan_chunk(pattern);
            match_chunk(chunk, "")?;
            pattern = rest;
        }
        return Ok(false);
    }
    Ok(name.is_empty())
}

/// Splits off leading stars and the chunk up to the next star outside a class.
fn scan_chunk(pattern: &str) -> (bool, &str, &str) {
    let trimmed = pattern.trim_start_matches('*');
    let star = trimmed.len() != pattern.len();
    let bytes = trimmed.as_bytes();
    let mut in_class = false;
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'\\' if i + 1 < bytes.len() => i += 1,
            b'[' => in_class = true,
            b']' => in_class = false,
            b'*' if !in_class => break,
            _ => {}
        }
        i += 1;
    }
    (star, &trimmed[..i], &trimmed[i..])
}

/// Matches one star-free chunk at the start of `s`: `Some(rest of s)` on a match. The whole
/// chunk is read even after a mismatch, so a malformed chunk is always reported.
fn match_chunk<'s>(mut chunk: &str, mut s: &'s str) -> Result<Option<&'s str>, BadPattern> {
    let mut failed = false;
    while let Some(c) = chunk.chars().next() {
        failed |= s.is_empty();
        chunk = &chunk[c.len_utf8()..];
        match c {
            '[' => {
                let r = take_char(&mut s, failed);
                let (in_class, rest) = match_class(chunk, r)?;
                failed |= !in_class;
                chunk = rest;
            }
            '?' => {
                if !failed {
                    failed = s.starts_with('/');
                    take_char(&mut s, false);
                }
            }
            _ => {
                let literal = if c == '\\' {
                    let escaped = chunk.chars().next().ok_or(BadPattern)?;
                    chunk = &chunk[escaped.len_utf8()..];
                    escaped
                } else {
                    c
                };
                if !failed {
                    failed = !s.starts_with(literal);
                    take_char(&mut s, false);
                }
            }
        }
    }
    Ok((!failed).then_some(s))
}

/// Removes and returns the first character of `s` unless the match has already failed.
fn take_char(s: &mut &str, failed: bool) -> Option<char> {
    if failed {
        return None;
    }
    let c = s.chars().next()?;
    *s = &s[c.len_utf8()..];
    Some(c)
}

/// Reads a class body after its `[`; returns whether `r` is in it and the chunk after `]`.
fn match_class(mut chunk: &str, r: Option<char>) -> Result<(bool, &str), BadPattern> {
    let negated = chunk.starts_with('^');
    if negated {
        chunk = &chunk[1..];
    }
    let mut in_range = false;
    let mut ranges = 0;
    loop {
        // A `]` right after `[` or `[^` is a bad pattern, not the end of the class.
        if ranges > 0 && chunk.starts_with(']') {
            return Ok((in_range != negated, &chunk[1..]));
        }
        let (lo, rest) = class_char(chunk)?;
        let (hi, rest) = match rest.strip_prefix('-') {
            Some(after_dash) => class_char(after_dash)?,
            None => (lo, rest),
        };
        chunk = rest;
        in_range |= r.is_some_and(|r| lo <= r && r <= hi);
        ranges += 1;
    }
}

/// One (possibly escaped) character of a class; the class must go on after it.
fn class_char(chunk: &str) -> Result<(char, &str), BadPattern> {
    let chunk = match chunk.chars().next() {
        None | Some('-' | ']') => return Err(BadPattern),
        Some('\\') => &chunk[1..],
        Some(_) => chunk,
    };
    let c = chunk.chars().next().ok_or(BadPattern)?;
    let rest = &chunk[c.len_utf8()..];
    if rest.is_empty() {
        return Err(BadPattern);
    }
    Ok((c, rest))
}

#[cfg(test)]
mod tests;
