//! Brace ranges in unit arguments: `fleetctl start 'foo@{1..100000}.service'` starts 100,000
//! instances. A shell expands an unquoted range itself, but 100,000 names (about 2.6 MB of
//! argument strings and pointers) exceed Linux's 2 MiB `execve` limit (`ARG_MAX` with an
//! 8 MiB stack), so quoting the range and letting fleetctl expand it is how such a start
//! fits in one command. Only bash's numeric form is taken, `{N..M}` (descending too, zero
//! padded when an end is written with a leading zero, as bash pads); several ranges in one
//! argument multiply out. `{` and `}` are not valid in a unit name, so an argument that a
//! range would change could never have named a unit.
//!
//! Pure: text in, text out.

use anyhow::{Result, bail};

/// At most this many names from one command's ranges: a typo such as `{1..10000000000}` is
/// refused instead of exhausting memory.
pub const MAX_EXPANDED: usize = 10_000_000;

/// Every argument with its ranges expanded, in order.
pub fn expand(args: &[String]) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(args.len());
    for arg in args {
        expand_one(arg, &mut out)?;
        if out.len() > MAX_EXPANDED {
            bail!("the ranges of the arguments make more than {MAX_EXPANDED} units");
        }
    }
    Ok(out)
}

/// A range found in an argument: the text around it and its numbers.
struct Range<'a> {
    before: &'a str,
    after: &'a str,
    from: i64,
    to: i64,
    width: usize,
}

fn expand_one(arg: &str, out: &mut Vec<String>) -> Result<()> {
    let Some(range) = find(arg) else {
        out.push(arg.to_owned());
        return Ok(());
    };
    let count = range.from.abs_diff(range.to).saturating_add(1);
    if count > MAX_EXPANDED as u64 {
        bail!("{arg}: the range makes {count} units, at most {MAX_EXPANDED} are taken");
    }
    let step = if range.to >= range.from { 1 } else { -1 };
    let mut n = range.from;
    loop {
        let width = range.width;
        let expanded = format!("{}{n:0width$}{}", range.before, range.after);
        expand_one(&expanded, out)?;
        if out.len() > MAX_EXPANDED {
            bail!("the ranges of the arguments make more than {MAX_EXPANDED} units");
        }
        if n == range.to {
            return Ok(());
        }
        n += step;
    }
}

/// The first `{N..M}` in `arg`, if any.
fn find(arg: &str) -> Option<Range<'_>> {
    let mut from = 0;
    while let Some(open) = arg[from..].find('{').map(|i| i + from) {
        let close = arg[open..].find('}').map(|i| i + open)?;
        if let Some(range) = parse(&arg[open + 1..close]) {
            let (a, b, width) = range;
            return Some(Range {
                before: &arg[..open],
                after: &arg[close + 1..],
                from: a,
                to: b,
                width,
            });
        }
        from = open + 1;
    }
    None
}

/// `N..M` as its two ends and the zero-padded width (0: not padded).
fn parse(inner: &str) -> Option<(i64, i64, usize)> {
    let (a, b) = inner.split_once("..")?;
    let number = |s: &str| {
        let digits = s.strip_prefix('-').unwrap_or(s);
        (!digits.is_empty() && digits.bytes().all(|c| c.is_ascii_digit()))
            .then(|| s.parse::<i64>().ok())
            .flatten()
    };
    let (from, to) = (number(a)?, number(b)?);
    let padded =
        |s: &str| s.trim_start_matches('-').len() > 1 && s.trim_start_matches('-').starts_with('0');
    let width = if padded(a) || padded(b) {
        a.len().max(b.len())
    } else {
        0
    };
    Some((from, to, width))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(args: &[&str]) -> Vec<String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        expand(&args).unwrap()
    }

    #[test]
    fn a_range_becomes_one_argument_per_number() {
        assert_eq!(
            ex(&["foo@{1..3}.service", "bar.service"]),
            [
                "foo@1.service",
                "foo@2.service",
                "foo@3.service",
                "bar.service"
            ]
        );
    }

    #[test]
    fn ranges_count_down_pad_like_bash_and_multiply_out() {
        assert_eq!(ex(&["u{3..1}"]), ["u3", "u2", "u1"]);
        assert_eq!(ex(&["u{08..10}"]), ["u08", "u09", "u10"]);
        assert_eq!(ex(&["a{1..2}b{1..2}"]), ["a1b1", "a1b2", "a2b1", "a2b2"]);
    }

    #[test]
    fn arguments_without_a_numeric_range_are_left_alone() {
        for arg in [
            "foo.service",
            "d/x{a,b}.service",
            "{}",
            "x{1..}",
            "{..2}",
            "x{1..2",
        ] {
            assert_eq!(ex(&[arg]), [arg], "{arg}");
        }
    }

    #[test]
    fn a_hundred_thousand_instances_come_from_one_argument() {
        let all = ex(&["foo@{1..100000}.service"]);
        assert_eq!(all.len(), 100_000);
        assert_eq!(all[99_999], "foo@100000.service");
    }

    #[test]
    fn a_range_too_big_is_refused() {
        let args = vec!["u{1..100000000000}".to_string()];
        let err = expand(&args).unwrap_err().to_string();
        assert!(err.contains("at most"), "{err}");
    }
}
